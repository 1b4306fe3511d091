"""Hypothesis strategies for pathdask's own types: "for any mesh, spec and shape ...".

Requires ``hypothesis`` (the ``test`` extra).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from .spec import PartitionSpec

__all__ = ["mesh_shapes", "sharded_layouts", "specs_for"]

AXIS_NAMES = ("a", "b", "c")


@st.composite
def mesh_shapes(draw: Any, max_devices: int = 4) -> dict[str, int]:
    """Mesh shapes such as ``{"a": 2, "b": 2}`` with at most ``max_devices`` devices."""
    n_axes = draw(st.integers(1, 3))
    shape: dict[str, int] = {}
    for name in AXIS_NAMES[:n_axes]:
        room = max_devices // max(1, math.prod(shape.values()))
        shape[name] = draw(st.sampled_from([s for s in (1, 2, 4) if s <= room]))
    return shape


@st.composite
def sharded_layouts(draw: Any, mesh_shape: dict[str, int], max_rank: int = 3,
                    max_block: int = 3) -> tuple[PartitionSpec, tuple[int, ...]]:
    """A (spec, global shape) pair valid on a mesh of ``mesh_shape``: every dim divides."""
    rank = draw(st.integers(0, max_rank))
    axes = draw(st.permutations(list(mesh_shape)))
    entries: list[Any] = [None] * rank
    for a in axes:
        if rank and draw(st.booleans()):
            d = draw(st.integers(0, rank - 1))
            cur = entries[d]
            entries[d] = a if cur is None else (*((cur,) if isinstance(cur, str) else cur), a)
    spec = PartitionSpec(*entries)
    shape = []
    for d in range(rank):
        parts = math.prod(mesh_shape[a] for a in spec.axes_of(d))
        shape.append(parts * draw(st.integers(1, max_block)))
    return spec, tuple(shape)


@st.composite
def specs_for(draw: Any, shape: tuple[int, ...], mesh_shape: dict[str, int]) -> PartitionSpec:
    """A spec that splits ``shape`` evenly on a mesh of ``mesh_shape``."""
    entries: list[tuple[str, ...]] = [() for _ in shape]
    for a in mesh_shape:
        if not shape or not draw(st.booleans()):
            continue
        d = draw(st.integers(0, len(shape) - 1))
        parts = math.prod(mesh_shape[x] for x in entries[d]) * mesh_shape[a]
        if shape[d] % parts == 0:
            entries[d] = (*entries[d], a)
    return PartitionSpec(*[e if e else None for e in entries])
