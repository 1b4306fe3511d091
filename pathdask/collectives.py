"""Collectives over named mesh axes, for use inside ``@pathdask.function`` bodies.

They take ``jax.lax``'s signatures. Each one is an *exchange* between the
members of the device's group along the named axes: the host runtimes move
the blocks directly (in memory on one host, over Dask comms between hosts),
never through the scheduler. Reductions combine blocks in member order, so
every member computes bit-identical results.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .errors import ShardingError
from .mesh import Mesh

__all__ = [
    "all_gather",
    "all_to_all",
    "axis_index",
    "axis_size",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "psum",
]

AxisName = str | Sequence[str]


class GangContext(Protocol):
    """What a device offers the body it is running (see ``worker/execute.py``)."""

    mesh: Mesh
    position: int

    def exchange(
        self, sends: dict[int, np.ndarray], sources: Sequence[int], like: np.ndarray
    ) -> dict[int, np.ndarray]:
        """Send ``sends[pos]`` to each mesh position and return what ``sources`` sent."""


#: a context variable, not a thread-local: the devices of one host may share a thread
#: as greenlets (``pathdask.driver: host``), and each greenlet has its own context
_ctx: contextvars.ContextVar[GangContext | None] = contextvars.ContextVar("pathdask_gang", default=None)


def current() -> GangContext:
    ctx = _ctx.get()
    if ctx is None:
        raise RuntimeError(
            "Collectives can only be called inside the body of a @pathdask.function while "
            "it runs on a mesh"
        )
    return ctx


class bind:
    """Context manager that makes ``ctx`` the current gang context of this thread."""

    def __init__(self, ctx: GangContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> GangContext:
        self.token = _ctx.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc: Any) -> None:
        _ctx.reset(self.token)


def _names(axis_name: AxisName) -> tuple[str, ...]:
    names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    if not names:
        raise ShardingError("A collective needs at least one mesh axis name")
    return names


def _group(axis_name: AxisName) -> tuple[GangContext, list[int], int]:
    ctx = current()
    names = _names(axis_name)
    ctx.mesh.check_axes(names)
    members = ctx.mesh.group(ctx.position, names)
    return ctx, members, members.index(ctx.position)


def _gather(x: Any, axis_name: AxisName) -> list[np.ndarray]:
    """Every member's block, in member order."""
    ctx, members, me = _group(axis_name)
    x = np.asarray(x)
    others = [p for p in members if p != ctx.position]
    got = ctx.exchange({p: x for p in others}, others, x)
    return [x if p == ctx.position else got[p] for p in members]


def _reduce(op: Callable[..., np.ndarray]) -> Callable[[Any, AxisName], np.ndarray]:
    def reduce(x: Any, axis_name: AxisName) -> np.ndarray:
        blocks = _gather(x, axis_name)
        out = blocks[0]
        for b in blocks[1:]:
            out = op(out, b)
        return np.asarray(out)

    return reduce


psum = _reduce(np.add)
psum.__name__ = "psum"
psum.__doc__ = "Sum of ``x`` over the devices along ``axis_name`` (replicated result)."
pmax = _reduce(np.maximum)
pmax.__name__ = "pmax"
pmax.__doc__ = "Element-wise maximum of ``x`` over the devices along ``axis_name``."
pmin = _reduce(np.minimum)
pmin.__name__ = "pmin"
pmin.__doc__ = "Element-wise minimum of ``x`` over the devices along ``axis_name``."


def pmean(x: Any, axis_name: AxisName) -> np.ndarray:
    """Mean of ``x`` over the devices along ``axis_name``."""
    return psum(x, axis_name) / axis_size(axis_name)


def all_gather(x: Any, axis_name: AxisName, *, axis: int = 0, tiled: bool = False) -> np.ndarray:
    """Gather every member's block: stacked on a new ``axis``, or concatenated if ``tiled``."""
    blocks = _gather(x, axis_name)
    return np.concatenate(blocks, axis=axis) if tiled else np.stack(blocks, axis=axis)


def all_to_all(
    x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, *, tiled: bool = False
) -> np.ndarray:
    """Split ``x`` along ``split_axis``, send chunk j to member j, join along ``concat_axis``.

    As in ``jax.lax.all_to_all``: without ``tiled``, ``x.shape[split_axis]`` must
    equal the group size; that axis is removed and a new one inserted at
    ``concat_axis``. With ``tiled`` no axis is added or removed.
    """
    ctx, members, me = _group(axis_name)
    x = np.asarray(x)
    n = len(members)
    if x.shape[split_axis] % n or (not tiled and x.shape[split_axis] != n):
        raise ShardingError(
            f"all_to_all over {n} devices: split_axis {split_axis} of block shape {x.shape} "
            f"must {'be divisible by' if tiled else 'equal'} {n}"
        )
    chunks = np.split(x, n, axis=split_axis)
    if not tiled:
        chunks = [np.squeeze(c, axis=split_axis) for c in chunks]
    others = [p for p in members if p != ctx.position]
    got = ctx.exchange({p: chunks[i] for i, p in enumerate(members) if p != ctx.position}, others, chunks[me])
    parts = [chunks[me] if p == ctx.position else got[p] for p in members]
    return np.concatenate(parts, axis=concat_axis) if tiled else np.stack(parts, axis=concat_axis)


def ppermute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> np.ndarray:
    """Send ``x`` from axis index ``src`` to ``dst`` for each pair; non-receivers get zeros."""
    ctx, members, me = _group(axis_name)
    x = np.asarray(x)
    n = len(members)
    srcs = [s for s, _ in perm]
    dsts = [d for _, d in perm]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts) or not all(0 <= i < n for i in srcs + dsts):
        raise ShardingError(
            f"ppermute perm must be a partial permutation of range({n}) with unique sources "
            f"and destinations, got {list(perm)}"
        )
    sends = {members[d]: x for s, d in perm if s == me and d != me}
    sources = [members[s] for s, d in perm if d == me and s != me]
    got = ctx.exchange(sends, sources, x)
    if any(s == me and d == me for s, d in perm):
        return x.copy()
    return got[sources[0]] if sources else np.zeros_like(x)


def axis_index(axis_name: AxisName) -> int:
    """This device's index along ``axis_name`` (row-major over several axes)."""
    ctx, members, me = _group(axis_name)
    return me


def axis_size(axis_name: AxisName) -> int:
    """The number of devices along ``axis_name``."""
    ctx = current()
    names = _names(axis_name)
    ctx.mesh.check_axes(names)
    shape = ctx.mesh.shape
    return math.prod(shape[a] for a in names)
