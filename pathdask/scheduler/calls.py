"""The scheduler's side of a program call (``client/calls.py``): its output keys, made here.

A call creates no Dask task. Its output keys are created in memory on the
hosts that own their buffers, desired by the calling client, as
``Scheduler.update_data`` does for scattered data; each host puts the keys'
handles in its own data as the call reaches it (``HostRuntime.on_dispatch``).
From then on every transition, release and loss of the keys is Dask's own: the
client's futures are ready at once, a released key is forgotten (and the plugin
frees its buffers), a key on a lost host is lost. What a call skips is what a
Dask task costs and a registration does not need: running a task on the host,
and the scheduler's transitions and messages for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Scheduler

from ..ops import as_key

__all__ = ["CALL_SLICE", "supported", "create_outputs", "call_keys"]

#: seconds of taking in calls of one message after which the calls taken in go to their hosts
CALL_SLICE = 1e-3

#: the modelled size of an output key's value (a handle; the data stays on the devices)
HANDLE_NBYTES = 64


def supported(scheduler: Scheduler) -> bool:
    """Whether this Dask scheduler can create keys in memory (else clients submit graphs)."""
    return all(callable(getattr(scheduler, name, None)) for name in ("new_task", "add_replica",
                                                                      "client_desires_keys"))


def create_outputs(scheduler: Scheduler, client: str, call: dict[str, Any]) -> None:
    """Create ``call``'s output keys in memory on their hosts, desired by ``client``.

    Every host of the call must be a live worker (checked by the caller).
    """
    keys = []
    for addr, _plan, outs in call["hosts"]:
        ws = scheduler.workers[addr]
        for key, _j in outs:
            key = as_key(key)
            if key in scheduler.tasks:
                raise ValueError(f"output key {key!r} of program {call['pid']} exists already")
            ts = scheduler.new_task(key, None, "memory")
            ts.set_nbytes(HANDLE_NBYTES)
            scheduler.add_replica(ts, ws)
            keys.append(key)
    scheduler.client_desires_keys(keys=keys, client=client)  # reports them in memory to the client


def call_keys(call: dict[str, Any]) -> list[Any]:
    """Every key a call creates."""
    return [as_key(k) for _addr, _plan, outs in call["hosts"] for k, _ in outs]
