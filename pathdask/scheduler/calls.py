"""The scheduler's side of a program call (``client/calls.py``): its Dask tasks, built here.

The tasks are those :func:`~pathdask.client.lowering.build_graph` would
submit (a dispatch task per host, an output task per output and host, pinned
to their host), less one output task per host whose key the dispatch task's
key doubles as; and they enter the scheduler through the same method that
Dask's ``update_graph`` ends in, ``Scheduler._create_taskstate_from_graph``:
so the calling client desires the keys (the plugin slots the programs first, in
call order, as its ``update_graph`` hook does for graphs), and every later transition, failure and release of the keys
is Dask's own. What a call skips is what a small, already-lowered graph does
not need: pickling it on the client, and materialising and ordering it in the
scheduler's offload thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask._task_spec import GraphNode, Task, TaskRef

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["supported", "create_calls", "call_keys", "as_key"]


def supported(scheduler: Scheduler) -> bool:
    """Whether this Dask scheduler can create a call's tasks (else clients submit graphs)."""
    return callable(getattr(scheduler, "_create_taskstate_from_graph", None))


def as_key(key: Any) -> Any:
    """Keys arrive as lists through msgpack; Dask's keys are tuples."""
    return tuple(key) if isinstance(key, list) else key


def create_calls(scheduler: Scheduler, client: str, calls: list[dict[str, Any]],
                 slot: Callable[[dict[str, Any]], None]) -> None:
    """Slot ``calls`` in their order (``slot`` takes a program's ``pathdask`` annotation), then
    create all their tasks for ``client`` in one step, as ``update_graph`` would.

    Each call holds ``pid``, ``inputs``, ``program`` (its annotation) and ``hosts``: per host,
    ``(address, plan id, dispatch key, index of the output whose key the dispatch key
    also is (or None), [(output key, output index)])``.
    """
    from ..worker.tasks import dispatch_task, output_task

    dsk: dict[Any, GraphNode] = {}
    workers: dict[Any, list[str]] = {}
    for call in calls:
        pid = call["pid"]
        args = tuple((str(p), int(v)) for p, v in call["inputs"])
        for addr, plan_id, dkey, handle, outs in call["hosts"]:
            dkey = as_key(dkey)
            dsk[dkey] = Task(dkey, dispatch_task, pid, plan_id, args, client, False, handle)
            workers[dkey] = [addr]
            for okey, j in outs:
                okey = as_key(okey)
                dsk[okey] = Task(okey, output_task, pid, j, TaskRef(dkey))
                workers[okey] = [addr]
    for call in calls:  # in call order: a call never takes a slot before the calls it reads
        program = call["program"]
        slot({**program, "outputs": [(as_key(k), a, j) for k, a, j in program["outputs"]]})
    scheduler._create_taskstate_from_graph(
        start=time.time(), dsk=dsk, keys=set(dsk), ordered={k: i for i, k in enumerate(dsk)},
        client=client,
        annotations_by_type={"workers": workers, "allow_other_workers": dict.fromkeys(dsk, False)},
        global_annotations=None, stimulus_id=f"pathdask-calls-{calls[0]['pid']}-{time.time()}",
        submitting_task=None, span_metadata={"collections": []}, code=(),
    )


def call_keys(call: dict[str, Any]) -> list[Any]:
    """Every key a call creates."""
    return [as_key(k) for _addr, _plan, dkey, _handle, outs in call["hosts"] for k in [dkey, *(o for o, _ in outs)]]
