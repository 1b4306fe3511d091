"""Meshes and arrays of a topology without a cluster: what the simulation traces programs on.

A traced program needs only shapes, dtypes, meshes and specs (``trace_program``
reads nothing else), so these stand-ins let the real tracing and lowering run for
a topology of any size. Devices get synthetic host addresses ``host-<i>`` (``i``
the global host index), which is what the lowering groups plans by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SliceTooLargeError
from ..mesh import Mesh
from ..spec import PartitionSpec
from ..topology import DeviceInfo, Topology, device_info

__all__ = ["AbstractArray", "abstract_mesh", "host_address", "host_of"]


def host_address(topology: Topology, device: int) -> str:
    """The synthetic address of ``device``'s host: ``host-<global host index>``."""
    return f"host-{int(device) // topology.devices_per_host}"


def host_of(address: str) -> int:
    """The global host index of a synthetic address (``host-7`` -> 7)."""
    return int(address.rsplit("-", 1)[1])


def devices(topology: Topology, ids: Sequence[int]) -> list[DeviceInfo]:
    return [device_info(topology, int(i), host_address(topology, int(i))) for i in ids]


def abstract_mesh(topology: Topology, shape: Mapping[str, int], island: int = 0, first: int = 0,
                  ids: Sequence[int] | None = None, client: str = "") -> Mesh:
    """A mesh of ``shape`` on ``topology``: devices ``first, first+1, ...`` of ``island``, or ``ids``.

    Examples
    --------
    >>> topo = Topology(islands=512, hosts_per_island=1, devices_per_host=4)
    >>> abstract_mesh(topo, {"x": 4}, island=3).device_ids
    (12, 13, 14, 15)
    """
    size = math.prod(shape.values())
    if ids is None:
        if not 0 <= island < topology.islands:
            raise SliceTooLargeError(f"Topology has islands 0..{topology.islands - 1}, asked for island {island}")
        if first + size > topology.devices_per_island:
            raise SliceTooLargeError(
                f"A mesh of {size} device(s) from device {first} does not fit in an island of "
                f"{topology.devices_per_island}; use a smaller mesh or give ids= across islands")
        base = island * topology.devices_per_island + first
        ids = range(base, base + size)
    return Mesh.create(dict(shape), devices(topology, ids), client=client)


@dataclass(frozen=True)
class AbstractArray:
    """A sharded array's signature without data: what ``trace_program`` reads of an argument."""

    shape: tuple[int, ...]
    dtype: Any
    mesh: Mesh
    spec: PartitionSpec = PartitionSpec()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize
