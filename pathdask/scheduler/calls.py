"""The scheduler's side of a program call (``client/calls.py``): its Dask tasks, built here.

The tasks are those :func:`~pathdask.client.lowering.build_graph` would
submit (a dispatch task per host, an output task per output and host, pinned
to their host), less one output task per host whose key the dispatch task's
key doubles as; and they enter the scheduler through the same method that
Dask's ``update_graph`` ends in, ``Scheduler._create_taskstate_from_graph``:
so the plugin's ``update_graph`` hook slots the program, the calling client
desires the keys, and every later transition, failure and release of the keys
is Dask's own. What a call skips is what a small, already-lowered graph does
not need: pickling it on the client, and materialising and ordering it in the
scheduler's offload thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dask._task_spec import GraphNode, Task, TaskRef

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["supported", "create_call"]


def supported(scheduler: Scheduler) -> bool:
    """Whether this Dask scheduler can create a call's tasks (else clients submit graphs)."""
    return callable(getattr(scheduler, "_create_taskstate_from_graph", None))


def _key(key: Any) -> Any:
    """Keys arrive as lists through msgpack; Dask's keys are tuples."""
    return tuple(key) if isinstance(key, list) else key


def create_call(scheduler: Scheduler, client: str, pid: str, hosts: list[Any], inputs: list[Any],
                program: dict[str, Any]) -> list[Any]:
    """Create the call's tasks for ``client``, as ``update_graph`` would; returns their keys.

    ``hosts`` holds, per host, ``(address, plan id, dispatch key, index of the output whose
    key the dispatch key also is (or None), [(output key, output index)])``.
    """
    from ..worker.tasks import dispatch_task, output_task

    args = tuple((str(p), int(v)) for p, v in inputs)
    dsk: dict[Any, GraphNode] = {}
    workers: dict[Any, list[str]] = {}
    for addr, plan_id, dkey, handle, outs in hosts:
        dkey = _key(dkey)
        dsk[dkey] = Task(dkey, dispatch_task, pid, plan_id, args, client, False, handle)
        workers[dkey] = [addr]
        for okey, j in outs:
            okey = _key(okey)
            dsk[okey] = Task(okey, output_task, pid, j, TaskRef(dkey))
            workers[okey] = [addr]
    first = _key(hosts[0][2])
    program = {**program, "outputs": [(_key(k), a, j) for k, a, j in program["outputs"]]}
    scheduler._create_taskstate_from_graph(
        start=time.time(), dsk=dsk, keys=set(dsk), ordered={k: i for i, k in enumerate(dsk)},
        client=client,
        annotations_by_type={"workers": workers, "allow_other_workers": dict.fromkeys(dsk, False),
                             "pathdask": {first: program}},
        global_annotations=None, stimulus_id=f"pathdask-call-{pid}-{time.time()}",
        submitting_task=None, span_metadata={"collections": []}, code=(),
    )
    return list(dsk)
