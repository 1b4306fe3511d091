"""Property test of the invariant: every slotted program ends on every member host, and no
device stays blocked, over random interleavings of every message, in one process.

The island scheduler and each host's ledger are the real ones
(``pathdask.scheduler.order``, ``pathdask.worker.ledger``); around them, the
messages between the scheduler, the hosts and the dispatch tasks travel on
channels that Hypothesis interleaves as it likes (each channel in order, as a
TCP stream is), and devices are modelled as gangs that meet: a device running a
program finishes it only once every member device runs it too, or it is dropped.
The host side follows ``HostRuntime``: ``on_order``, ``dispatch``,
``drop_program``, ``drop_client`` and ``device_done``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pathdask.scheduler.order import IslandScheduler, Submission
from pathdask.worker.ledger import HostProgram, Ledger
from pathdask.worker.transfer import Mailbox

HOSTS, DEVICES_PER_HOST = 3, 2


@dataclass
class Host:
    name: str
    devices: list[int]
    ledger: Ledger = field(default_factory=Ledger)
    order: dict[int, deque[str]] = field(default_factory=dict)
    running: dict[int, str | None] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)  # reports to the scheduler, in order

    def __post_init__(self) -> None:
        self.order = {d: deque() for d in self.devices}
        self.running = dict.fromkeys(self.devices)

    # what HostRuntime does on each message
    def on_order(self, pid: str, client: str, devices: list[int]) -> None:
        if not self.ledger.slot(pid, client, devices):
            self.ended.append(pid)
            return
        for d in devices:
            self.order[d].append(pid)

    def dispatch(self, pid: str, client: str) -> None:
        if self.ledger.refused(pid, client) is None:
            self.ledger.register(HostProgram(pid, None, (), client, Mailbox()))  # type: ignore[arg-type]

    def drop(self, pid: str) -> None:
        self.ledger.drop(pid, RuntimeError("dropped"))

    def drop_client(self, client: str) -> None:
        for pid in self.ledger.close_client(client, RuntimeError("closed")):
            self.drop(pid)

    def device_done(self, pid: str, device: int) -> None:
        if self.ledger.device_done(pid, device):
            self.ended.append(pid)


@dataclass
class World:
    scheduler: IslandScheduler
    hosts: dict[str, Host]
    subs: dict[str, Submission] = field(default_factory=dict)
    #: one ordered channel per (sender, receiver), as the TCP streams are
    channels: dict[tuple[str, str], deque[tuple[Any, ...]]] = field(default_factory=dict)
    failing: set[tuple[str, str]] = field(default_factory=set)  # (pid, host) whose dispatch fails
    closed: set[str] = field(default_factory=set)

    def send(self, src: str, dst: str, msg: tuple[Any, ...]) -> None:
        self.channels.setdefault((src, dst), deque()).append(msg)

    def orders(self, slotted: list[tuple[int, Submission]]) -> None:
        for _, sub in slotted:
            for addr, devices in sub.hosts.items():
                self.send("scheduler", addr, ("order", sub.pid, sub.client, devices))

    def submit(self, sub: Submission) -> None:
        self.subs[sub.pid] = sub
        for addr in sub.hosts:  # the dispatch comes whenever (a graph's tasks run when Dask runs them)
            self.send(f"dask-{sub.pid}", addr, ("dispatch", sub.pid, sub.client))
        self.orders(self.scheduler.submit(sub, 1.0))

    def close_client(self, client: str) -> None:
        self.closed.add(client)
        self.orders(self.scheduler.drop_client(client))
        for addr in self.hosts:
            self.send("scheduler", addr, ("drop-client", client))

    def deliver(self, channel: tuple[str, str]) -> None:
        msg = self.channels[channel].popleft()
        kind, dst = msg[0], channel[1]
        if kind == "done":
            self.orders(self.scheduler.host_done(msg[1], msg[2]))
            return
        host = self.hosts[dst]
        if kind == "order":
            host.on_order(*msg[1:])
        elif kind == "drop-client":
            host.drop_client(msg[1])
        elif kind == "drop":
            host.drop(msg[1])
        elif kind == "dispatch":
            pid, client = msg[1:]
            if (pid, dst) in self.failing:  # the task errs: this host drops it, the scheduler all hosts
                host.drop(pid)
                sub = self.scheduler.fail(pid)
                for addr in (sub.hosts if sub else ()):
                    self.send("scheduler", addr, ("drop", pid))
            elif client not in self.closed:  # Dask forgets a closed client's tasks
                host.dispatch(pid, client)
        self._report(host)

    def _report(self, host: Host) -> None:
        while host.ended:
            self.send(host.name, "scheduler", ("done", host.ended.pop(0), host.name))

    def step_devices(self) -> bool:
        """Let every device that can move, move once; ``True`` if any did."""
        moved = False
        for host in self.hosts.values():
            for d in host.devices:
                pid = host.running[d]
                if pid is None:
                    if host.order[d] and host.ledger.ready(host.order[d][0]):
                        host.running[d] = host.order[d].popleft()
                        moved = True
                    continue
                if host.ledger.get(pid) is None or host.ledger.dropped(pid) is not None or self._gang_met(pid):
                    host.running[d] = None  # ran, or skipped/aborted a dropped program
                    host.device_done(pid, d)
                    self._report(host)
                    moved = True
        return moved

    def _gang_met(self, pid: str) -> bool:
        """Every member device runs ``pid`` or has finished it (a collective completes)."""
        sub = self.subs[pid]
        for addr, devices in sub.hosts.items():
            host = self.hosts[addr]
            for d in devices:
                if host.running[d] != pid and pid in host.order[d]:
                    return False
        return True


@st.composite
def scenarios(draw: Any) -> tuple[str, list[Submission], set[tuple[str, str]], dict[int, str]]:
    policy = draw(st.sampled_from(["fifo", "proportional"]))
    hosts = [f"h{i}" for i in range(HOSTS)]
    subs = []
    for i in range(draw(st.integers(1, 8))):
        used = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=HOSTS, unique=True))
        placement = {}
        for addr in used:
            base = hosts.index(addr) * DEVICES_PER_HOST
            placement[addr] = draw(st.lists(st.sampled_from(range(base, base + DEVICES_PER_HOST)),
                                            min_size=1, max_size=DEVICES_PER_HOST, unique=True))
        client = draw(st.sampled_from(["a", "b", "c"]))
        subs.append(Submission(f"p{i}", client, placement, cost=1.0))
    failing = {(s.pid, addr) for s in subs for addr in s.hosts if draw(st.integers(0, 9)) == 0}
    closes = draw(st.dictionaries(st.integers(0, 40), st.sampled_from(["a", "b", "c"]), max_size=2))
    return policy, subs, failing, closes


@settings(max_examples=300, deadline=None)
@given(scenario=scenarios(), choices=st.randoms(use_true_random=False))
def test_every_slotted_program_ends_on_every_host(scenario, choices):
    policy, subs, failing, closes = scenario
    world = World(IslandScheduler(policy),
                  {f"h{i}": Host(f"h{i}", list(range(i * DEVICES_PER_HOST, (i + 1) * DEVICES_PER_HOST)))
                   for i in range(HOSTS)}, failing=failing)
    pending = list(subs)
    for tick in range(10_000):
        if tick in closes and closes[tick] not in world.closed:
            world.close_client(closes[tick])
        live = [c for c, q in world.channels.items() if q]
        options = len(live) + bool(pending) + 1
        pick = choices.randrange(options)
        if pick < len(live):
            world.deliver(live[pick])
        elif pick == len(live) and pending:
            world.submit(pending.pop(0))
        elif not world.step_devices() and not live and not pending:
            break
    # drain: whatever is left is delivered and run until nothing moves
    while True:
        live = [c for c, q in world.channels.items() if q]
        for c in live:
            world.deliver(c)
        if not world.step_devices() and not live:
            break
    for host in world.hosts.values():
        assert host.ledger.idle(), (host.name, host.ledger.pids())
        assert not any(host.order.values()), (host.name, host.order)
        assert not any(host.running.values()), "a device stays blocked"
    assert not world.scheduler.inflight and not world.scheduler.pending_hosts
    assert len(world.scheduler.policy) == 0
