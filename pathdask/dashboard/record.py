"""``ActivityRecord``: the scheduler's bounded memory of what the devices did.

It is fed by :class:`~pathdask.dashboard.collect.Collector` from the hosts'
replies and read by the dashboard's pages, its JSON API and traces. It lives
on the scheduler's event loop and has no lock: only that loop touches it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..core.bounded import newest
from ..topology import LINK_CLASSES

#: the fields of one recorded gang, in order (times are wall-clock seconds)
COLUMNS = ("device", "start", "end", "program", "gang", "client", "bytes_in", "bytes_out", "name")

Gang = tuple[int, float, float, str, str, str, int, int, str]


class ActivityRecord:
    """The newest ``max_gangs`` gangs of every device, memory and link snapshots.

    Parameters
    ----------
    max_gangs : int
        Gangs kept, all devices together; older ones drop out first.
    max_samples : int
        Link-byte samples kept (one per pull), for throughput over time.
    """

    def __init__(self, max_gangs: int = 20000, max_samples: int = 1200) -> None:
        self.gangs: deque[Gang] = deque(maxlen=max_gangs)
        self.total = 0  # gangs ever recorded: a reader's cursor into ``gangs``
        #: host address -> device -> gangs of that device read so far (what to ask for next)
        self.cursors: dict[str, dict[int, int]] = {}
        self.memory: dict[int, dict[str, Any]] = {}  # device -> its store's stats
        self.hosts: dict[int, str] = {}  # device -> address of the host that reported it
        #: (time, bytes moved so far per link class), one per pull
        self.links: deque[tuple[float, dict[str, int]]] = deque(maxlen=max_samples)
        self.pairs: dict[tuple[int, int], int] = {}  # (source, destination device) -> bytes
        self.names: dict[str, str] = {}  # client id -> name, of every client seen, in order
        self.updated: float | None = None  # time.time() of the last pull
        #: bumped by a pull that brought anything new (gangs, memory, link bytes): pages
        #: that see the same version have nothing to redraw
        self.version = 0

    # -- writing ---------------------------------------------------------------
    def cursor_message(self) -> dict[str, list[tuple[int, int]]]:
        """What to ask each host for: its devices' counts read so far."""
        return {addr: list(devs.items()) for addr, devs in self.cursors.items()}

    def add(self, replies: dict[str, Any], now: float | None = None) -> int:
        """Merge the hosts' ``pathdask_activity`` replies; returns the number of new gangs."""
        now = time.time() if now is None else now
        before = self.total
        links = dict.fromkeys(LINK_CLASSES, 0)
        memory = {d: dict(m) for d, m in self.memory.items()}  # to tell whether anything changed
        live: set[int] = set()
        for addr, reply in replies.items():
            if not isinstance(reply, dict) or "devices" not in reply:
                continue  # a host that left meanwhile
            cursors = self.cursors.setdefault(addr, {})
            for d, entry in reply["devices"].items():
                d = int(d)
                cursors[d] = int(entry["count"])
                for g in entry["gangs"]:
                    self.gangs.append((d, *g))  # type: ignore[arg-type]
                self.total += len(entry["gangs"])
            for d, m in reply["memory"].items():
                self.memory[int(d)] = m
                self.hosts[int(d)] = addr
                live.add(int(d))
            for cls, v in reply["links"].items():
                links[cls] = links.get(cls, 0) + int(v["bytes"])
            for src, dst, n in reply["pairs"]:
                self.pairs[(int(src), int(dst))] = int(n)
        for d in set(self.memory) - live:  # its host left: it holds nothing any more
            del self.memory[d]
            self.hosts.pop(d, None)
        for addr in set(self.cursors) - set(replies):
            del self.cursors[addr]
        if self.total != before or not self.links or self.links[-1][1] != links or memory != self.memory:
            self.version += 1
        self.links.append((now, links))
        self.updated = now
        return self.total - before

    def name_client(self, client: str, name: str) -> None:
        """Remember a client's name (it outlives the client, as its gangs do)."""
        self.names.setdefault(client, name)

    def clear(self) -> None:
        """Forget the recorded gangs and link samples (cursors stay: old gangs are not read again)."""
        self.gangs.clear()
        self.links.clear()
        self.pairs.clear()
        self.version += 1

    # -- reading ---------------------------------------------------------------
    def after(self, cursor: int) -> tuple[list[Gang], int]:
        """Gangs recorded after a reader's ``cursor`` (a previous ``total``), and the new cursor."""
        return newest(self.gangs, self.total, cursor), self.total

    def since(self, start: float) -> list[Gang]:
        """Gangs that ended at or after wall-clock time ``start``."""
        return [g for g in self.gangs if g[2] >= start]

    def name(self, client: str) -> str:
        return self.names.get(client, client)

    def devices(self) -> list[int]:
        """Every device that reported or ran a gang, in order."""
        return sorted(set(self.memory) | {g[0] for g in self.gangs})


def columns(gangs: list[Gang]) -> dict[str, list[Any]]:
    """Gangs as columns named by :data:`COLUMNS` (what the API and the plots take)."""
    if not gangs:
        return {c: [] for c in COLUMNS}
    return {c: list(v) for c, v in zip(COLUMNS, zip(*gangs))}
