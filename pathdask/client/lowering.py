"""Lowering: a :class:`Program` becomes one :class:`HostPlan` per host.

A program is first a per-gang graph (``graph.py``: one layer per gang, one task
per shard). The fusion pass (:func:`fuse`) turns each host's part of all its
layers into one plan, cached per program. A call in parallel dispatch names
those plans in one message (``calls.py``), with no Dask task at all.

Sequential dispatch, the paper's baseline (``pathdask.dispatch: sequential``),
submits a graph instead (:func:`build_sequential_graph`): per host a task that
registers its plan, then one task per gang and device. It is a
``HighLevelGraph`` because its layers carry per-layer annotations (the worker
pin) within one submission; a plain dict graph carries only global ones.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections import defaultdict
from typing import Any

from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from ..ops import GangSpec, HostPlan, KernelOp, Op, ReshardOp, dispatch_key, gang_key, output_key
from ..worker.tasks import dispatch_task, output_task, run_gang_task
from .graph import GangShard, ProgramGraph, layered_graph
from .tracing import Program


def lower(program: Program, overlap: bool = True) -> dict[str, HostPlan]:
    """Per host address, the plan of that host's devices for ``program`` (cached).

    It is the fusion of the program's per-gang graph (:func:`~.graph.layered_graph`);
    ``overlap`` defers receives (:func:`defer_receives`), which parallel dispatch does.
    """
    return _fused(layered_graph(program), overlap)


@functools.lru_cache(maxsize=512)
def _fused(graph: ProgramGraph, overlap: bool) -> dict[str, HostPlan]:
    return fuse(graph, overlap)


def defer_receives(ops: list[Op]) -> list[Op]:
    """One device's ops with each move's receive put off until just before its first reader.

    A move (``ReshardOp``) sends without waiting, but receiving waits for the pieces.
    Where the move stands in program order, the device may still have work that does
    not need what it receives: a gradient exchanged with another island while the
    next layer's backward runs. So the receive moves to just before the first op
    that reads its output (or the end), and the transfer overlaps that work. A device
    that both sends and receives keeps its sends in place. Delaying a wait never adds
    one, so the order stays free of deadlock: sends never block, and each receive
    still comes after the ops its senders needed, in every device's order.
    """
    out: list[Op] = []
    pending: dict[int, Op] = {}  # value id -> its receive, not placed yet
    for op in ops:
        for ref in (op.inputs if isinstance(op, KernelOp) else
                    (op.input,) if isinstance(op, ReshardOp) and op.input is not None else ()):
            if ref.kind == "v" and ref.index in pending:
                out.append(pending.pop(ref.index))
        if isinstance(op, ReshardOp) and op.recvs and op.output is not None:
            if op.sends:
                out.append(dataclasses.replace(op, recvs=(), output=None))
            pending[op.output.vid] = dataclasses.replace(op, input=None, sends=())
            continue
        out.append(op)
    out.extend(pending.values())
    return out


def fuse(graph: ProgramGraph, overlap: bool = True) -> dict[str, HostPlan]:
    """The fusion pass: each host's part of every layer (gang) of ``graph``, as one plan.

    Like dask.array's blockwise fusion, it turns many small tasks into few: a host's
    plan lists, per local device, the ops of its tasks in layer (program) order, and
    is what a call names on that host. Dependencies between the tasks need no Dask
    edges after fusion: a device runs its ops in order, and data moves between devices
    runtime to runtime. Every host's plan of one program has the same id (each host
    caches its own under it), so that a call names its plan once, whatever its hosts.
    """
    program = graph.program
    plan_id = uuid.uuid4().hex
    ops: dict[str, dict[int, list[Op]]] = defaultdict(lambda: defaultdict(list))
    gangs: dict[str, dict[int, GangSpec]] = defaultdict(dict)
    for layer in graph.layers.values():
        for task in layer.values():
            shard: GangShard = task.func
            dev = shard.device
            ops[dev.address][dev.id].append(shard.op)
            gangs[dev.address][shard.gang.index] = shard.gang
    owned: dict[str, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for j, vid in enumerate(program.outputs):
        if vid < program.n_inputs:
            continue  # an argument returned as is: the client hands back the same array
        for dev in program.values[vid].mesh.devices:
            owned[dev.address][j].append((vid, dev.id))
    return {
        addr: HostPlan(
            program.name,
            gangs[addr],
            {d: tuple(defer_receives(o) if overlap else o) for d, o in dev_ops.items()},
            {j: tuple(p) for j, p in owned[addr].items()},
            plan_id,
            alone=len(ops) == 1,
        )
        for addr, dev_ops in ops.items()
    }


Graph = tuple[HighLevelGraph, list[Any], dict[int, dict[str, Any]]]


def _pinned(tasks: dict[Any, Task], addr: str, program: dict[str, Any] | None = None) -> MaterializedLayer:
    """A layer pinned to one worker; ``program`` (on one layer) is what the scheduler slots."""
    annotations: dict[str, Any] = {"workers": [addr], "allow_other_workers": False}
    if program is not None:
        annotations["pathdask"] = program
    return MaterializedLayer(tasks, annotations=annotations)


def _output_keys(pid: str, plans: dict[str, HostPlan], shared: bool = False) -> dict[int, dict[str, Any]]:
    """Per program output, per host holding some of its shards, the key that owns them there;
    ``shared``: one key per output, held by the first host holding some of its shards, that
    owns them on every host (a call's: the scheduler's work does not grow with the hosts)."""
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    for h, (addr, plan) in enumerate(plans.items()):
        for j in plan.owned:
            if not (shared and out[j]):
                out[j][addr] = output_key(pid, j, h)
    return out


#: what proportional share charges a gang with no modelled cost, per device
MIN_GANG_COST = 1e-4


def _annotation(pid: str, plans: dict[str, HostPlan], out_keys: dict[int, dict[str, Any]],
                inputs: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """What the scheduler plugin needs to slot the program (read in its ``update_graph`` hook)."""
    cost = sum(max(plan.gangs[op.gang].cost_s, MIN_GANG_COST)
               for plan in plans.values() for ops in plan.ops.values() for op in ops)
    return {
        "pid": pid,
        "hosts": {addr: list(plan.ops) for addr, plan in plans.items()},
        "outputs": [(key, addr, j) for j, hosts in out_keys.items() for addr, key in hosts.items()],
        "cost": cost,
        "deps": sorted({producer for producer, _ in inputs}),
    }


def build_sequential_graph(pid: str, program: Program, plans: dict[str, HostPlan],
                           inputs: tuple[tuple[str, int], ...], client: str,
                           input_keys: tuple[list[Any], ...] = ()) -> Graph:
    """Sequential dispatch, for comparison: one Dask task per shard per gang.

    Each host first registers its plan with every gang held back; then the task of
    gang g on device d releases that one gang and returns only once it ran. It
    depends on the tasks of the gangs that produce g's inputs, or on the Dask keys
    of the program's arguments (ready once their producer ran). So each gang pays
    a full trip through the Dask scheduler, as in the paper's sequential dispatch.
    """
    out_keys = _output_keys(pid, plans)
    hosts = {addr: h for h, addr in enumerate(plans)}
    layers: dict[str, MaterializedLayer] = {}
    deps: dict[str, set[str]] = {}
    keys: list[Any] = []
    register = {}
    for addr, plan in plans.items():
        h = hosts[addr]
        register[addr] = dispatch_key(pid, h)
        name = f"pathdask-{pid}-register-{h}"
        task = Task(register[addr], dispatch_task, pid, plan, inputs, client, True)
        layers[name] = _pinned({register[addr]: task}, addr,
                               _annotation(pid, plans, out_keys, inputs) if h == 0 else None)
        deps[name] = set()
        keys.append(register[addr])
    producer = {v: g.index for g in program.gangs for v in g.outputs}
    gang_keys: dict[int, list[Any]] = {}
    for g in program.gangs:
        before = {producer[v] for v in g.inputs if v in producer}
        upstream = [k for p in sorted(before) for k in gang_keys[p]]
        # gangs that read the program's arguments wait for those to be computed
        upstream += [k for v in g.inputs if v < min(program.n_inputs, len(input_keys)) for k in input_keys[v]]
        gang_keys[g.index] = []
        by_host: dict[str, dict[Any, Task]] = defaultdict(dict)
        for addr, plan in plans.items():
            for dev, ops in plan.ops.items():
                if any(op.gang == g.index for op in ops):
                    key = gang_key(pid, g.index, dev)
                    by_host[addr][key] = Task(key, run_gang_task, TaskRef(register[addr]), pid, g.index, dev,
                                              *[TaskRef(k) for k in upstream])
                    gang_keys[g.index].append(key)
        for addr, tasks in by_host.items():
            name = f"pathdask-{pid}-gang{g.index}-{hosts[addr]}"
            layers[name] = _pinned(tasks, addr)
            deps[name] = {f"pathdask-{pid}-register-{hosts[addr]}"} | {
                f"pathdask-{pid}-gang{p}-{hosts[a]}" for p in before for a in plans
                if f"pathdask-{pid}-gang{p}-{hosts[a]}" in layers
            }
            keys.extend(tasks)
    for addr, plan in plans.items():
        h = hosts[addr]
        for j in plan.owned:
            last = producer[program.outputs[j]]
            okey = out_keys[j][addr]
            name = f"pathdask-{pid}-out{j}-{h}"
            mine = [k for k in gang_keys[last] if k[3] in plan.ops]
            layers[name] = _pinned({okey: Task(okey, output_task, TaskRef(register[addr]), j,
                                               *[TaskRef(k) for k in mine])}, addr)
            deps[name] = {f"pathdask-{pid}-register-{h}", f"pathdask-{pid}-gang{last}-{h}"}
            keys.append(okey)
    return HighLevelGraph(layers, deps), keys, out_keys
