"""A program call as one small message on the client's stream to the scheduler.

A call of a program whose plans its hosts already hold needs no graph: the
scheduler plugin builds the call's tasks itself (``scheduler/calls.py``). So
the message carries only what changes from call to call:

- the program id, and per host the id of the plan it runs there;
- the argument keys (the buffers its inputs read);
- the keys of the new tasks: per host one dispatch task, whose key also owns the
  buffers of the first program output held there, and one output task per
  further output held there;
- what the island scheduler needs to slot it (its devices, cost and producers).

Calls made close together (before the client's event loop sends the first)
travel as one message, and the scheduler creates all their tasks in one step.
The message goes on the Dask client's own batched stream, so it stays in order
with the client's graphs (sequential dispatch flushes waiting calls first) and
comes before the releases of the keys it creates; the scheduler handles it in
one event-loop tick: no graph is pickled, materialised or ordered.
"""

from __future__ import annotations

from typing import Any

from ..ops import HostPlan, dispatch_key
from .lowering import _annotation, _output_keys

__all__ = ["CALL_OP", "build_call"]

#: the stream op of a call (``PathwaysScheduler.call``)
CALL_OP = "pathdask-call"


def build_call(pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...]
               ) -> tuple[dict[str, Any], list[Any], dict[int, dict[str, Any]]]:
    """The call (one entry of a :data:`CALL_OP` message's ``calls``), every key it creates,
    and the output keys per output and host.

    Every plan must be cached on its host already (it has an id).
    """
    out_keys = _output_keys(pid, plans)
    hosts = []
    keys: list[Any] = []
    for h, (addr, plan) in enumerate(plans.items()):
        assert plan.id, "a call names plans its hosts hold"
        dkey = dispatch_key(pid, h)
        # The dispatch task's key is also the key of the first output held here: one task
        # fewer per host for Dask to send, run, report and release.
        owned = list(plan.owned)
        handle = owned.pop(0) if owned else None
        if handle is not None:
            out_keys[handle][addr] = dkey
        outs = [(out_keys[j][addr], j) for j in owned]
        hosts.append((addr, plan.id, dkey, handle, outs))
        keys += [dkey, *(k for k, _ in outs)]
    call = {"pid": pid, "hosts": hosts, "inputs": [list(i) for i in inputs],
            "program": _annotation(pid, plans, out_keys, inputs)}
    return call, keys, out_keys
