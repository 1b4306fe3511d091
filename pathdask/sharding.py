"""Exact shard shapes, index maps, split/assemble and resharding plans.

Everything here is pure: it reads a shape, a :class:`~pathdask.mesh.Mesh` and a
:class:`~pathdask.spec.PartitionSpec` and computes where each element lives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import ShardingError
from .mesh import Mesh
from .spec import PartitionSpec
from .topology import DeviceInfo

__all__ = ["Sharding", "ReshardPiece", "reshard_plan"]

Index = tuple[slice, ...]


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array, copied only if needed; 0-d stays 0-d."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


@dataclass(frozen=True)
class Sharding:
    """A global ``shape`` split over ``mesh`` by ``spec``; validated on creation."""

    shape: tuple[int, ...]
    mesh: Mesh
    spec: PartitionSpec

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if len(self.spec) > len(self.shape):
            raise ShardingError(
                f"PartitionSpec {self.spec!r} has {len(self.spec)} entries but the array "
                f"has only {len(self.shape)} dimension(s) (shape {self.shape})"
            )
        self.mesh.check_axes(self.spec.mesh_axes)
        for dim, size in enumerate(self.shape):
            parts = self.parts(dim)
            if size % parts:
                axes = self.spec.axes_of(dim)
                raise ShardingError(
                    f"Dimension {dim} of shape {self.shape} has size {size}, which mesh "
                    f"axis {'s' if len(axes) > 1 else ''}{axes if len(axes) > 1 else repr(axes[0])} "
                    f"cannot split into {parts} equal parts; choose a size divisible by "
                    f"{parts} or another spec"
                )

    def parts(self, dim: int) -> int:
        return math.prod(self.mesh.shape[a] for a in self.spec.axes_of(dim))

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return tuple(size // self.parts(d) for d, size in enumerate(self.shape))

    def block_index(self, position: int) -> tuple[int, ...]:
        """Which block (per dimension) the device at ``position`` holds."""
        return self._blocks[position]

    @property
    def _blocks(self) -> tuple[tuple[int, ...], ...]:
        """Per mesh position, its block index (shared by equal shardings: results are
        assembled per call, each with a sharding of its own)."""
        return _block_table(self.shape, self.mesh.axes, self.spec._key())

    def index(self, position: int) -> Index:
        """Global slices of the block on the device at ``position``."""
        block = self.shard_shape
        return tuple(
            slice(b * n, (b + 1) * n) for b, n in zip(self.block_index(position), block)
        )

    def indices(self) -> list[Index]:
        return [self.index(p) for p in range(self.mesh.size)]

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """Per-device blocks of ``array``, in mesh position order (contiguous).

        Positions that hold the same block (replicated dims) share one copy: blocks
        are immutable once on a device, and a host receives a shared one once.
        """
        if tuple(array.shape) != self.shape:
            raise ShardingError(f"Expected an array of shape {self.shape}, got {array.shape}")
        copies: dict[tuple[int, ...], np.ndarray] = {}
        blocks = []
        for pos, ix in enumerate(self.indices()):
            key = self.block_index(pos)
            if key not in copies:
                copies[key] = contiguous(array[ix])
            blocks.append(copies[key])
        return blocks

    def assemble(self, blocks: dict[int, np.ndarray], dtype: np.dtype) -> np.ndarray:
        """The global array from per-position blocks (one per distinct block is enough)."""
        out = np.empty(self.shape, dtype=dtype)
        seen: set[tuple[int, ...]] = set()
        for pos, block in blocks.items():
            key = self.block_index(pos)
            if key not in seen:
                seen.add(key)
                out[self.index(pos)] = block
        expected = math.prod(self.parts(d) for d in range(len(self.shape)))
        if len(seen) != expected:
            raise ShardingError(f"Got {len(seen)} distinct blocks, expected {expected}")
        return out

    def positions_by_block(self) -> dict[tuple[int, ...], list[int]]:
        return {block: list(positions) for block, positions in self._positions.items()}

    @property
    def _positions(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        return _positions_table(self.shape, self.mesh.axes, self.spec._key())


@lru_cache(maxsize=4096)
def _block_table(shape: tuple[int, ...], axes: tuple[tuple[str, int], ...],
                 spec: tuple[tuple[str, ...], ...]) -> tuple[tuple[int, ...], ...]:
    sizes = dict(axes)
    out = []
    for position in range(math.prod(sizes.values())):
        coords = dict(zip(sizes, np.unravel_index(position, tuple(sizes.values()))))
        block = []
        for dim in range(len(shape)):
            idx = 0
            for a in spec[dim] if dim < len(spec) else ():
                idx = idx * sizes[a] + int(coords[a])
            block.append(idx)
        out.append(tuple(block))
    return tuple(out)


@lru_cache(maxsize=4096)
def _positions_table(shape: tuple[int, ...], axes: tuple[tuple[str, int], ...],
                     spec: tuple[tuple[str, ...], ...]) -> dict[tuple[int, ...], tuple[int, ...]]:
    out: dict[tuple[int, ...], list[int]] = {}
    for p, block in enumerate(_block_table(shape, axes, spec)):
        out.setdefault(block, []).append(p)
    return {block: tuple(positions) for block, positions in out.items()}


def global_shape(block_shape: tuple[int, ...], mesh: Mesh, spec: PartitionSpec) -> tuple[int, ...]:
    """The global shape whose blocks under ``spec`` have ``block_shape``."""
    if len(spec) > len(block_shape):
        raise ShardingError(
            f"out_spec {spec!r} has {len(spec)} entries but the kernel returned blocks of "
            f"rank {len(block_shape)} (shape {block_shape})"
        )
    mesh.check_axes(spec.mesh_axes)
    return tuple(
        n * math.prod(mesh.shape[a] for a in spec.axes_of(d)) for d, n in enumerate(block_shape)
    )


@dataclass(frozen=True)
class ReshardPiece:
    """One device-to-device copy: ``src`` block[src_index] -> ``dst`` block[dst_index]."""

    src: int  # source mesh position
    dst: int  # target mesh position
    src_index: Index
    dst_index: Index


def _intersect(a: Index, b: Index) -> Index | None:
    out = []
    for sa, sb in zip(a, b):
        lo, hi = max(sa.start, sb.start), min(sa.stop, sb.stop)
        if lo >= hi:
            return None
        out.append(slice(lo, hi))
    return tuple(out)


def _local(ix: Index, origin: Index) -> Index:
    return tuple(slice(s.start - o.start, s.stop - o.start) for s, o in zip(ix, origin))


def reshard_plan(src: Sharding, dst: Sharding) -> list[ReshardPiece]:
    """The transfers that turn ``src``'s blocks into ``dst``'s blocks.

    For each target device and each distinct source block overlapping it, one
    source holding that block is chosen: the target device itself if it holds
    it, else one on the same host, else the same island, else any; ties go to
    the least-used sender so that load spreads.
    """
    if src.shape != dst.shape:
        raise ShardingError(f"Cannot reshard shape {src.shape} to {dst.shape}")
    pieces: list[ReshardPiece] = []
    load = [0] * src.mesh.size
    by_block = src.positions_by_block()
    src_idx = {blk: src.index(holders[0]) for blk, holders in by_block.items()}
    for t in range(dst.mesh.size):
        t_ix = dst.index(t)
        tdev = dst.mesh.devices[t]
        for blk, holders in by_block.items():
            overlap = _intersect(src_idx[blk], t_ix)
            if overlap is None:
                continue

            def rank(p: int, tdev: DeviceInfo = tdev) -> tuple[int, int, int]:
                d = src.mesh.devices[p]
                distance = (
                    0 if d.id == tdev.id else 1 if d.address == tdev.address
                    else 2 if d.island == tdev.island else 3
                )
                return (distance, load[p], p)

            s = min(holders, key=rank)
            load[s] += 1
            pieces.append(ReshardPiece(s, t, _local(overlap, src_idx[blk]), _local(overlap, t_ix)))
    return pieces
