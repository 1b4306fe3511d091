"""A program as a Dask graph: one layer per gang, one task per shard.

This is the program's *unfused* graph, for people to look at
(``program.dask_graph(x, w)``, its HTML repr, ``dask.visualize``) and for
the fusion pass (``lowering.fuse``) to read. Each layer is one gang, named
``"<gang name>-<index>"``. Its annotations carry the gang's devices, hosts,
mesh, modelled cost and its order in the program. Each task is one device's
part of that gang (a :class:`GangShard` holding its op); it depends on the
tasks of earlier gangs whose shards it reads, on its own device or, for a
resharding gang, on the devices it receives pieces from.

Dask never runs this graph shard by shard: that would cost a trip through the
Dask scheduler per shard and per gang (ARCHITECTURE, decision 2). What is
called is its fusion, one plan per host.

A ``HighLevelGraph`` rather than a dict graph with an annotation per task:
a gang is a layer, so its annotations are stated once, and Dask's own HTML
repr shows the program gang by gang. The graph is built once per traced
program and cached with it; a call of a program only looks up its fusion.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import dask
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from ..errors import UnfusedGraphError
from ..ops import GangSpec, KernelOp, Op, OutSpec, Ref, ReshardOp
from ..sharding import reshard_plan
from ..topology import DeviceInfo
from .tracing import GangNode, Program

__all__ = ["GangShard", "ProgramGraph", "layered_graph"]


@dataclass(frozen=True)
class GangShard:
    """One device's part of one gang: the callable of a task in a :class:`ProgramGraph`."""

    gang: GangSpec
    device: DeviceInfo
    op: Op

    @property
    def __name__(self) -> str:  # what dask.utils.funcname (graph drawings) shows
        return f"{self.gang.name}-{self.gang.index}@{self.device.id}"

    def __call__(self, *upstream: Any) -> Any:
        raise UnfusedGraphError(
            f"Task {self.__name__} belongs to a program's per-gang graph, which is for "
            "inspection only; call the program itself, which submits one fused task per host"
        )


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise UnfusedGraphError(
        "A program's per-gang graph (program.dask_graph(...)) is for inspection only; "
        "call the program itself, which submits one fused task per host"
    )


class ProgramGraph(HighLevelGraph):
    """The per-gang ``HighLevelGraph`` of a traced :class:`Program`.

    It is also a Dask collection, so that ``dask.visualize`` draws it. Its
    keys are the shards of the program's outputs. Computing it raises
    :class:`~pathdask.errors.UnfusedGraphError`: call the program instead.
    """

    program: Program
    # one program's graph is itself: the fusion pass's cache is keyed by it
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __dask_graph__(self) -> ProgramGraph:
        return self

    def __dask_keys__(self) -> list[Any]:
        return output_keys(self.program)

    def __dask_layers__(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(layer_name(self.program.gangs[g]) for g in _producers(self.program)))

    def __dask_tokenize__(self) -> Any:
        return ("pathdask.ProgramGraph", id(self.program))

    @staticmethod
    def __dask_optimize__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return dsk

    __dask_scheduler__ = staticmethod(_refuse)

    def __dask_postcompute__(self) -> tuple[Any, tuple[Any, ...]]:
        return _refuse, ()


def layer_name(gang: GangNode) -> str:
    return f"{gang.name}-{gang.index}"


def _producers(program: Program) -> list[int]:
    """The gang producing each program output that is not an argument."""
    producer = {v: g.index for g in program.gangs for v in g.outputs}
    return [producer[v] for v in program.outputs if v in producer]


def output_keys(program: Program) -> list[Any]:
    """The keys of the shards of the program's outputs (arguments returned as is have none)."""
    producer = {v: g for g in program.gangs for v in g.outputs}
    return list(dict.fromkeys((layer_name(producer[v]), d.id) for v in program.outputs if v in producer
                              for d in program.values[v].mesh.devices))


def layered_graph(program: Program) -> ProgramGraph:
    """The per-gang graph of ``program`` (cached per program and replication setting)."""
    return _layered(program, bool(dask.config.get("pathdask.check-replication")))


def _replicated(g: GangNode, check: bool) -> tuple[tuple[str, ...], ...]:
    """Per output of kernel gang ``g``, the mesh axes its blocks must agree along (if checked)."""
    if not check:
        return ()
    assert g.function is not None
    axes = tuple(tuple(a for a, n in g.mesh.axes if n > 1 and a not in spec.mesh_axes)
                 for spec in g.function.out_specs)
    return axes if any(axes) else ()


@functools.lru_cache(maxsize=512)
def _layered(program: Program, check_replication: bool) -> ProgramGraph:
    names = [layer_name(g) for g in program.gangs]
    #: value id -> name of the layer that produces it (arguments have none)
    producer: dict[int, str] = {v: names[g.index] for g in program.gangs for v in g.outputs}

    def ref(vid: int) -> Ref:
        return Ref("in", vid) if vid < program.n_inputs else Ref("v", vid)

    layers: dict[str, MaterializedLayer] = {}
    deps: dict[str, set[str]] = {}
    for g in program.gangs:
        name = names[g.index]
        shards = _kernel_shards(g, ref, check_replication) if g.kind == "kernel" else _reshard_shards(program, g, ref)
        tasks: dict[Any, Task] = {}
        for shard, inputs in shards:
            # the tasks whose shards of each input, on the devices given, this task reads
            upstream = dict.fromkeys((producer[vid], d) for vid, devs in inputs if vid in producer for d in devs)
            key = (name, shard.device.id)
            tasks[key] = Task(key, shard, *map(TaskRef, upstream))
        members = shards[0][0].gang.members if shards else ()
        layers[name] = MaterializedLayer(tasks, annotations={
            "gang": g.name,
            "kind": g.kind,
            "order": g.index,
            "mesh": dict(g.mesh.axes),
            "devices": tuple(d.id for d in members),
            "hosts": tuple(dict.fromkeys(d.address for d in members)),
            "cost": g.cost_s,
        }, collection_annotations={"type": "pathdask.gang", "program": program.name})
        deps[name] = {producer[v] for v in g.inputs if v in producer}
    graph = ProgramGraph(layers, deps)
    graph.program = program
    return graph


Shards = list[tuple[GangShard, list[tuple[int, tuple[int, ...]]]]]


def _kernel_shards(g: GangNode, ref: Any, check_replication: bool) -> Shards:
    """Each device of a kernel gang reads its own shards of the gang's inputs."""
    assert g.function is not None
    spec = GangSpec(g.index, g.name, g.mesh.devices, g.mesh, g.function.body, g.cost_s,
                    _replicated(g, check_replication))
    outs = tuple(OutSpec(v, b.shape, b.dtype) for v, b in zip(g.outputs, g.block_avals))
    refs = tuple(ref(v) for v in g.inputs)
    return [(GangShard(spec, dev, KernelOp(g.index, p, refs, outs)), [(v, (dev.id,)) for v in g.inputs])
            for p, dev in enumerate(g.mesh.devices)]


def _reshard_shards(program: Program, g: GangNode, ref: Any) -> Shards:
    """A resharding gang: each member sends pieces of its source shard and receives pieces."""
    src_vid, dst_vid = g.inputs[0], g.outputs[0]
    src, dst = program.values[src_vid], program.values[dst_vid]
    dst_sharding = dst.sharding
    sends: dict[int, list[tuple[DeviceInfo, Any]]] = defaultdict(list)  # by device id
    recvs: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for pc in reshard_plan(src.sharding, dst_sharding):
        s, t = src.mesh.devices[pc.src], dst.mesh.devices[pc.dst]
        sends[s.id].append((t, pc.src_index))
        recvs[t.id].append((s.id, pc.dst_index))
    by_id: dict[int, DeviceInfo] = {d.id: d for d in (*src.mesh.devices, *dst.mesh.devices)}
    targets = {d.id for d in dst.mesh.devices}
    members = tuple(by_id[i] for i in sorted(set(sends) | targets))
    spec = GangSpec(g.index, g.name, members)
    out = OutSpec(dst_vid, dst_sharding.shard_shape, dst.dtype)
    shards: Shards = []
    for dev in members:
        op = ReshardOp(
            g.index,
            ref(src_vid) if dev.id in sends else None,
            tuple(sends.get(dev.id, ())),
            tuple(recvs.get(dev.id, ())),
            out if dev.id in targets else None,
            g.scale,
        )
        read = ({dev.id} if dev.id in sends else set()) | {s for s, _ in recvs.get(dev.id, ())}
        shards.append((GangShard(spec, dev, op), [(src_vid, tuple(sorted(read)))]))
    return shards
