"""Lowering: a :class:`Program` becomes one :class:`HostPlan` per host, then a Dask graph.

The graph has one layer per host, pinned to that host's worker, holding:

- one *dispatch* task that registers the host's part of every gang with the
  host runtime and returns at once (parallel asynchronous dispatch);
- one small *output* task per program output with shards on that host,
  whose key owns those shards' buffers for as long as the client holds it.

So a program costs O(hosts) Dask tasks however many gangs it has. We build a
``HighLevelGraph`` because its layers carry per-layer annotations (the
worker pin) within one submission; a plain dict graph carries only global ones.
"""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from typing import Any

import dask
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from ..ops import DISPATCH_PREFIX, OUT_PREFIX, GangSpec, HostPlan, KernelOp, Op, OutSpec, Ref, ReshardOp
from ..sharding import reshard_plan
from ..topology import DeviceInfo
from .program import Program


def lower(program: Program) -> dict[str, HostPlan]:
    """Per host address, the plan of that host's devices for ``program`` (cached)."""
    return _lower(program, bool(dask.config.get("pathdask.check-replication")))


def _replicated(g: Any, check: bool) -> tuple[tuple[str, ...], ...]:
    """Per output of kernel gang ``g``, the mesh axes its blocks must agree along (if checked)."""
    if not check:
        return ()
    axes = tuple(tuple(a for a, n in g.mesh.axes if n > 1 and a not in spec.mesh_axes)
                 for spec in g.function.out_specs)
    return axes if any(axes) else ()


@functools.lru_cache(maxsize=512)
def _lower(program: Program, check_replication: bool) -> dict[str, HostPlan]:
    ops: dict[str, dict[int, list[Op]]] = defaultdict(lambda: defaultdict(list))
    gangs: dict[str, dict[int, GangSpec]] = defaultdict(dict)

    def ref(vid: int) -> Ref:
        return Ref("in", vid) if vid < program.n_inputs else Ref("v", vid)

    def add(dev: DeviceInfo, op: Op, spec: GangSpec) -> None:
        ops[dev.address][dev.id].append(op)
        gangs[dev.address][spec.index] = spec

    for g in program.gangs:
        if g.kind == "kernel":
            assert g.function is not None
            spec = GangSpec(g.index, g.name, g.mesh.devices, g.mesh, g.function.body, g.cost_s,
                            _replicated(g, check_replication))
            for p, dev in enumerate(g.mesh.devices):
                outs = tuple(OutSpec(v, b.shape, b.dtype) for v, b in zip(g.outputs, g.block_avals))
                add(dev, KernelOp(g.index, p, tuple(ref(v) for v in g.inputs), outs), spec)
        else:
            _lower_reshard(program, g.index, g.inputs[0], g.outputs[0], ref, add)

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
            {d: tuple(o) for d, o in dev_ops.items()},
            {j: tuple(p) for j, p in owned[addr].items()},
            uuid.uuid4().hex,
        )
        for addr, dev_ops in ops.items()
    }


def _lower_reshard(program: Program, index: int, src_vid: int, dst_vid: int, ref: Any, add: Any) -> None:
    src, dst = program.values[src_vid], program.values[dst_vid]
    dst_sharding = dst.sharding
    pieces = reshard_plan(src.sharding, dst_sharding)
    sends: dict[int, list[tuple[DeviceInfo, Any]]] = defaultdict(list)
    recvs: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for pc in pieces:
        s, t = src.mesh.devices[pc.src], dst.mesh.devices[pc.dst]
        sends[s.id].append((t, pc.src_index))
        recvs[t.id].append((s.id, pc.dst_index))
    by_id: dict[int, DeviceInfo] = {d.id: d for d in (*src.mesh.devices, *dst.mesh.devices)}
    targets = {d.id for d in dst.mesh.devices}
    members = tuple(by_id[i] for i in sorted(set(sends) | targets))
    spec = GangSpec(index, "reshard", members)
    out = OutSpec(dst_vid, dst_sharding.shard_shape, dst.dtype)
    for dev in members:
        add(dev, ReshardOp(
            index,
            ref(src_vid) if dev.id in sends else None,
            tuple(sends.get(dev.id, ())),
            tuple(recvs.get(dev.id, ())),
            out if dev.id in targets else None,
        ), spec)


Graph = tuple[HighLevelGraph, list[Any], dict[int, dict[str, Any]]]


def _pinned(tasks: dict[Any, Task], addr: str, program: dict[str, Any] | None = None) -> MaterializedLayer:
    """A layer pinned to one worker; ``program`` (on one layer) is what the scheduler slots."""
    annotations: dict[str, Any] = {"workers": [addr], "allow_other_workers": False}
    if program is not None:
        annotations["pathdask"] = program
    return MaterializedLayer(tasks, annotations=annotations)


def _output_keys(pid: str, plans: dict[str, HostPlan]) -> dict[int, dict[str, Any]]:
    """Per program output, per host holding some of its shards, the key that owns them there."""
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    for h, (addr, plan) in enumerate(plans.items()):
        for j in plan.owned:
            out[j][addr] = (f"{OUT_PREFIX}{pid}", j, h)
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
        "outputs": [(key, addr) for hosts in out_keys.values() for addr, key in hosts.items()],
        "cost": cost,
        "deps": sorted({producer for producer, _ in inputs}),
    }


def build_graph(pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...],
                client: str, payloads: dict[str, HostPlan | str] | None = None) -> Graph:
    """Parallel dispatch: per host one dispatch task and one output task per output held there.

    Returns the graph, every key to submit, and the output keys per output and host.
    ``payloads`` replaces a plan by its id for hosts that have it cached already.
    """
    from ..worker.tasks import dispatch_task, output_task

    payloads = payloads or {}
    out_keys = _output_keys(pid, plans)
    program = _annotation(pid, plans, out_keys, inputs)
    layers: dict[str, MaterializedLayer] = {}
    keys: list[Any] = []
    for h, (addr, plan) in enumerate(plans.items()):
        dkey = (f"{DISPATCH_PREFIX}{pid}", h)
        tasks: dict[Any, Task] = {dkey: Task(dkey, dispatch_task, pid, payloads.get(addr, plan), inputs, client)}
        for j in plan.owned:
            okey = out_keys[j][addr]
            tasks[okey] = Task(okey, output_task, TaskRef(dkey), j)
        keys.extend(tasks)
        layers[f"pathdask-{pid}-{h}"] = _pinned(tasks, addr, program if h == 0 else None)
    return HighLevelGraph(layers, {name: set() for name in layers}), keys, out_keys


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
    from ..worker.tasks import dispatch_task, output_task, run_gang_task

    out_keys = _output_keys(pid, plans)
    hosts = {addr: h for h, addr in enumerate(plans)}
    layers: dict[str, MaterializedLayer] = {}
    deps: dict[str, set[str]] = {}
    keys: list[Any] = []
    register = {}
    for addr, plan in plans.items():
        h = hosts[addr]
        register[addr] = (f"{DISPATCH_PREFIX}{pid}", h)
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
                    key = (f"pathdask-gang-{pid}", g.index, dev)
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
            mine = [k for k in gang_keys[last] if k[2] in plan.ops]
            layers[name] = _pinned({okey: Task(okey, output_task, TaskRef(register[addr]), j,
                                               *[TaskRef(k) for k in mine])}, addr)
            deps[name] = {f"pathdask-{pid}-register-{h}", f"pathdask-{pid}-gang{last}-{h}"}
            keys.append(okey)
    return HighLevelGraph(layers, deps), keys, out_keys
