"""Property test of the invariants on the real cores: Hypothesis drives the scheduler's and the
hosts' state machines (``pathdask.core.island.SchedulerCore``, ``pathdask.core.host.HostCore``)
through adversarial interleavings of every message, in one process.

The records between the client, the scheduler and the hosts travel on one ordered channel per
(sender, receiver), as Dask's streams do; Hypothesis picks which channel delivers next. Around
the cores there is only what is not theirs: devices, modelled as gangs that meet (a device
running a program pops it once every member device runs it, or at once if it was dropped),
which are threads and so may move between any two instructions a host carries out; a store
that counts the reads and owners the cores declare and knows which buffers are settled; and a
client that calls, releases its results, and closes or is killed. Late and duplicate plans,
calls whose argument keys are released, closed clients, hosts lost mid-program, failing
dispatches, plans that never came (a restarted host: the real ``PlanMissingError`` path), both
policies, and readers on their producers' devices with the hosts in another order (another
tree) are drawn.

The invariants (``ARCHITECTURE.md``): one order per island (every pair of programs two devices
share runs in the same relative order on both), every slotted program ends on every member host,
no buffer is leaked (every read declared is read or withdrawn, every owner released), and no
program reads a buffer still pending (its producer ran on that device first, or its buffers
failed there).
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pathdask.core import host as H
from pathdask.core.island import FailKeys, Forward, Progress, SchedulerCore, Send, SendAll
from pathdask.errors import DispatchError
from pathdask.ops import GangSpec, HostPlan, KernelOp, OutSpec, Ref
from pathdask.protocol import Dispatch, DispatchFailed, Fan, Message, ProgramDone, Released
from pathdask.topology import DeviceId, DeviceInfo

HOSTS, PER_HOST = 3, 2
CLIENTS = ("a", "b", "c")


class NoAborts:
    def check(self, pid: str, gang: int) -> BaseException | None:
        return None


@dataclass
class Program:
    pid: str
    client: str
    placement: dict[str, list[int]]
    dep: str | None  # the program whose output it reads (same placement), if any


def _plan(prog: Program, addr: str) -> HostPlan:
    members = tuple(DeviceInfo(DeviceId(d), 0, int(a[1:]), d % PER_HOST, a)
                    for a, devs in prog.placement.items() for d in devs)
    reads = (Ref("in", 0),) if prog.dep else ()
    ops = {d: (KernelOp(0, i, reads, (OutSpec(1, (1,), "f8"),)),) for i, d in enumerate(prog.placement[addr])}
    return HostPlan(prog.pid, {0: GangSpec(0, "g", members)}, ops,
                    {0: tuple((1, d) for d in prog.placement[addr])}, id=f"plan-{prog.pid}")


@dataclass
class World:
    scheduler: SchedulerCore
    hosts: dict[str, H.HostCore]
    failing: set[tuple[str, str]]
    #: (program, host) whose plan never reached the host (it restarted): its dispatch fails there
    unplanned: set[tuple[str, str]] = field(default_factory=set)
    channels: dict[tuple[str, str], deque[Any]] = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    order: dict[int, deque[str]] = field(default_factory=lambda: defaultdict(deque))
    running: dict[int, str | None] = field(default_factory=dict)
    popped: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    store: dict[tuple[Any, int], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    keys: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # client -> live keys
    closed: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    slotted: set[str] = field(default_factory=set)
    ended: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: (buffer key, device) its producer's device settled (it ran there: computed, or failed as
    #: its gang aborted), and host -> programs whose buffers failed there (``DropBuffers``
    #: carried out): a program's reads must find one or the other
    settled: set[tuple[Any, int]] = field(default_factory=set)
    failed: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: devices are threads: with this, they may move between any two instructions of an event
    chance: Any = None
    #: endings a device reported, for the host's event loop to take up after the event
    endings: list[tuple[str, str]] = field(default_factory=list)
    depth: int = 0
    moving: bool = False

    def send(self, src: str, dst: str, msg: Any) -> None:
        if dst not in self.lost:
            self.channels.setdefault((src, dst), deque()).append(msg)

    # -- the scheduler adapter's part, as PathwaysScheduler.apply does it ------------------
    def run_scheduler(self, out: list[Any]) -> None:
        batch: dict[str, list[Any]] = defaultdict(list)
        self._scheduler(out, batch)
        assert not batch

    def _scheduler(self, out: list[Any], batch: dict[str, list[Any]]) -> None:
        for ins in out:
            if isinstance(ins, Send):
                if ins.msg.kind == "order":
                    self.slotted.update(p for p, *_ in ins.msg.programs)
                if isinstance(ins.msg, Fan) and ins.msg.order is not None:
                    self.slotted.add(ins.msg.order[0])
                self.send("scheduler", ins.host, ins.msg)
            elif isinstance(ins, SendAll):
                for addr in self.scheduler.hosts - {ins.but}:
                    self.send("scheduler", addr, ins.msg)
            elif isinstance(ins, Forward):
                batch[ins.host].append(ins.entry)
            elif isinstance(ins, FailKeys):
                self.keys[ins.client] = [k for k in self.keys[ins.client] if k not in ins.keys]
            else:
                assert isinstance(ins, Progress), ins

    def forget(self, keys: list[str], owner_left: bool = False) -> None:
        """Dask forgot these keys (released, their client closed, or their host left)."""
        for key in keys:
            self.run_scheduler(self.scheduler.key_forgotten(key, owner_left))

    # -- the host adapter's part, as HostRuntime.apply does it -------------------------------
    def run_host(self, addr: str, out: list[Any]) -> None:
        self.depth += 1
        try:
            for ins in out:
                self._may_move()
                self._carry_out(addr, ins)
            self._may_move()
        finally:
            self.depth -= 1
        while not self.depth and self.endings:  # the event loop takes up the endings after the event
            host, pid = self.endings.pop(0)
            self.run_host(host, self.hosts[host].ended(pid))

    def _may_move(self) -> None:
        """A device thread may take the GIL here: it sees every change the core made, and only
        the instructions carried out so far."""
        if self.chance is not None and not self.moving and self.chance.random() < 0.25:
            self.moving = True
            try:
                while self.step_devices():  # a device that took the GIL goes as far as it can
                    pass
            finally:
                self.moving = False

    def _carry_out(self, addr: str, ins: Any) -> None:
        if isinstance(ins, H.Enqueue):
            self.order[ins.device].append(ins.pid)
        elif isinstance(ins, H.Declare):
            self.store[(ins.key, ins.device)][0] += ins.consumers
            self.store[(ins.key, ins.device)][1] += ins.owned
        elif isinstance(ins, H.Release):
            entry = self.store[(ins.key, ins.device)]
            if ins.consumers:
                entry[0] -= ins.consumers
            else:
                entry[1] -= 1
            assert entry[0] >= 0 and entry[1] >= 0, (ins, entry)
        elif isinstance(ins, H.DropBuffers):  # as HostRuntime: the store fails them, then the ledger lets devices pass
            self.failed[addr].add(ins.pid)
            self.hosts[addr].ledger.buffers_failed(ins.pid)
        elif isinstance(ins, H.Ended):
            self.ended[ins.pid].add(addr)
            self.endings.append((addr, ins.pid))
        elif isinstance(ins, H.Tell):
            self.send(addr, "scheduler", ins.msg)
        elif isinstance(ins, H.Relay):  # a fan-out tree's record, host to host
            self.send(addr, ins.host, ins.msg)
        elif isinstance(ins, H.Register):  # the ledger learns it only after its counts
            assert core_counts_declared(self.store, ins.prog), ins
            self.run_host(addr, self.hosts[addr].register(ins.prog, ins.enqueue))
        elif isinstance(ins, H.Raise):
            raise ins.error
        else:
            assert isinstance(ins, (H.PutHandles, H.Wake, H.MarkLost, H.MarkJoined)), ins

    # -- the client --------------------------------------------------------------------------
    def call(self, prog: Program) -> None:
        self.programs[prog.pid] = prog
        for addr in prog.placement:  # plans go ahead of their call, and may go twice
            if addr not in self.lost and (prog.pid, addr) not in self.unplanned:
                self.hosts[addr].add_plans(prog.client, [_plan(prog, addr)])
        owner = next(iter(prog.placement))  # one key per output, on its first host
        key = f"{prog.pid}-out-{owner}"
        self.keys[prog.client].append(key)
        call = {"pid": prog.pid, "hosts": list(prog.placement),
                "plan": f"plan-{prog.pid}", "owned": [(0, [(key, 0)])],
                "outputs": [(key, 0, owner)],
                "inputs": [[prog.dep, 1]] if prog.dep else [],
                "program": {"pid": prog.pid, "hosts": prog.placement, "cost": 1.0}}
        self.send(prog.client, "scheduler", call)

    def close(self, client: str) -> None:
        self.closed.add(client)
        self.run_scheduler(self.scheduler.client_closed(client))
        keys, self.keys[client] = self.keys[client], []
        self.forget(keys)

    def lose(self, addr: str) -> None:
        self.lost.add(addr)
        for d in self._devices(addr):
            self.order[d].clear()
            self.running[d] = None
        self.channels = {c: q for c, q in self.channels.items() if addr not in c}
        self.forget([k for ks in self.keys.values() for k in ks if k.endswith(f"-out-{addr}")], owner_left=True)
        self.run_scheduler(self.scheduler.host_lost(addr, "test"))

    # -- delivery ----------------------------------------------------------------------------
    def deliver(self, channel: tuple[str, str]) -> None:
        msg = self.channels[channel].popleft()
        src, dst = channel
        if dst == "scheduler":
            if src in CLIENTS and isinstance(msg, tuple):  # a release, after the calls before it
                self.forget(list(msg))
                self.run_scheduler(self.scheduler.keys_released(list(msg)))
            elif src in CLIENTS:
                self._take_call(src, msg)
            elif isinstance(msg, ProgramDone):
                self.run_scheduler(self.scheduler.program_done(src, msg.pid))
            elif isinstance(msg, Released):
                self.scheduler.released_on_tree(msg.id)
            else:
                assert isinstance(msg, DispatchFailed), msg
                self.run_scheduler(self.scheduler.dispatch_failed(src, msg.pid, msg.error, msg.cause))
            return
        core = self.hosts[dst]
        if isinstance(msg, Fan) and msg.call is not None and (msg.call[1], dst) in self.failing:
            pid, error = msg.call[1], DispatchError("injected")
            core.calls = lambda *_: [*core.drop_program(pid, error),  # type: ignore[method-assign]
                                     H.Tell(DispatchFailed(pid, "injected", error))]
            try:
                self.run_host(dst, core.fan(msg))
            finally:
                del core.calls
            return
        if isinstance(msg, Dispatch):
            for entry in msg.calls:
                if (entry[0], dst) in self.failing:  # this host's dispatch fails, as a bad plan would
                    error = DispatchError("injected")
                    self.run_host(dst, [*core.drop_program(entry[0], error),
                                        H.Tell(DispatchFailed(entry[0], "injected", error))])
                else:
                    self.run_host(dst, core.calls(msg.client, [entry]))
            return
        assert isinstance(msg, Message), msg
        self.run_host(dst, core.handle(msg))

    def _take_call(self, client: str, call: dict[str, Any]) -> None:
        if client in self.closed:
            return  # Dask drops a closed client's stream
        batch: dict[str, list[Any]] = defaultdict(list)
        try:
            self.scheduler.check_call(call, set(self.hosts) - self.lost)
        except Exception as e:  # noqa: BLE001
            self._scheduler(self.scheduler.call_failed(client, call, e), batch)
        else:
            self._scheduler(self.scheduler.take_call(client, call), batch)
        for addr, calls in batch.items():
            self.send("scheduler", addr, Dispatch(client, calls))

    def step_devices(self) -> bool:
        moved = False
        for addr, core in self.hosts.items():
            if addr in self.lost:
                continue
            for d in self._devices(addr):
                pid = self.running.get(d)
                if pid is None:
                    if self.order[d] and core.ledger.ready(self.order[d][0]):
                        self.running[d] = self._take(addr, d, self.order[d].popleft())
                        moved = True
                    continue
                prog = core.ledger.get(pid)
                if prog is None or core.ledger.dropped(pid) is not None or self._met(pid):
                    self.running[d] = None
                    self.popped[d].append(pid)
                    if prog is not None:
                        self.settled.add(((pid, 1), d))
                    if prog is not None and prog.plan.ops.get(d):  # its reads are counted on every path
                        for op in prog.plan.ops[d]:
                            for ref in op.inputs:
                                self.store[(prog.resolve(ref), d)][0] -= 1
                    self.run_host(addr, core.device_done(pid, d))
                    moved = True
        return moved

    def _take(self, addr: str, device: int, pid: str) -> str:
        """``device`` takes ``pid`` to run it: a program that will run reads its inputs now, and
        each must be settled there (never pending: that is a wrong result)."""
        core = self.hosts[addr]
        prog = core.ledger.get(pid)
        if prog is not None and core.ledger.dropped(pid) is None:
            for op in prog.plan.ops.get(device, ()):
                for ref in op.inputs:
                    key = prog.resolve(ref)
                    assert (key, device) in self.settled or key[0] in self.failed[addr], \
                        (pid, "read a pending buffer", key, device)
        return pid

    def _met(self, pid: str) -> bool:
        prog = self.programs[pid]
        return all(self.running.get(d) == pid or pid not in self.order[d]
                   for addr, devs in prog.placement.items() if addr not in self.lost for d in devs)

    @staticmethod
    def _devices(addr: str) -> range:
        i = int(addr[1:])
        return range(i * PER_HOST, (i + 1) * PER_HOST)


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    hosts = [f"h{i}" for i in range(HOSTS)]
    programs: list[Program] = []
    for i in range(draw(st.integers(1, 8))):
        earlier = draw(st.sampled_from([None, *programs]))
        if earlier is not None and draw(st.booleans()):  # an earlier program's devices (one may read
            # the other's outputs), its hosts in another order: their trees have other roots
            order = draw(st.permutations(list(earlier.placement)))
            placement = {a: earlier.placement[a] for a in order}
        else:
            used = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=HOSTS, unique=True))
            placement = {a: draw(st.lists(st.sampled_from(list(World._devices(a))), min_size=1,
                                          max_size=PER_HOST, unique=True)) for a in used}
        client = draw(st.sampled_from(CLIENTS))
        same = [p for p in programs if p.placement == placement and p.client == client]
        dep = draw(st.sampled_from([None] + [p.pid for p in same]))
        programs.append(Program(f"p{i}", client, placement, dep))
    return {
        "policy": draw(st.sampled_from(["fifo", "proportional"])),
        # fan-out trees for programs on more than ``threshold`` hosts (8: never)
        "threshold": draw(st.sampled_from([1, 2, 8])),
        "degree": draw(st.sampled_from([1, 2])),
        "programs": programs,
        "failing": {(p.pid, a) for p in programs for a in p.placement if draw(st.integers(0, 9)) == 0},
        "unplanned": {(p.pid, a) for p in programs for a in p.placement if draw(st.integers(0, 14)) == 0},
        "closes": draw(st.dictionaries(st.integers(0, 60), st.sampled_from(CLIENTS), max_size=2)),
        "releases": draw(st.dictionaries(st.integers(0, 60), st.sampled_from(CLIENTS), max_size=3)),
        "loses": draw(st.dictionaries(st.integers(0, 60), st.sampled_from(hosts), max_size=1)),
    }


@settings(max_examples=int(os.environ.get("PATHDASK_EXAMPLES", 300)), deadline=None, print_blob=True)
@given(s=scenarios(), choices=st.randoms(use_true_random=False))
def test_every_slotted_program_ends_on_every_host_in_one_order_leaking_nothing(s, choices):
    world = World(SchedulerCore(s["policy"], degree=s["degree"], threshold=s["threshold"]),
                  {f"h{i}": H.HostCore(f"h{i}", World._devices(f"h{i}"), NoAborts()) for i in range(HOSTS)},
                  s["failing"], s["unplanned"], chance=choices)
    for addr in world.hosts:
        world.run_scheduler(world.scheduler.host_joined(addr, None))
    for c in CLIENTS:
        world.scheduler.client_joined(c, {"a": 1.0, "b": 2.0, "c": 4.0}[c])
    pending = [p for p in s["programs"]]
    for tick in range(10_000):
        if tick in s["closes"] and s["closes"][tick] not in world.closed:
            world.close(s["closes"][tick])
        if tick in s["releases"]:  # the client lets go of its oldest result, read or not
            keys = world.keys[s["releases"][tick]]
            if keys:  # on the client's stream, as Dask's release goes
                world.send(s["releases"][tick], "scheduler", (keys.pop(0),))
        if tick in s["loses"] and s["loses"][tick] not in world.lost and len(world.lost) < HOSTS - 1:
            world.lose(s["loses"][tick])
        live = [c for c, q in world.channels.items() if q]
        pick = choices.randrange(len(live) + bool(pending) + 1)
        if pick < len(live):
            world.deliver(live[pick])
        elif pick == len(live) and pending:
            prog = pending.pop(0)
            if prog.client not in world.closed:
                world.call(prog)
        elif not world.step_devices() and not live and not pending:
            break
    while True:  # drain: deliver and run until nothing moves
        live = [c for c, q in world.channels.items() if q]
        for c in live:
            world.deliver(c)
        if not world.step_devices() and not live:
            break
    for c in CLIENTS:  # the clients let go of what they hold
        world.close(c) if c not in world.closed else None
    while any(world.channels.values()):
        for c in [c for c, q in world.channels.items() if q]:
            world.deliver(c)

    # every slotted program ended on every member host that stayed
    for pid in world.slotted:
        members = set(world.programs[pid].placement) - world.lost
        assert members <= world.ended[pid], (pid, members, world.ended[pid])
    for addr, core in world.hosts.items():
        if addr not in world.lost:
            assert core.ledger.idle(), (addr, core.ledger.pids())
            assert not core.owned, (addr, core.owned)
            assert not core.early_orders, (addr, core.early_orders)
            assert not core.endings.waiting, (addr, core.endings.waiting)
    assert not world.scheduler.order.inflight and len(world.scheduler.order.policy) == 0
    sched = world.scheduler
    assert not (sched.readers or sched.orphans or sched.output_owners
                or sched.releasing or sched.chains), vars(sched)
    assert not any(world.order[d] for d in world.order) and not any(world.running.values())
    # one order: two devices that both ran two programs ran them in the same relative order
    rank = {d: {p: i for i, p in enumerate(seq)} for d, seq in world.popped.items()}
    for d1 in rank:
        for d2 in rank:
            shared = sorted(set(rank[d1]) & set(rank[d2]), key=rank[d1].__getitem__)
            assert shared == sorted(shared, key=rank[d2].__getitem__), (d1, d2, world.popped)
    # no buffer leaked on a host that stayed: every read declared was read or withdrawn, every owner let go
    leaked = {k: v for k, v in world.store.items() if v != [0, 0] and not _on_lost(k, world)}
    assert not leaked, leaked


def core_counts_declared(store: dict[tuple[Any, int], list[int]], prog: Any) -> bool:
    """Every read of ``prog``'s ops is counted in the store before devices may see it."""
    return all(store[(prog.resolve(ref), d)][0] > 0 for d, ops in prog.plan.ops.items()
               for op in ops for ref in op.inputs)


def _on_lost(entry: tuple[Any, int], world: World) -> bool:
    return f"h{entry[1] // PER_HOST}" in world.lost


def test_a_program_dropped_before_its_slot_withdraws_every_read_it_declared():
    """The path random interleavings reach rarely: a call registered on a host whose order has not
    come (its program waits for a slot under proportional share) and then dropped with its client."""
    core = H.HostCore("h0", World._devices("h0"), NoAborts())
    producer = Program("p0", "a", {"h0": [0, 1]}, None)
    reader = Program("p1", "a", {"h0": [0, 1]}, "p0")
    core.add_plans("a", [_plan(producer, "h0"), _plan(reader, "h0")])
    out = core.calls("a", [("p1", "plan-p1", [["p0", 1]], [("p1-out-h0", 0)])])
    declared = sorted((i.key, i.device) for i in out if isinstance(i, H.Declare) and i.consumers)
    assert declared == [(("p0", 1), 0), (("p0", 1), 1)]
    *registered, put = out
    assert isinstance(put, H.PutHandles) and ("p1-out-h0",) == tuple(put.data)  # after the registration
    assert isinstance(registered[-1], H.Register)  # the ledger learns of it only after the counts
    # not ordered here: nothing may run it yet
    assert core.register(registered[-1].prog, registered[-1].enqueue) == [H.Wake((0, 1))]
    dropped = core.drop_client("a")
    withdrawn = sorted((i.key, i.device) for i in dropped if isinstance(i, H.Release) and i.consumers)
    assert withdrawn == declared
    assert core.order([("p1", "a", [0, 1], 0, -1)]) == [H.Ended("p1")]  # its late order ends it at once
    assert core.ledger.idle()


def test_a_program_a_host_ran_alone_ends_there_without_telling_the_scheduler():
    """A multi-controller's program (``run_alone``: the host registered it itself) ends on its host
    and no scheduler is told, as none knows it; a program the scheduler sent is told."""
    core = H.HostCore("h0", World._devices("h0"), NoAborts())
    alone, sent = Program("m0", "mc", {"h0": [0, 1]}, None), Program("p0", "a", {"h0": [0, 1]}, None)
    core.add_plans("a", [_plan(sent, "h0")])
    [register] = [i for i in core.run_alone("m0", _plan(alone, "h0"), (), "mc") if isinstance(i, H.Register)]
    assert core.register(register.prog, register.enqueue) == [H.Enqueue(0, "m0", True), H.Enqueue(1, "m0", True)]
    assert core.device_done("m0", 0) == [] and core.device_done("m0", 1) == [H.Ended("m0")]
    assert core.ended("m0") == [] and not core.own
    assert core.order([("p0", "a", [0, 1], 0, -1)]) == [H.Enqueue(0, "p0"), H.Enqueue(1, "p0")]
    [register] = [i for i in core.calls("a", [("p0", "plan-p0", [], [])]) if isinstance(i, H.Register)]
    assert core.register(register.prog, register.enqueue) == [H.Wake((0, 1), True)]  # ordered: it may run
    assert core.device_done("p0", 0) == [] and core.device_done("p0", 1) == [H.Ended("p0")]
    assert core.ended("p0") == [H.Tell(ProgramDone("p0"))]


def test_a_failed_dispatch_lets_devices_pass_its_program_only_once_its_buffers_failed():
    """A reader's call and order came first (its tree's root is this host); its producer's order
    and call come later, down another tree, and the call fails here. The order slots the
    producer and then the reader, which may run at once: the devices must not pass the
    producer before the store failed its buffers, or the reader reads one pending."""
    core = H.HostCore("h0", World._devices("h0"), NoAborts())
    placement = {"h1": [2], "h0": [0, 1]}
    producer, reader = Program("p0", "a", placement, None), Program("p1", "a", placement, "p0")
    core.add_plans("a", [_plan(producer, "h0"), _plan(reader, "h0")])
    declared = core.calls("a", [("p1", "plan-p1", [["p0", 1]], [])])
    [register] = [i for i in declared if isinstance(i, H.Register)]
    core.register(register.prog, register.enqueue)
    assert core.order([("p1", "a", [0, 1], 1, 0)]) == []  # early: it waits for slot 0 here
    core.calls = lambda *_: [*core.drop_program("p0", DispatchError("injected")),  # type: ignore[method-assign]
                             H.Tell(DispatchFailed("p0", "injected", DispatchError("injected")))]
    out = core.fan(Fan(["h0"], "h1", 4, call=("a", "p0", [], "plan-p0", []), order=("p0", "a", 0, None, -1)))
    del core.calls
    # the reader may run at once (its devices are handed the GIL) ...
    assert [i for i in out if isinstance(i, H.Enqueue)] == [
        H.Enqueue(0, "p0"), H.Enqueue(1, "p0"), H.Enqueue(0, "p1", True), H.Enqueue(1, "p1", True)]
    # ... but no device passes the producer until the store failed its buffers
    assert not core.ledger.ready("p0")
    assert any(isinstance(i, H.DropBuffers) and i.pid == "p0" for i in out)
    core.ledger.buffers_failed("p0")
    assert core.ledger.ready("p0")
