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

#: (port kind at the sender, port kind at the receiver) per link class; ``nic-*`` ports are
#: per host, the others per device
SIDES: dict[str, tuple[str | None, str]] = {
    "same_host": (None, "copy-in"), "ici": ("ici-out", "ici-in"), "dcn": ("nic-out", "nic-in")}
#: the link class of each receiving port kind
RECEIVING = {receiving: cls for cls, (_, receiving) in SIDES.items()}


@dataclass
class Port:
    """One FIFO port: when it is free again, and what it carried."""

    free_at: float = 0.0
    ends: deque[float] = field(default_factory=deque)  # modelled ends of the transfers it holds
    bytes: int = 0
    modelled_bytes: int = 0
    transfers: int = 0
    busy_s: float = 0.0
    longest_queue: int = 0  # transfers already on the port when one more came, at most
    longest_wait_s: float = 0.0  # modelled wait before a transfer could start, at most

    def book(self, ready: float, seconds: float, nbytes: int, scale: float) -> float:
        """Hold the port for ``seconds`` from ``ready`` or when it is free; returns the start.
        ``nbytes`` real bytes pass, timed as ``scale`` times as many."""
        ends = self.ends
        while ends and ends[0] <= ready:
            ends.popleft()
        self.longest_queue = max(self.longest_queue, len(ends))
        begin = max(ready, self.free_at)
        self.longest_wait_s = max(self.longest_wait_s, begin - ready)
        self.free_at = begin + seconds
        ends.append(self.free_at)
        self.bytes += nbytes
        self.modelled_bytes += int(nbytes * scale)
        self.transfers += 1
        self.busy_s += seconds
        return begin

    def stats(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "modelled_bytes": self.modelled_bytes, "transfers": self.transfers,
                "busy_s": self.busy_s, "longest_queue": self.longest_queue, "longest_wait_s": self.longest_wait_s}


def add_stats(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add port or link-class stats into ``into``: counts add up, the longest queue and wait
    are maxima."""
    for k, v in more.items():
        into[k] = max(into.get(k, 0), v) if k.startswith("longest") else into.get(k, 0) + v


def host_label(d: DeviceInfo) -> str:
    """A host's name in link stats: ``"<island>/<host in island>"``."""
    return f"{d.island}/{d.host}"


class Transfer(NamedTuple):
    """One modelled transfer, as its receiver booked it (``time.perf_counter()`` times).

    Kept as a plain tuple and named when read, as :class:`~.device.GangRecord` is."""

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
        #: (source device, destination device) -> bytes that arrived over a link
        self.pair_bytes: dict[tuple[int, int], int] = {}
        #: recent transfers that arrived here
        self.transfers: deque[tuple[Any, ...]] = deque(maxlen=log)  # Transfer fields
        self._infos: dict[int, DeviceInfo] = {}
        #: (sending, receiving device) -> (link class, link, sender's port, receiver's port)
        self._routes: dict[tuple[int, int], tuple[str, Link | None, Port | None, Port | None]] = {}

    def _info(self, device: int) -> DeviceInfo:
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

    def _route(self, src: int, dst: DeviceInfo) -> tuple[str, Link | None, Port | None, Port | None]:
        """How pieces go from device ``src`` to ``dst``, worked out once per pair (hold ``lock``)."""
        route = self._routes.get((src, dst.id))
        if route is None:
            source = self._info(src)
            cls = self.topology.link_class(source, dst)
            link = self.topology.link(cls)
            sending, receiving = SIDES.get(cls, (None, ""))
            route = self._routes[(src, dst.id)] = (
                cls, link, self._port(sending, source) if link and sending else None,
                self._port(receiving, dst) if link and receiving else None)
        return route

    def depart(self, src: DeviceInfo, dst: DeviceInfo, nbytes: int, start: float, scale: float = 1.0) -> float:
        """Book the sender's port for a piece sent at ``start``; returns when it may start to
        move (the stamp that travels with the piece)."""
        with self.lock:
            _, link, port, _ = self._route(src.id, dst)
            if link is None or port is None:
                return start
            return port.book(start, nbytes * scale / link.bandwidth, nbytes, scale)

    def arrival(self, src: int, dst: DeviceInfo, nbytes: int, ready: float, scale: float = 1.0) -> float:
        """Book the receiver's port for a piece that may start to move at ``ready``; returns
        when it is modelled to be in ``dst``'s memory."""
        with self.lock:
            cls, link, _, port = self._route(src, dst)
            if link is None or port is None:
                return ready
            seconds = nbytes * scale / link.bandwidth
            begin = port.book(ready, seconds, nbytes, scale)
            self.pair_bytes[(src, dst.id)] = self.pair_bytes.get((src, dst.id), 0) + nbytes
            end = begin + seconds + link.latency
            self.transfers.append((begin, end, src, dst.id, cls, nbytes))
        return end

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per link class, summed over the receiving ports of this host (what arrived here):
        bytes, modelled bytes, transfers, busy seconds, and the longest queue (transfers) and
        wait (seconds) any of those ports saw."""
        out = {c: Port().stats() for c in LINK_CLASSES}
        with self.lock:
            for (kind, _), port in self.ports.items():
                cls = RECEIVING.get(kind)
                if cls is None:
                    continue  # a sending port: its traffic is counted where it arrives
                add_stats(out[cls], port.stats())
        return out

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

    def recent(self) -> list[Transfer]:
        """The recent transfers that arrived here, oldest first."""
        with self.lock:
            return [Transfer._make(t) for t in self.transfers]

    def reset(self) -> None:
        """Forget the recent transfers (the port stats stay)."""
        with self.lock:
            self.transfers.clear()

