"""The lowered form of a program, as one host sees it.

These frozen specs are built by the client's lowering and read by the host
runtime; nothing in them changes once built. A host's plan is cached by the
client per (program, host) and reused for every call with the same signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Union

import numpy as np

from .chunking import empty, split
from .topology import DeviceInfo

__all__ = ["BufferKey", "Ref", "OutSpec", "KernelOp", "ReshardOp", "PutOp", "LoadOp", "GangSpec", "HostPlan"]

#: The Dask keys of a program are tuples ``(kind, program id, ...)`` (``*_key`` below):
#: one output key per (output, host), which owns that output's buffers on that host (a call
#: makes it in memory; a graph computes it), and, for a program submitted as a graph, one
#: dispatch task per host. Their first element, which names Dask's task group,
#: is the same for every program, so that a stream of calls does not pile up task groups.
DISPATCH = "pathdask-dispatch"
OUTPUT = "pathdask-out"
GANG = "pathdask-gang"  # sequential dispatch: one task per gang and device


def dispatch_key(pid: str, host: int) -> tuple[str, str, int]:
    return (DISPATCH, pid, host)


def output_key(pid: str, index: int, host: int) -> tuple[str, str, int, int]:
    return (OUTPUT, pid, index, host)


def gang_key(pid: str, gang: int, device: int) -> tuple[str, str, int, int]:
    return (GANG, pid, gang, device)


def as_key(key: Any) -> Any:
    """Keys arrive as lists through msgpack; Dask's keys are tuples."""
    return tuple(key) if isinstance(key, list) else key


def dispatched_program(key: Any) -> str | None:
    """The program whose dispatch task ``key`` is, if it is one."""
    return str(key[1]) if isinstance(key, tuple) and len(key) == 3 and key[0] == DISPATCH else None


#: Plans a host keeps per client, least recently used first out (``worker/plans.py``).
#: Clients remember half as many per host as sent, so that a call never names a
#: plan its host evicted, even when Dask reorders calls a little.
PLANS_PER_CLIENT = 2048
#: A logical buffer: (producing program, value id). One per device it lives on.
BufferKey = tuple[str, int]
Index = tuple[slice, ...]


@dataclass(frozen=True)
class Ref:
    """A kernel input: ``("in", i)`` is the program's i-th argument, ``("v", vid)`` a value of it."""

    kind: str
    index: int


@dataclass(frozen=True)
class OutSpec:
    vid: int
    shape: tuple[int, ...]
    dtype: str

    @cached_property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class KernelOp:
    """One device's part of a ``@function`` gang."""

    gang: int
    position: int
    inputs: tuple[Ref, ...]
    outputs: tuple[OutSpec, ...]


@dataclass(frozen=True)
class ReshardOp:
    """One device's part of a resharding gang: pieces it sends and pieces it receives."""

    gang: int
    input: Ref | None
    sends: tuple[tuple[DeviceInfo, Index], ...]
    recvs: tuple[tuple[int, Index], ...]  # (source device id, where it goes in our block)
    output: OutSpec | None
    #: modelled bytes per real byte of its pieces (``ShardedArray.to(..., model_nbytes=)``)
    scale: float = 1.0


@dataclass(frozen=True)
class PutOp:
    """Store a block that came with the put's plan (``client.put``).

    The block travels as ``parts``: runs of its C-order bytes, each at most one
    Dask frame (``distributed.comm.shard``). Dask would split a larger block
    into frames and merge them again on arrival into a second copy; here the
    host fills the block part by part and lets each part go as soon as it is
    copied (:meth:`take`), so a put never holds a block twice. A block of one
    part is used as it came, without a copy. The only op that changes after it
    is built: its parts are taken once (a put's plan is used once).
    """

    gang: int
    output: OutSpec
    parts: list[np.ndarray]

    @staticmethod
    def parts_of(block: np.ndarray, part: int) -> list[np.ndarray]:
        """``block``'s bytes in parts of at most ``part`` bytes (views, unless it is strided).

        Ops of one block should share these part objects (each in a list of its own):
        pickle then sends a replicated block once per host, not once per device.
        """
        return [np.frombuffer(b, np.uint8) for _, b in split(block, part)]

    def take(self) -> np.ndarray:
        """The block, built from the parts (which are let go one by one)."""
        shape, dtype = self.output.shape, np.dtype(self.output.dtype)
        if len(self.parts) == 1:
            return self.parts.pop().view(dtype).reshape(shape)
        block, data = empty(shape, dtype)
        offset = 0
        while self.parts:
            part = self.parts.pop(0)
            data[offset:offset + part.nbytes] = part.data
            offset += part.nbytes
        return block


@dataclass(frozen=True)
class LoadOp:
    """Read a block from a checkpoint (``client.resume``): region ``index`` of the zarr
    array ``name`` in the checkpoint directory ``path``, read by the host that will hold it.

    Each chunk the region touches is checked against its checksum from the commit
    record (``checksums``: chunk coordinates and CRC-32, ``checkpoint_format.py``);
    a mismatch fails the load with :class:`~pathdask.errors.CheckpointCorruptError`.
    """

    gang: int
    output: OutSpec
    path: str
    name: str
    index: tuple[slice, ...]
    #: the array's global shape and chunk shape, which may differ from this block's
    shape: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()
    checksums: tuple[tuple[tuple[int, ...], int], ...] = ()

    def take(self) -> np.ndarray:
        from .checkpoint_format import read_block

        block = read_block(self.path, self.name, self.index, self.shape, self.chunks, dict(self.checksums))
        return block.reshape(self.output.shape)


Op = Union[KernelOp, ReshardOp, PutOp, LoadOp]


@dataclass(frozen=True)
class GangSpec:
    """What every device of a gang shares: its body, mesh and modelled cost."""

    index: int
    name: str
    members: tuple[DeviceInfo, ...]
    mesh: Any = None  # pathdask.mesh.Mesh for kernels
    body: Callable[..., Any] | None = None
    cost_s: float = 0.0
    #: per output, the mesh axes (of size > 1) that its out_spec leaves out: its blocks must be
    #: equal along them, and devices check it (``pathdask.check-replication``); empty: no check
    replicated: tuple[tuple[str, ...], ...] = ()

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        """The addresses of its members' hosts, sorted: a tuple of str, which the garbage
        collector does not track in the records that keep it."""
        return tuple(sorted({m.address for m in self.members}))


@dataclass(frozen=True)
class HostPlan:
    """A host's part of a whole program: its gangs and, per local device, its ops in order."""

    name: str
    gangs: dict[int, GangSpec]
    ops: dict[int, tuple[Op, ...]]
    #: program output index -> (value id, local device id) pairs it owns on this host
    owned: dict[int, tuple[tuple[int, int], ...]]
    #: hosts cache plans by id, so that later calls of the same program send only the id;
    #: empty for plans that travel inside their dispatch (sequential dispatch)
    id: str = ""
    #: used by one call only (a put, whose plan carries its data): the host drops it once used
    once: bool = False
    #: the program runs on this host alone: should the host be lost, its outputs all go with it,
    #: so its ending need not reach the scheduler at once (``streams.py``)
    alone: bool = False
