"""The link model: when a piece is modelled to arrive, and what each link carried.

Real bytes move between hosts as fast as the machine moves them; the time a
piece is modelled to take follows the topology instead. Every transfer holds
two *ports* for ``nbytes / bandwidth`` seconds, one on each side, and arrives
``latency`` after it leaves the second:

- ``ici``: the sending device's ICI port and the receiving device's ICI port
  (contention is per device port);
- ``dcn``: the sending host's NIC and the receiving host's NIC (the host's
  devices share them; sending and receiving are separate ports);
- ``same_host``: a memory copy into the receiving device (its copy engine).

Each port is FIFO. The sender books its port when the piece leaves
(:meth:`LinkModel.depart`) and stamps the piece with the time it may start;
the receiver books its own port from then on (:meth:`LinkModel.arrival`). The
stamp is ``time.perf_counter()``, which is one clock for every process of one
machine (CLOCK_MONOTONIC); hosts on different machines would need their clocks
aligned for the modelled times, not for the bytes, to be right.

A transfer can carry a ``scale``: the modelled bytes per real byte. A graph
whose values are small stand-ins for a large model (``graphs/transformer.py``)
moves its real bytes and is timed as if it moved the modelled ones.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..topology import LINK_CLASSES, DeviceInfo, Link, Topology, device_info
from .bounded import newest

#: kinds of ports; ``nic-*`` ports are per host, the others per device
PORTS = ("ici-out", "ici-in", "nic-out", "nic-in", "copy-in")
#: (port kind at the sender, port kind at the receiver) per link class
SIDES: dict[str, tuple[str | None, str]] = {
    "same_host": (None, "copy-in"), "ici": ("ici-out", "ici-in"), "dcn": ("nic-out", "nic-in")}


@dataclass
class Port:
    """One FIFO port: when it is free again, and what it carried."""

    free_at: float = 0.0
    ends: deque[float] = field(default_factory=deque)  # modelled ends of the transfers it holds
    bytes: int = 0
    transfers: int = 0
    busy_s: float = 0.0
    longest_queue: int = 0  # transfers already on the port when one more came, at most
    longest_wait_s: float = 0.0  # modelled wait before a transfer could start, at most

    def book(self, ready: float, seconds: float, nbytes: int) -> float:
        """Hold the port for ``seconds`` from ``ready`` or when it is free; returns the start."""
        ends = self.ends
        while ends and ends[0] <= ready:
            ends.popleft()
        self.longest_queue = max(self.longest_queue, len(ends))
        begin = max(ready, self.free_at)
        self.longest_wait_s = max(self.longest_wait_s, begin - ready)
        self.free_at = begin + seconds
        ends.append(self.free_at)
        self.bytes += nbytes
        self.transfers += 1
        self.busy_s += seconds
        return begin

    def stats(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "transfers": self.transfers, "busy_s": self.busy_s,
                "longest_queue": self.longest_queue, "longest_wait_s": self.longest_wait_s}


def host_label(d: DeviceInfo) -> str:
    """A host's name in link stats: ``"<island>/<host in island>"``."""
    return f"{d.island}/{d.host}"


class Transfer(NamedTuple):
    """One modelled transfer, as its receiver booked it (``time.perf_counter()`` times)."""

    start: float
    end: float
    src: int
    dst: int
    link: str
    nbytes: int


class LinkModel:
    """The ports of one host's devices and NIC, and the transfers they carried.

    Threads: device threads call ``depart`` and ``arrival``; every field is guarded by ``lock``.
    """

    def __init__(self, topology: Topology, log: int = 20000) -> None:
        self.topology = topology
        self.lock = threading.Lock()
        self.ports: dict[tuple[str, Any], Port] = {}
        self.classes: dict[str, dict[str, Any]] = {c: _empty() for c in LINK_CLASSES}
        #: (source device, destination device) -> bytes that arrived over a link
        self.pair_bytes: dict[tuple[int, int], int] = {}
        #: recent transfers that arrived here; ``recorded`` counts every one ever
        self.transfers: deque[Transfer] = deque(maxlen=log)
        self.recorded = 0
        self._infos: dict[int, DeviceInfo] = {}

    def _info(self, device: int | DeviceInfo) -> DeviceInfo:
        if isinstance(device, DeviceInfo):
            return device
        info = self._infos.get(device)
        if info is None:
            info = self._infos[device] = device_info(self.topology, device)
        return info

    def _port(self, kind: str, d: DeviceInfo) -> Port:
        key = (kind, host_label(d) if kind.startswith("nic") else d.id)
        port = self.ports.get(key)
        if port is None:
            port = self.ports[key] = Port()
        return port

    def _class(self, a: DeviceInfo, b: DeviceInfo) -> tuple[str, Link | None]:
        cls = self.topology.link_class(a, b)
        return cls, self.topology.link(cls)

    def depart(self, src: DeviceInfo, dst: DeviceInfo, nbytes: int, start: float, scale: float = 1.0) -> float:
        """Book the sender's port for a piece sent at ``start``; returns when it may start to
        move (the stamp that travels with the piece)."""
        cls, link = self._class(src, dst)
        side = SIDES.get(cls, (None, ""))[0]
        if link is None or side is None:
            return start
        with self.lock:
            return self._port(side, src).book(start, nbytes * scale / link.bandwidth, nbytes)

    def arrival(self, src: int, dst: DeviceInfo, nbytes: int, ready: float, scale: float = 1.0) -> float:
        """Book the receiver's port for a piece that may start to move at ``ready``; returns
        when it is modelled to be in ``dst``'s memory."""
        source = self._info(src)
        cls, link = self._class(source, dst)
        if link is None:
            return ready
        seconds = nbytes * scale / link.bandwidth
        with self.lock:
            port = self._port(SIDES[cls][1], dst)
            begin = port.book(ready, seconds, nbytes)
            agg = self.classes[cls]
            agg["bytes"] += nbytes
            agg["modelled_bytes"] += int(nbytes * scale)
            agg["transfers"] += 1
            agg["busy_s"] += seconds
            agg["longest_queue"] = max(agg["longest_queue"], port.longest_queue)
            agg["longest_wait_s"] = max(agg["longest_wait_s"], port.longest_wait_s)
            self.pair_bytes[(src, dst.id)] = self.pair_bytes.get((src, dst.id), 0) + nbytes
            end = begin + seconds + link.latency
            self.transfers.append(Transfer(begin, end, src, dst.id, cls, nbytes))
            self.recorded += 1
        return end

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per link class (what arrived here): bytes, modelled bytes, transfers, busy seconds,
        and the longest queue (transfers) and wait (seconds) any of its ports saw."""
        with self.lock:
            return {c: dict(v) for c, v in self.classes.items()}

    def nics(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per host NIC that this host's devices used: its ``send`` and ``recv`` port stats."""
        with self.lock:
            out: dict[str, dict[str, dict[str, Any]]] = {}
            for (kind, where), port in self.ports.items():
                if kind in ("nic-out", "nic-in"):
                    out.setdefault(where, {})["send" if kind == "nic-out" else "recv"] = port.stats()
            return out

    def pairs(self) -> list[tuple[int, int, int]]:
        """(source, destination, bytes) for every device pair that moved bytes to this host."""
        with self.lock:
            return [(s, d, n) for (s, d), n in self.pair_bytes.items()]

    def transfers_after(self, cursor: int) -> tuple[list[Transfer], int]:
        """The transfers recorded since ``cursor`` (a previous return's count) and the new count."""
        with self.lock:
            return newest(self.transfers, self.recorded, cursor), self.recorded

    def reset(self) -> None:
        with self.lock:
            self.transfers.clear()


def _empty() -> dict[str, Any]:
    return {"bytes": 0, "modelled_bytes": 0, "transfers": 0, "busy_s": 0.0, "longest_queue": 0,
            "longest_wait_s": 0.0}

