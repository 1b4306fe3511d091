"""Parallel dispatch: a program call costs O(hosts) Dask keys and no graph, however many gangs it has."""

from __future__ import annotations

import dask
import numpy as np
from distributed import SchedulerPlugin

import pathdask as pw
from pathdask import P


class TaskCounter(SchedulerPlugin):
    """Counts the new tasks of each graph the scheduler receives (keys it computes: a call's
    output keys, which a graph may depend on, are made in memory and run nothing)."""

    def __init__(self) -> None:
        self.graphs: list[int] = []
        self.seen: set = set()

    def update_graph(self, scheduler, *, keys, tasks, **kwargs):
        new = {k for k in set(tasks) - self.seen  # a graph also touches the existing keys it depends on
               if k in scheduler.tasks and scheduler.tasks[k].run_spec is not None}
        self.seen |= new
        self.graphs.append(len(new))


@pw.function(in_specs=P("x"), out_specs=P("x"))
def step(b):
    return pw.psum(b, "x") * 0.5 + b


def test_task_count_does_not_grow_with_gangs(system, client):
    client.dask.register_plugin(TaskCounter(), name="task-counter")
    try:
        m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"x": 4}, island=1)
        a0, a1 = client.put(np.ones(4), m0, P("x")), client.put(np.ones(4), m1, P("x"))
        a0.result(), a1.result()  # their graphs reached the scheduler before we count

        def chain(n):
            @pw.program
            def prog(x, y):
                for _ in range(n // 2):
                    x, y = step(x), step(y)
                return x, y
            return prog

        counts = {}
        for n in (2, 32, 128):
            prog = chain(n)
            assert len(prog.trace(a0, a1).gangs) == n
            before = len(client.dask.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["task-counter"].graphs))
            x, y = prog(a0, a1)
            ref = np.ones(4)
            for _ in range(n // 2):
                ref = ref.sum() * 0.5 + ref
            np.testing.assert_allclose(x.result(), ref)
            np.testing.assert_allclose(y.result(), ref)
            graphs = client.dask.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["task-counter"].graphs)
            assert graphs[before:] == [], f"a call of {n} gangs submitted graphs of {graphs[before:]} tasks"
            keys = client.dask.run_on_scheduler(
                lambda dask_scheduler, pid=x._pid: [k for k in dask_scheduler.tasks
                                                    if isinstance(k, tuple) and pid in k])
            assert all(dask.utils.key_split(k) == "pathdask-out" for k in keys), keys
            counts[n] = len(keys)
        hosts = system.topology.num_hosts
        assert 0 < counts[2] == counts[32] == counts[128] <= 2 * hosts, counts
    finally:
        client.dask.unregister_scheduler_plugin("task-counter")


def test_sequential_dispatch_has_a_task_per_shard_per_gang(system, client):
    client.dask.register_plugin(TaskCounter(), name="task-counter")
    try:
        mesh = client.mesh({"x": 4}, island=0)
        a = client.put(np.ones(4), mesh, P("x"))
        a.result()

        @pw.program
        def prog(x):
            for _ in range(6):
                x = step(x)
            return x

        ref = np.ones(4)
        for _ in range(6):
            ref = ref.sum() * 0.5 + ref
        graphs = lambda: client.dask.run_on_scheduler(  # noqa: E731
            lambda dask_scheduler: list(dask_scheduler.plugins["task-counter"].graphs))
        # parallel: no graph (a call); sequential: per host a dispatch and an output task, and a
        # task per gang and device
        for mode, expected in (("parallel", []), ("sequential", [2 + 6 * 4 + 2])):
            before = len(graphs())
            with dask.config.set({"pathdask.dispatch": mode}):
                y = prog(a)
            np.testing.assert_allclose(y.result(), ref)
            assert graphs()[before:] == expected, mode
    finally:
        client.dask.unregister_scheduler_plugin("task-counter")
