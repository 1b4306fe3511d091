"""A lowered program as the simulation runs it: its devices' ops, grouped into vectorised steps.

The input is the real lowering (:func:`pathdask.client.lowering.lower`: one
``HostPlan`` per host, each device's ops in the order its thread runs them,
receives deferred as parallel dispatch defers them). Every op gets a key such
that sorting by key keeps every device's own order and puts each send before
the receives that wait for it: ``(gang, 1)`` for a kernel or a send, and
``(gang of the next op that is not a receive, 0, own gang)`` for a deferred
receive (``defer_receives`` puts it just before that op). The ops of one key and
kind form one :class:`Step`, run for all its devices at once with NumPy.

A kernel's collectives are found by running its body once, at mesh position 0,
on zero blocks, with a gang context that records each exchange: which mesh axes
its pieces span and how many bytes a member sends. The real runtime exchanges
inside the body and the kernel then holds its device until ``cost_s`` from its
start; so does the simulation (:mod:`.devices`). The same runs time the body's
compute (NumPy on one device's blocks, at the computed width): the real device
thread spends it too, in Python's one thread at a time.
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..client.lowering import _annotation, lower
from ..client.tracing import Program
from ..collectives import bind
from ..mesh import Mesh
from ..ops import GangSpec, KernelOp, Op, ReshardOp
from ..topology import DeviceInfo, Topology
from .abstract import host_of

__all__ = ["Exchange", "Schedule", "Step", "compile_schedule"]

LINK_RANK = {"local": 0, "same_host": 1, "ici": 2, "dcn": 3}


@dataclass(frozen=True)
class Exchange:
    """One collective inside a kernel: members sync over mesh ``axes`` (numbers), then
    ``seconds`` pass while a member's ``nbytes`` cross the widest link of its group."""

    axes: tuple[int, ...]
    seconds: float
    nbytes: int
    remote_hosts: int = 0  # hosts of the group other than a member's own


@dataclass
class Step:
    """The ops of one key and kind, on ``devs`` (a kernel's in mesh order)."""

    kind: str  # "kernel" | "send" | "recv"
    gang: int
    name: str
    devs: np.ndarray
    cost: float = 0.0
    shape: tuple[int, ...] = ()
    exchanges: tuple[Exchange, ...] = ()
    #: sends: (source, destination, real bytes) per piece
    pieces: tuple[tuple[DeviceInfo, DeviceInfo, int], ...] = ()
    scale: float = 1.0
    hosts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # global host of each dev
    #: a kernel's compute per device: its body's NumPy on the blocks, as the real device thread runs it
    compute: float = 0.0


@dataclass
class Schedule:
    """A program's steps in run order, and what the control plane needs to know of it."""

    name: str
    steps: list[Step]
    devices: np.ndarray  # every device with ops, sorted
    hosts: np.ndarray  # global host index of every host with ops, sorted
    ops_per_host: np.ndarray  # per entry of ``hosts``: the ops its dispatch registers
    host_devices: dict[str, list[int]]  # address -> device ids (what the scheduler is told)
    cost: float  # what proportional share charges it (the real annotation's)
    n_ops: int

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)


def _is_recv(op: Op) -> bool:
    return isinstance(op, ReshardOp) and bool(op.recvs)


def _keys(ops: Sequence[Op]) -> list[tuple[float, int, int]]:
    keys: list[tuple[float, int, int]] = [(0, 0, 0)] * len(ops)
    nxt = math.inf
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if _is_recv(op):
            keys[i] = (nxt, 0, op.gang)
        else:
            keys[i] = (op.gang, 1, 0)
            nxt = op.gang
    return keys


class _Recorder:
    """A gang context at mesh position 0 that records each exchange instead of making it."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh, self.position = mesh, 0
        self.calls: list[tuple[tuple[int, ...], int]] = []

    def exchange(self, sends: dict[int, np.ndarray], sources: Sequence[int], like: np.ndarray,
                 seq: int | None = None) -> dict[int, np.ndarray]:
        nbytes = sum(np.asarray(v).nbytes for p, v in sends.items() if p != 0)
        self.calls.append((tuple(sources) + tuple(sends), nbytes))
        return {p: np.zeros_like(np.asarray(sends.get(p, like))) for p in sources}


def _axes_of(mesh: Mesh, positions: Sequence[int]) -> tuple[int, ...]:
    """The mesh axes (numbers) along which ``positions`` differ from position 0."""
    axes = set()
    for p in positions:
        for i, c in enumerate(mesh.coords(p).values()):
            if c:
                axes.add(i)
    return tuple(sorted(axes))


def _exchange(topology: Topology, mesh: Mesh, axes: tuple[int, ...], nbytes: int) -> Exchange | None:
    if not axes:
        return None
    names = tuple(mesh.axis_names[a] for a in axes)
    group = [mesh.devices[p] for p in mesh.group(0, names)]
    cls = max((topology.link_class(group[0], d) for d in group), key=LINK_RANK.__getitem__)
    link = topology.link(cls)
    seconds = 0.0 if link is None else link.latency + nbytes / link.bandwidth
    return Exchange(axes, seconds, nbytes, len({d.address for d in group}) - 1)


#: runs of a kernel body whose fastest is its compute time (the first also warms NumPy's paths)
BODY_RUNS = 3


@functools.lru_cache(maxsize=1024)
def _collectives(topology: Topology, body: Any, mesh: Mesh, blocks: tuple[tuple[tuple[int, ...], str], ...],
                 replicated: tuple[tuple[str, ...], ...]) -> tuple[tuple[Exchange, ...], float]:
    """The exchanges a kernel body makes, and its compute seconds on one device's blocks
    (once per body, mesh and block signature)."""
    rec = _Recorder(mesh)
    zeros = [np.zeros(shape, dtype=dtype) for shape, dtype in blocks]
    with bind(rec), np.errstate(all="ignore"):
        outs = body(*zeros)
    found = [_exchange(topology, mesh, _axes_of(mesh, parts), nbytes) for parts, nbytes in rec.calls]
    names = sorted({a for axes in replicated for a in axes})
    if names:  # the real runtime checks replicated outputs with one more exchange of digests
        n_out = len(outs) if isinstance(outs, tuple) else 1
        axes = tuple(mesh.axis_names.index(a) for a in names)
        size = math.prod(mesh.shape[a] for a in names)
        found.append(_exchange(topology, mesh, axes, 8 * n_out * (size - 1)))
    return tuple(e for e in found if e is not None), body_seconds(body, mesh, zeros)


def body_seconds(body: Any, mesh: Mesh, blocks: Sequence[np.ndarray]) -> float:
    """A kernel body's compute on ``blocks``: the fastest of :data:`BODY_RUNS` runs, its
    collectives answered at once with zeros (their time is the exchanges')."""
    best = math.inf
    for _ in range(BODY_RUNS):
        rec = _Recorder(mesh)
        with bind(rec), np.errstate(all="ignore"):
            t = time.perf_counter()
            body(*blocks)
            best = min(best, time.perf_counter() - t)
    return best


def _piece_bytes(program: Program, op: ReshardOp, index: tuple[slice, ...]) -> int:
    assert op.input is not None
    info = program.values[op.input.index]  # an argument's Ref index is its value id too
    shape = info.sharding.shard_shape
    n = math.prod(len(range(*s.indices(d))) for s, d in zip(index, shape))
    return n * np.dtype(info.dtype).itemsize


def compile_schedule(program: Program, topology: Topology, overlap: bool = True) -> Schedule:
    """The :class:`Schedule` of ``program`` (cached per program, as ``lower`` is)."""
    return _compile(program, topology, overlap)


@functools.lru_cache(maxsize=256)
def _compile(program: Program, topology: Topology, overlap: bool) -> Schedule:
    plans = lower(program, overlap)
    groups: dict[tuple[Any, str], list[tuple[int, Op]]] = defaultdict(list)
    gangs: dict[int, GangSpec] = {}
    for plan in plans.values():
        gangs.update(plan.gangs)
        for dev, ops in plan.ops.items():
            for key, op in zip(_keys(ops), ops):
                kind = "kernel" if isinstance(op, KernelOp) else "recv" if _is_recv(op) else "send"
                groups[(key, kind)].append((dev, op))
    dph = topology.devices_per_host
    steps = []
    for (_key, kind), entries in sorted(groups.items(), key=lambda kv: kv[0][0]):
        gang = gangs[entries[0][1].gang]
        if kind == "kernel":
            steps.append(_kernel_step(program, topology, gang, entries))
        elif kind == "send":
            members: dict[int, DeviceInfo] = {int(d.id): d for d in gang.members}
            pieces = tuple((members[d], dst, _piece_bytes(program, op, index))  # type: ignore[arg-type,union-attr]
                           for d, op in entries for dst, index in op.sends)  # type: ignore[union-attr]
            devs = np.array(sorted({d for d, _ in entries}), dtype=np.int64)
            scale = entries[0][1].scale  # type: ignore[union-attr]
            steps.append(Step("send", gang.index, gang.name, devs, pieces=pieces, scale=scale, hosts=devs // dph))
        else:
            devs = np.array([d for d, _ in entries], dtype=np.int64)
            steps.append(Step("recv", gang.index, gang.name, devs, hosts=devs // dph))
    host_ops: dict[int, int] = defaultdict(int)
    host_devices: dict[str, list[int]] = {}
    for addr, plan in plans.items():
        host_ops[host_of(addr)] += sum(len(o) for o in plan.ops.values())
        host_devices[addr] = sorted(plan.ops)
    hosts = np.array(sorted(host_ops), dtype=np.int64)
    devices = np.array(sorted(d for devs in host_devices.values() for d in devs), dtype=np.int64)
    return Schedule(program.name, steps, devices, hosts, np.array([host_ops[h] for h in hosts], dtype=float),
                    host_devices, float(_annotation("", plans, {}, ())["cost"]), int(sum(host_ops.values())))


def _kernel_step(program: Program, topology: Topology, gang: GangSpec, entries: list[tuple[int, Op]]) -> Step:
    op = entries[0][1]
    assert isinstance(op, KernelOp) and gang.body is not None
    blocks = tuple((program.values[r.index].sharding.shard_shape, program.values[r.index].dtype) for r in op.inputs)
    exchanges, compute = _collectives(topology, gang.body, gang.mesh, blocks, gang.replicated)
    devs = np.array([d.id for d in gang.members], dtype=np.int64)
    return Step("kernel", gang.index, gang.name, devs, gang.cost_s, tuple(gang.mesh.shape.values()), exchanges,
                hosts=devs // topology.devices_per_host, compute=compute)
