"""The resource manager: hosts, devices and virtual slices mapped to them."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import SliceTooLargeError, TopologyError
from ..topology import DeviceInfo, Topology


@dataclass
class Slice:
    id: str
    client: str
    shape: dict[str, int]
    devices: list[int]


@dataclass
class HostRecord:
    address: str
    island: int
    host: int
    devices: list[DeviceInfo] = field(default_factory=list)


class ResourceManager:
    """Which worker is which host, which devices exist, and which slices use them."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.hosts: dict[str, HostRecord] = {}
        self.devices: dict[int, DeviceInfo] = {}
        self.slices: dict[str, Slice] = {}
        self.load: dict[int, int] = {}

    # -- hosts ---------------------------------------------------------------
    def add_host(self, address: str, requested: int | None = None) -> HostRecord:
        if address in self.hosts:
            return self.hosts[address]
        taken = {(h.island, h.host) for h in self.hosts.values()}
        slots = [self.topology.host_slot(i) for i in range(self.topology.num_hosts)]
        free = [s for s in slots if s not in taken]
        if not free:
            raise TopologyError(
                f"Worker {address} cannot join: all {self.topology.num_hosts} hosts of the "
                f"topology ({self.topology.describe()}) are taken. Start the scheduler with a "
                "larger topology or stop a worker first"
            )
        slot = free[0]
        if requested is not None and 0 <= int(requested) < len(slots) and slots[int(requested)] in free:
            slot = slots[int(requested)]
        island, host = slot
        devices = [
            DeviceInfo(d.id, d.island, d.host, d.index, address)
            for d in self.topology.devices_of_host(island, host)
        ]
        rec = self.hosts[address] = HostRecord(address, island, host, devices)
        for d in devices:
            self.devices[d.id] = d
            self.load.setdefault(d.id, 0)
        return rec

    def remove_host(self, address: str) -> HostRecord | None:
        rec = self.hosts.pop(address, None)
        if rec is not None:
            for d in rec.devices:
                self.devices.pop(d.id, None)
                self.load.pop(d.id, None)
        return rec

    # -- slices --------------------------------------------------------------
    def allocate(self, client: str, shape: dict[str, int], island: int | None = None, *,
                 devices: list[int] | None = None, exclude: list[int] | None = None,
                 placement: str = "pack") -> tuple[Slice, list[DeviceInfo]]:
        """A slice of ``prod(shape)`` devices in one island, spreading load across devices.

        Hints: ``devices`` names the exact devices; ``exclude`` keeps devices out;
        ``placement`` is ``"pack"`` (fill hosts: collectives stay on same-host links)
        or ``"spread"`` (one device per host first). The least-loaded devices win.
        """
        n = math.prod(shape.values())
        topo = self.topology
        if placement not in ("pack", "spread"):
            raise ValueError(f"placement must be 'pack' or 'spread', got {placement!r}")
        if devices is not None:
            return self._take(client, shape, n, devices)
        if n > topo.devices_per_island:
            raise SliceTooLargeError(
                f"Mesh {shape} needs {n} devices but an island has only "
                f"{topo.devices_per_island} ({topo.hosts_per_island} hosts x "
                f"{topo.devices_per_host} devices). Use a smaller mesh, or a topology with "
                "larger islands"
            )
        if island is not None and not 0 <= island < topo.islands:
            raise SliceTooLargeError(
                f"Island {island} does not exist; the topology has islands 0..{topo.islands - 1}"
            )
        candidates = [island] if island is not None else list(range(topo.islands))
        skip = set(exclude or ())
        best: tuple[tuple[int, int], list[DeviceInfo]] | None = None
        for isl in candidates:
            devs = [d for d in self.devices.values() if d.island == isl and d.id not in skip]
            if len(devs) < n:
                continue
            if placement == "pack":
                chosen = sorted(devs, key=lambda d: (self.load[d.id], d.id))[:n]
            else:
                chosen = sorted(devs, key=lambda d: (self.load[d.id], d.index, d.host))[:n]
            score = (sum(self.load[d.id] for d in chosen), isl)
            if best is None or score < best[0]:
                best = (score, chosen)
        if best is None:
            where = f"island {island}" if island is not None else "any island"
            have = {i: sum(d.island == i for d in self.devices.values()) for i in candidates}
            raise SliceTooLargeError(
                f"Mesh {shape} needs {n} devices but {where} has fewer live devices "
                f"(live devices per island: {have}). Wait for workers to join or ask for a "
                "smaller mesh"
            )
        return self._record(client, shape, sorted(best[1], key=lambda d: d.id))

    def _take(self, client: str, shape: dict[str, int], n: int, ids: list[int]) -> tuple[Slice, list[DeviceInfo]]:
        missing = sorted(set(ids) - set(self.devices))
        if len(ids) != n or len(set(ids)) != n or missing:
            raise SliceTooLargeError(
                f"Mesh {shape} needs {n} distinct live devices; got devices={ids}"
                + (f", of which {missing} are not live" if missing else "")
            )
        chosen = [self.devices[i] for i in ids]
        if len({d.island for d in chosen}) > 1:
            raise SliceTooLargeError(f"devices={ids} span islands {sorted({d.island for d in chosen})}; "
                                     "a mesh lives inside one island")
        return self._record(client, shape, chosen)  # in the order given: it is the mesh's layout

    def _record(self, client: str, shape: dict[str, int], devices: list[DeviceInfo]) -> tuple[Slice, list[DeviceInfo]]:
        sl = Slice(uuid.uuid4().hex[:12], client, dict(shape), [d.id for d in devices])
        self.slices[sl.id] = sl
        for d in devices:
            self.load[d.id] += 1
        return sl, devices

    def release(self, slice_id: str) -> None:
        sl = self.slices.pop(slice_id, None)
        if sl is not None:
            for d in sl.devices:
                if d in self.load:
                    self.load[d] -= 1

    def release_client(self, client: str) -> None:
        for sid in [s.id for s in self.slices.values() if s.client == client]:
            self.release(sid)

    def describe_devices(self) -> list[dict[str, Any]]:
        out = []
        for d in sorted(self.devices.values(), key=lambda d: d.id):
            out.append({
                "id": d.id, "island": d.island, "host": d.host, "index": d.index,
                "address": d.address, "state": "live",
                "slices": [s.id for s in self.slices.values() if d.id in s.devices],
            })
        return out
