"""A program call as one small message on the client's stream to the scheduler.

A call of a program whose plans its hosts already hold needs no graph and no
Dask task: the scheduler plugin creates the call's output keys itself, in
memory on the hosts that own their buffers, and forwards the call to those
hosts on its streams to them (``PathwaysScheduler.call``). So the message carries
only what changes from call to call:

- the program id, and per host the id of the plan it runs there;
- the argument keys (the buffers its inputs read);
- the new output keys, one per program output, each on the first host holding
  some of its shards and owning them on every host;
- what the island scheduler needs to slot it (its devices, cost and producers).

Calls made close together (before the client's event loop sends the first)
travel as one message. The message goes on the Dask client's own batched
stream, so it stays in order with the client's graphs (sequential dispatch
flushes waiting calls first) and comes before the releases of its argument keys;
the scheduler forwards each call to its hosts before it forwards any release, and
a host registers a call (counting the reads of its arguments) as the message
comes. So an argument's buffers outlive every call that reads them, with no
acknowledgement on the way.
"""

from __future__ import annotations

from typing import Any

from ..ops import HostPlan
from .lowering import _annotation, _output_keys

__all__ = ["build_call"]


def build_call(pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...]
               ) -> tuple[dict[str, Any], list[Any], dict[int, dict[str, Any]]]:
    """The call (one entry of a ``protocol.Calls`` record's ``calls``), every key it creates,
    and the output keys per output and host.

    Every plan must be cached on its host already, all under the program's one id. The
    call names its hosts once, its plan once, and the hosts that own output keys by their
    position (``owned``: ``(i, [(key, output)])``), so that the scheduler hands it down a
    fan-out tree without looking into it, and it carries nothing per host that is the same
    on every host.
    """
    out_keys = _output_keys(pid, plans, shared=True)
    ids = {plan.id for plan in plans.values()}
    assert len(ids) <= 1 and "" not in ids, f"a call names one plan id, which its hosts hold; got {ids}"
    owned = []
    for i, (addr, plan) in enumerate(plans.items()):
        mine = [(out_keys[j][addr], j) for j in plan.owned if addr in out_keys[j]]
        if mine:
            owned.append((i, mine))
    outputs = [(key, j, addr) for j, hosts in out_keys.items() for addr, key in hosts.items()]
    # the slotting information without the outputs and producers: the scheduler reads those
    # from ``outputs`` and ``inputs``, so that the message carries each key once
    call = {"pid": pid, "hosts": list(plans), "plan": ids.pop() if ids else "", "owned": owned, "outputs": outputs,
            "inputs": [list(i) for i in inputs], "program": _annotation(pid, plans, {}, ())}
    return call, [k for k, _j, _a in outputs], out_keys
