"""``Mesh``: a named-axis grid of physical devices inside one island."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import ShardingError
from .topology import DeviceInfo

__all__ = ["Mesh"]


def check_shape(shape: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    if not isinstance(shape, Mapping) or not shape:
        raise ShardingError(
            f"A mesh shape must be a non-empty mapping of axis name to size, such as "
            f"{{'data': 2, 'model': 2}}; got {shape!r}"
        )
    for name, size in shape.items():
        if not isinstance(name, str) or not name:
            raise ShardingError(f"Mesh axis names must be non-empty strings, got {name!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ShardingError(f"Mesh axis {name!r}: size must be a positive int, got {size!r}")
    return tuple(shape.items())


@dataclass(frozen=True)
class Mesh:
    """An immutable, validated grid of devices with named axes.

    ``devices`` is row-major over ``axes``: the last axis varies fastest, so it
    lands on neighbouring devices (the same host where possible).
    """

    axes: tuple[tuple[str, int], ...]
    devices: tuple[DeviceInfo, ...]
    slice_id: str = field(default="", compare=False)
    #: the id of the client whose slice this is; meshes of different clients never compare equal
    client: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", check_shape(dict(self.axes)))
        if len(self.devices) != self.size:
            raise ShardingError(
                f"Mesh {dict(self.axes)} needs {self.size} devices, got {len(self.devices)}"
            )

    @classmethod
    def create(cls, shape: Mapping[str, int], devices: list[DeviceInfo], slice_id: str = "",
               client: str = "") -> Mesh:
        return cls(check_shape(shape), tuple(devices), slice_id, client)

    @functools.cached_property
    def shape(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def size(self) -> int:
        return math.prod(size for _, size in self.axes)

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices)

    @property
    def islands(self) -> tuple[int, ...]:
        return tuple(sorted({d.island for d in self.devices}))

    @property
    def hosts(self) -> tuple[str, ...]:
        """Worker addresses of the hosts this mesh spans, in device order."""
        return tuple(dict.fromkeys(d.address for d in self.devices))

    def axis_size(self, name: str) -> int:
        self.check_axes((name,))
        return self.shape[name]

    def check_axes(self, names: tuple[str, ...], what: str = "mesh axis") -> None:
        for name in names:
            if name not in self.shape:
                raise ShardingError(
                    f"Unknown {what} {name!r}; this mesh has axes {list(self.axis_names)}"
                )

    def coords(self, position: int) -> dict[str, int]:
        """The axis coordinates of the ``position``-th device."""
        idx = np.unravel_index(position, tuple(s for _, s in self.axes))
        return {name: int(i) for (name, _), i in zip(self.axes, idx)}

    def position(self, coords: Mapping[str, int]) -> int:
        return int(np.ravel_multi_index(tuple(coords[n] for n, _ in self.axes), tuple(s for _, s in self.axes)))

    def group(self, position: int, axis_names: tuple[str, ...]) -> list[int]:
        """Positions of the devices that share every coordinate except ``axis_names``.

        Ordered row-major over ``axis_names`` (in the order given), which is the
        member order every collective uses. Cached: collectives ask for it on every call.
        """
        members = self._groups.get((position, axis_names))
        if members is None:
            members = self._groups[(position, axis_names)] = tuple(self._group(position, axis_names))
        return list(members)

    @functools.cached_property
    def _groups(self) -> dict[tuple[int, tuple[str, ...]], tuple[int, ...]]:
        """``group``'s answers, on the mesh itself: hashing a mesh per collective cost more than
        the collective's own bookkeeping."""
        return {}

    def _group(self, position: int, axis_names: tuple[str, ...]) -> list[int]:
        base = self.coords(position)
        sizes = [self.shape[a] for a in axis_names]
        members = []
        for idx in np.ndindex(*sizes):
            c = dict(base)
            c.update(zip(axis_names, (int(i) for i in idx)))
            members.append(self.position(c))
        return members

    def __repr__(self) -> str:
        where = ", ".join(f"i{d.island}h{d.host}d{d.index}" for d in self.devices)
        return f"Mesh({self.shape}, devices=[{where}])"

    def _repr_html_(self) -> str:
        from .html import card, host_label, mesh_svg, table

        hosts = {d.address: host_label(d) for d in self.devices}
        rows = [
            ("axes", ", ".join(f"{a}: {n}" for a, n in self.axes)),
            ("devices", ", ".join(str(i) for i in self.device_ids)),
            ("island" + ("s" if len(self.islands) > 1 else ""), ", ".join(map(str, self.islands))),
            ("hosts", ", ".join(f"{label} ({addr or 'unplaced'})" for addr, label in hosts.items())),
            ("slice", self.slice_id or "-"),
        ]
        return card("pathdask.Mesh", f"{self.size} device(s)", table(rows), mesh_svg(self))
