"""The island scheduler: one consistent, global order of programs.

Devices are single-threaded and a collective waits for every member of its
gang, so two gangs that share devices must run in the same relative order on
all of them. Every submitted program therefore gets a *slot* in one global
order; each host learns, per device, the programs in slot order and never
runs ahead of it. A :class:`Policy` only decides which waiting program gets
the next slot, and no policy slots a program before the programs that
produce its inputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar


@dataclass(frozen=True)
class Submission:
    """A program waiting for (or holding) a slot."""

    pid: str
    client: str
    hosts: dict[str, list[int]]  # worker address -> device ids the program uses there
    cost: float = 0.0  # estimated device-seconds, what proportional share charges
    deps: frozenset[str] = field(default_factory=frozenset)  # programs producing its inputs
    #: the hosts whose ending reports end it (``None``: every host; a fan-out tree's first host)
    ends: tuple[str, ...] | None = None
    #: a call's hosts as every call of its plan shares them (``core.meshes.Mesh``; ``None``: a graph's)
    mesh: Any = None

    @property
    def devices(self) -> list[int]:
        return [d for devs in self.hosts.values() for d in devs]


class Policy(ABC):
    """Chooses which waiting program gets the next slot.

    A policy plugs in by subclassing this and registering a ``name``;
    ``pathdask.policy`` in dask config picks one by name.
    """

    name: ClassVar[str]
    #: programs a device may have slotted and unfinished before the policy is asked
    #: again; ``None`` slots every program as soon as it arrives.
    window: ClassVar[int | None] = None

    @abstractmethod
    def push(self, sub: Submission, weight: float) -> None:
        """A new program of a client with this weight is waiting."""

    @abstractmethod
    def pop(self, eligible: Callable[[Submission], bool]) -> Submission | None:
        """The next program to slot among the eligible ones, or ``None``."""

    @abstractmethod
    def drop(self, which: Callable[[Submission], bool]) -> list[Submission]:
        """Forget the waiting programs ``which`` selects; returns them."""

    @abstractmethod
    def waiting(self) -> list[Submission]:
        """Every waiting program."""

    def __len__(self) -> int:
        return len(self.waiting())


class FIFO(Policy):
    """Programs in arrival order, each slotted as soon as it arrives."""

    name = "fifo"

    def __init__(self) -> None:
        self.queue: deque[Submission] = deque()

    def push(self, sub: Submission, weight: float) -> None:
        self.queue.append(sub)

    def pop(self, eligible: Callable[[Submission], bool]) -> Submission | None:
        for sub in self.queue:
            if eligible(sub):
                self.queue.remove(sub)
                return sub
        return None

    def drop(self, which: Callable[[Submission], bool]) -> list[Submission]:
        gone = [s for s in self.queue if which(s)]
        self.queue = deque(s for s in self.queue if not which(s))
        return gone

    def waiting(self) -> list[Submission]:
        return list(self.queue)


class ProportionalShare(Policy):
    """Device time shared between clients in proportion to their weights.

    Start-time fair queueing: each client has a virtual time that grows by a
    program's cost divided by the client's weight when it is slotted; the next
    slot goes to the eligible client with the smallest virtual time. A client
    that was idle starts from the current virtual time, so it cannot bank credit.
    Programs stay queued while their devices already hold ``window`` slotted,
    unfinished programs, so that the choice is made late enough to matter.
    """

    name = "proportional"
    window = 2

    def __init__(self) -> None:
        self.queues: dict[str, deque[Submission]] = {}
        self.weights: dict[str, float] = {}
        self.vtime: dict[str, float] = {}
        self.now = 0.0

    def push(self, sub: Submission, weight: float) -> None:
        q = self.queues.setdefault(sub.client, deque())
        if not q:
            self.vtime[sub.client] = max(self.vtime.get(sub.client, 0.0), self.now)
        self.weights[sub.client] = max(weight, 1e-9)
        q.append(sub)

    def pop(self, eligible: Callable[[Submission], bool]) -> Submission | None:
        # a client's own programs stay in order: only the head of each queue may go
        heads = [(self.vtime[c], c) for c, q in self.queues.items() if q and eligible(q[0])]
        if not heads:
            return None
        vt, client = min(heads)
        sub = self.queues[client].popleft()
        self.now = vt
        self.vtime[client] = vt + sub.cost / self.weights[client]
        return sub

    def drop(self, which: Callable[[Submission], bool]) -> list[Submission]:
        gone = []
        for client, q in self.queues.items():
            gone += [s for s in q if which(s)]
            self.queues[client] = deque(s for s in q if not which(s))
        return gone

    def waiting(self) -> list[Submission]:
        return [s for q in self.queues.values() for s in q]


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (FIFO, ProportionalShare)}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"Unknown scheduling policy {name!r}; the available policies are {sorted(POLICIES)}"
        ) from None


class IslandScheduler:
    """Slots programs in one global order, as the policy chooses, never before their inputs."""

    def __init__(self, policy: str = "fifo", on_end: Callable[[Submission], Any] | None = None) -> None:
        self.policy = make_policy(policy)
        #: called with each program that leaves: ended on its hosts, or dropped before its slot
        self.on_end = on_end or (lambda sub: None)
        self.next_slot = 0
        self.inflight: dict[str, Submission] = {}
        self.pending_hosts: dict[str, set[str]] = {}  # slotted program -> hosts still running it
        self.device_load: dict[int, int] = {}
        self.waiting: set[str] = set()
        self.done: dict[str, int] = {}  # client -> programs that ended on all their hosts
        #: programs slotted after their own submission (a policy's window was full): their
        #: orders go to their hosts apart from their calls
        self.late = 0

    def use(self, policy: str) -> None:
        """Choose slots by another policy from now on; only while no program waits for one
        (calibration measures two policies on one system)."""
        if len(self.policy):
            raise RuntimeError(f"{len(self.policy)} program(s) wait for a slot under {self.policy.name!r}; "
                               f"switch to {policy!r} once they are slotted")
        self.policy = make_policy(policy)

    def submit(self, sub: Submission, weight: float) -> list[tuple[int, Submission]]:
        """Take a submission; returns the (slot, submission) pairs that are now slotted."""
        self.waiting.add(sub.pid)
        self.policy.push(sub, weight)
        return self._fill(sub.pid)

    def _dropped(self, subs: list[Submission]) -> list[Submission]:
        """Waiting programs leave the queue, and with them, in turn, those waiting that read
        their outputs (none of which is slotted: see ``_eligible``); returns them all, the
        given ones first. A reader left waiting would be slotted next with no order of its
        producer before it, to read buffers that will never be computed."""
        gone, new = list(subs), list(subs)
        while new:
            new = self.policy.drop(partial(_reads, {s.pid for s in new}))
            gone += new
        for sub in gone:
            self.waiting.discard(sub.pid)
            self.on_end(sub)
        return gone

    def host_done(self, pid: str, host: str) -> list[tuple[int, Submission]]:
        """A host finished its part of ``pid``; returns newly slotted programs."""
        hosts = self.pending_hosts.get(pid)
        if hosts is None:
            return []
        hosts.discard(host)
        if hosts:
            return []
        return self.finish(pid)

    def finish(self, pid: str) -> list[tuple[int, Submission]]:
        """Slotted ``pid`` left the order (it ended on its hosts, or no ending will come);
        returns newly slotted programs."""
        self.pending_hosts.pop(pid, None)
        sub = self.inflight.pop(pid, None)
        if sub is None:
            return []
        self.done[sub.client] = self.done.get(sub.client, 0) + 1
        if self.policy.window is not None:
            for d in sub.devices:
                self.device_load[d] -= 1
        self.on_end(sub)
        return self._fill()

    def drop_client(self, client: str) -> list[tuple[int, Submission]]:
        """A client left: its waiting programs are forgotten, its slotted ones count as done."""
        self._dropped(self.policy.drop(lambda s: s.client == client))
        out = []
        for pid in [p for p, s in self.inflight.items() if s.client == client]:
            for host in list(self.pending_hosts.get(pid, ())):
                out += self.host_done(pid, host)
        self.done.pop(client, None)
        return out + self._fill()

    def host_lost(self, host: str) -> tuple[list[Submission], list[tuple[int, Submission]]]:
        """A host left: the waiting programs that use it are dropped (returned first); its
        part of slotted programs counts as done (newly slotted programs come second)."""
        dropped = self._dropped(self.policy.drop(lambda s: host in s.hosts))
        out = []
        for pid in [p for p, hosts in self.pending_hosts.items() if host in hosts]:
            out += self.host_done(pid, host)
        return dropped, out + self._fill()

    def fail(self, pid: str) -> list[Submission]:
        """``pid`` can no longer run (its dispatch failed): a slotted one stays until its hosts
        report that they popped it (returns it); a waiting one leaves the queue with the
        programs waiting that read its outputs (returns them, it first); none if it ended."""
        if pid in self.inflight:
            return [self.inflight[pid]]
        if pid not in self.waiting:
            return []
        self.waiting.discard(pid)
        return self._dropped(self.policy.drop(lambda s: s.pid == pid))

    def by_client(self) -> dict[str, dict[str, int]]:
        """Per client, programs waiting for a slot and slotted programs not yet done."""
        out: dict[str, dict[str, int]] = {}
        for sub in self.policy.waiting():
            out.setdefault(sub.client, {"waiting": 0, "slotted": 0})["waiting"] += 1
        for sub in self.inflight.values():
            out.setdefault(sub.client, {"waiting": 0, "slotted": 0})["slotted"] += 1
        return out

    def _eligible(self, sub: Submission) -> bool:
        if sub.deps & self.waiting:
            return False  # a producer of its inputs has no slot yet
        window = self.policy.window
        return window is None or all(self.device_load.get(d, 0) < window for d in sub.devices)

    def _fill(self, taking: str | None = None) -> list[tuple[int, Submission]]:
        """Slot what the policy chooses; ``taking``: the program being submitted (any other is late)."""
        out: list[tuple[int, Submission]] = []
        while True:
            sub = self.policy.pop(self._eligible)
            if sub is None:
                return out
            self.late += sub.pid != taking
            self.waiting.discard(sub.pid)
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            self.inflight[sub.pid] = sub
            self.pending_hosts[sub.pid] = set(sub.hosts if sub.ends is None else sub.ends)
            if self.policy.window is not None:  # only a window reads the load
                for d in sub.devices:
                    self.device_load[d] = self.device_load.get(d, 0) + 1
            out.append((slot, sub))

    def info(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "slotted": self.next_slot, "late": self.late,
                "waiting": len(self.policy), "inflight": len(self.inflight)}


def _reads(pids: set[str], sub: Submission) -> bool:
    """Whether ``sub`` reads outputs of any of ``pids``."""
    return not pids.isdisjoint(sub.deps)
