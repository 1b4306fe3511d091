"""``PartitionSpec``: how each array dimension maps onto mesh axes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Union

from .errors import ShardingError

__all__ = ["P", "PartitionSpec"]

Entry = Union[None, str, tuple[str, ...]]


def _normalize(entry: object, position: int) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        return tuple(entry)
    raise ShardingError(
        f"PartitionSpec entry {position}: expected None, a mesh axis name or a tuple of "
        f"axis names, got {entry!r}"
    )


class PartitionSpec:
    """One entry per array dimension: ``None`` (replicated), an axis, or a tuple of axes.

    Trailing dimensions not named are replicated. A mesh axis may appear at most
    once in a spec; axes not named anywhere replicate the array over them.

    Examples
    --------
    >>> P("data", None)
    P('data', None)
    >>> P(("data", "model"),).axes_of(0)
    ('data', 'model')
    """

    __slots__ = ("_axes", "_entries")

    def __init__(self, *entries: Entry) -> None:
        axes = tuple(_normalize(e, i) for i, e in enumerate(entries))
        flat = [a for group in axes for a in group]
        dup = sorted({a for a in flat if flat.count(a) > 1})
        if dup:
            raise ShardingError(
                f"PartitionSpec {entries!r} uses mesh axis {dup[0]!r} more than once; each "
                "mesh axis may shard at most one dimension"
            )
        self._entries = tuple(entries)
        self._axes = axes

    def axes_of(self, dim: int) -> tuple[str, ...]:
        """The mesh axes that shard dimension ``dim`` (empty if replicated)."""
        return self._axes[dim] if dim < len(self._axes) else ()

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        return tuple(a for group in self._axes for a in group)

    def __len__(self) -> int:
        return len(self._axes)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def _key(self) -> tuple[tuple[str, ...], ...]:
        # P("x", None) and P("x") mean the same thing.
        axes = list(self._axes)
        while axes and not axes[-1]:
            axes.pop()
        return tuple(axes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"P({', '.join(map(repr, self._entries))})"

    def __reduce__(self) -> tuple[type[PartitionSpec], tuple[Entry, ...]]:
        return (PartitionSpec, self._entries)


P = PartitionSpec
