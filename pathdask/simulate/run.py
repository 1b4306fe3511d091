"""The control plane on the virtual clock: clients, the scheduler and the hosts' dispatch.

A call of a program goes the way it goes in the real system, each leg charged
from the :class:`~.model.CostModel`:

1. the client lowers it (the real ``lower``, cached per program) and submits it:
   client CPU; the calls it makes back to back go as one message to the scheduler
   when it waits (for a result), or once it has called for the interpreter's switch
   interval (its event loop, which sends them, gets the GIL only then);
2. the scheduler takes it in: its handler's CPU, a message's first call alone and then
   a slice of calls at a time, as its handler does; it is given to the real
   :class:`~pathdask.core.order.IslandScheduler` with the real policy, and
   each host gets the call (a message, then host CPU per op), the hosts a slice's calls
   in one piece; the rest of the scheduler's CPU for the slice comes after that;
3. when the policy slots it, each host gets an order message; a host has the
   program once it has both (``ready``);
4. its devices run it in slot order (:class:`~.devices.DeviceEngine`), on one shared
   CPU taking it up only when they reach it, behind whatever holds the CPU then; each host
   that finished tells the scheduler, whose ``host_done`` may slot more (those
   programs' orders then go apart: the late-order CPU); the client learns of the
   result a message later. An ending that travels alone costs the hosts and the
   scheduler the lone-done CPU first; a call that travelled alone waits the lone
   wait per host, and the scheduler learns of its ending only after the done wait.

A call on more than ``pathdask.fanout.threshold`` hosts (``fanout``) sends the
records of legs 2 and 3 down a tree of its own hosts and its endings of leg 4 come
back up it, as the runtime does (:mod:`.fanout`): the scheduler's CPU per call no
longer grows with its hosts, the hosts pay per child in the tree, and each leg takes
a message's latency per level of the tree.

The multi-controller baseline (:meth:`Tenant.mc`) is what
``bench/multicontroller.py`` runs: each host registers the same programs with its
own runtime, one after another, with no client and no scheduler.

Devices run programs in slot order; the engine runs a program once every one
of its hosts has it and every earlier slot has run (on one shared CPU, also once
its devices reach it: their own work then queues behind the control plane's turn
that holds the CPU, as a device thread waits for the event loop's), so a host's "done" is
never earlier in virtual time than that (a host that finished a program before
another host even had it reports at that moment: a bookkeeping delay only).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy
import xarray as xr

from ..client.tracing import Program
from ..core.order import IslandScheduler, Submission
from ..dashboard.trace import to_dataset, transfers_dataset
from ..scheduler.plugin import CALL_SLICE
from ..topology import Topology
from .clock import Clock, Hosts, Processor
from .devices import DeviceEngine, own_seconds
from .fanout import Fanout, Route, route
from .model import CostModel
from .schedule import Schedule, compile_schedule

__all__ = ["Call", "ClientScript", "SimResult", "Simulation", "Tenant", "simulate"]

#: virtual times closer than this are one instant (simpy adds delays to ``now`` in floating point)
TICK_S = 1e-12

Script = Callable[["Tenant"], Generator[Any, Any, Any]]


@dataclass
class Call:
    """One call of a program, as the simulation follows it."""

    pid: str
    client: str
    schedule: Schedule
    deps: frozenset[str]
    submitted: float
    lone: bool = False  # its client had no other call in flight: its messages travel alone
    slot: int | None = None
    order_at: float | None = None
    dispatched: np.ndarray | None = None
    started: float | None = None
    done_at: float | None = None
    done: simpy.Event | None = None

    def row(self) -> dict[str, Any]:
        return {"pid": self.pid, "client": self.client, "program": self.schedule.name, "slot": self.slot,
                "submitted": self.submitted, "done": self.done_at}


@dataclass
class ClientScript:
    """A client: its name and weight, and its call pattern, a generator function of a :class:`Tenant`.

    Examples
    --------
    >>> def opbyop(h):
    ...     call = None
    ...     for _ in range(128):
    ...         call = yield from h.call(step, after=call)
    ...     yield from h.result(call)
    >>> ClientScript("bench", opbyop)                        # doctest: +SKIP
    """

    name: str
    script: Script
    weight: float = 1.0


class Tenant:
    """A simulated client, as its script sees it: ``call``, ``result``, ``send``, ``sleep``, ``mc``,
    ``now``, ``marks``."""

    def __init__(self, sim: Simulation, name: str, weight: float, cpu: Processor) -> None:
        self.sim, self.name, self.weight, self.cpu = sim, name, weight, cpu
        self.id = f"{name}-{len(sim.tenants)}"
        self.marks: dict[str, Any] = {}
        self.calls: list[Call] = []
        self.inflight = 0  # calls made whose results have not come yet
        self._outbox: list[Call] = []  # calls made and not sent yet: they go as one message
        self._opened = 0.0  # when the first of them was made

    def _landed(self, _done: simpy.Event) -> None:
        self.inflight -= 1

    @property
    def now(self) -> float:
        return self.sim.clock.now

    def sleep(self, seconds: float) -> Generator[Any, Any, None]:
        self.send()
        yield self.sim.clock.timeout(seconds)

    def send(self) -> None:
        """Send the calls made since the last message, as one message. ``result``, ``sleep`` and
        the end of the script do so, as the client then waits and its event loop sends."""
        calls, self._outbox = self._outbox, []
        if calls:
            self.sim.clock.at(self.sim.clock.now + self.sim.costs.message_s, self.sim.arrive, calls, self.weight)

    def call(self, program: Program, after: Call | Iterable[Call] | None = None) -> Generator[Any, Any, Call]:
        """Submit one call of ``program``; ``after``: the calls that produce its inputs."""
        sim, c = self.sim, self.sim.costs
        sched = sim.schedule(program)
        done = self.cpu.book(sim.clock.now, c.client_call_s + c.client_host_s * sched.n_hosts)
        yield sim.clock.sleep_until(done)
        deps = [after] if isinstance(after, Call) else list(after or ())
        done_event = sim.clock.event()
        done_event.callbacks.append(self._landed)
        call = Call(f"p{next(sim.ids)}", self.id, sched, frozenset(d.pid for d in deps), sim.clock.now,
                    lone=self.inflight == 0, done=done_event)
        self.inflight += 1
        self.calls.append(call)
        sim.calls[call.pid] = call
        # The client's event loop sends its calls, and gets the GIL from a client that keeps
        # calling only when it waits, or after the interpreter's switch interval: the calls
        # made meanwhile go as one message.
        if self._outbox and sim.clock.now - self._opened >= sys.getswitchinterval():
            self.send()
        if not self._outbox:
            self._opened = sim.clock.now
        self._outbox.append(call)
        return call

    def result(self, call: Call) -> Generator[Any, Any, float]:
        """Wait for ``call``'s result and fetch it; returns the time it came."""
        assert call.done is not None
        self.send()
        yield call.done
        yield self.sim.clock.sleep_until(self.cpu.book(self.now, self.sim.costs.result_s))
        return self.now

    def mc(self, program: Program, iterations: int) -> Generator[Any, Any, float]:
        """Multi-controller: every host registers ``program`` ``iterations`` times with its own
        runtime and its devices run them; returns the seconds from the first registration to
        the last host's end, as ``run_multicontroller`` measures them."""
        sim, c = self.sim, self.sim.costs
        sched = sim.schedule(program)
        start = sim.clock.now
        # a host's loop registers its programs one after another (``rt.register``, as a dispatch
        # does); the rest of a program's own cost comes once it is registered
        register = c.host_dispatch_s + c.host_op_s * sched.ops_per_host
        rest = np.maximum(c.mc_call_s + c.mc_op_s * sched.ops_per_host - register, 0.0)
        ready = np.empty((iterations, sched.n_hosts))
        if sim.hosts.shared is not None:  # one event loop: each host's loop runs to its end in turn
            for h in range(sched.n_hosts):
                for i in range(iterations):
                    ready[i, h] = sim.hosts.shared.book(start, float(register[h]))
        else:
            for i in range(iterations):
                ready[i] = sim.hosts.book(sched.hosts, start, register)
        end = start
        for i in range(iterations):
            end = max(end, float(sim.engine.run(sched, ready[i], f"mc{next(sim.ids)}", self.id, lead=rest).max()))
        yield sim.clock.sleep_until(end)
        return end - start

    def mark(self, name: str, value: Any = None) -> None:
        """Note ``value`` (default: now) under ``name``, for the caller of the simulation."""
        self.marks[name] = self.now if value is None else value


@dataclass
class SimResult:
    """What a simulation gives: what a real run gives (a trace, transfers, stats) and more."""

    topology: Topology
    costs: CostModel
    end: float  # virtual seconds simulated
    events: int  # simpy events processed
    device_ops: int  # ops run by devices (one per device per gang)
    wall_s: float
    tenants: dict[str, Tenant]
    calls: list[Call]
    stats: dict[str, Any]
    gangs: dict[str, list[Any]] = field(repr=False)
    transfer_rows: list[Any] = field(repr=False)

    @property
    def trace(self) -> xr.Dataset:
        """Device activity as the real ``client.trace()`` gives it (``trace.pathdask.plot()``)."""
        names = {t.id: t.name for t in self.tenants.values()}
        return to_dataset({"gangs": self.gangs, "clients": names,
                           "devices": list(range(self.topology.num_devices))})

    @property
    def transfers(self) -> xr.Dataset:
        return transfers_dataset(self.transfer_rows)

    @property
    def events_per_s(self) -> float:
        return (self.events + self.device_ops) / self.wall_s if self.wall_s else float("nan")

    def by_name(self, name: str) -> Tenant:
        return next(t for t in self.tenants.values() if t.name == name)


class Simulation:
    """One simulated system: a topology, a cost model, a policy; add clients, then :meth:`run`."""

    def __init__(self, topology: Topology, costs: CostModel | None = None, policy: str = "fifo",
                 trace_gangs: int = 20000, overlap: bool = True, fanout: Fanout | None = None) -> None:
        self.topology = topology
        self.costs = costs if costs is not None else CostModel.load()
        #: the fan-out trees' shape (by default the dask config's ``pathdask.fanout``)
        self.fanout = fanout if fanout is not None else Fanout.from_config()
        self._routes: dict[int, tuple[Schedule, Route | None]] = {}  # id -> (schedule, its route)
        self.clock = Clock()
        self.islands = IslandScheduler(policy)
        self.overlap = overlap
        shared = Processor("shared", lambda: self.clock.now) if self.costs.shared_cpu else None
        self.engine = DeviceEngine(topology, self.costs, trace_gangs, shared)
        self.shared = shared
        self.scheduler_cpu = shared or Processor("scheduler")
        self.hosts = Hosts(topology.num_hosts, shared)
        self.tenants: dict[str, Tenant] = {}
        self.calls: dict[str, Call] = {}
        self.ids = itertools.count()
        self.order: deque[Call] = deque()  # slotted, not yet run, in slot order
        self._wake: float | None = None
        self._alone: dict[int, tuple[Schedule, float]] = {}  # id -> (schedule, ``_ends_alone``)
        #: per client, the messages of calls its stream holds for the scheduler, the first being taken in
        self._streams: defaultdict[str, deque[tuple[list[Call], float]]] = defaultdict(deque)

    def schedule(self, program: Program) -> Schedule:
        return compile_schedule(program, self.topology, self.overlap)

    def route(self, sched: Schedule) -> Route | None:
        """The fan-out tree a call of ``sched`` goes down (None: none, the scheduler sends to
        and hears from each host itself)."""
        known = self._routes.get(id(sched))
        if known is None:
            known = self._routes[id(sched)] = (sched, route(sched.hosts, self.fanout))
        return known[1]

    def _scheduler_s(self, call: Call) -> tuple[float, float]:
        """The scheduler's CPU for ``call`` (:meth:`CostModel.scheduler_s`): per host, or per tree."""
        return self.costs.scheduler_s(call.schedule.n_hosts, call.lone, tree=self.route(call.schedule) is not None)

    def client(self, name: str, script: Script, weight: float = 1.0) -> Tenant:
        """Add a client running ``script``."""
        t = Tenant(self, name, weight, self.shared or Processor(name))
        self.tenants[t.id] = t

        def run() -> Generator[Any, Any, None]:
            yield from script(t)
            t.send()  # calls made last go when the script ends

        self.clock.process(run())
        return t

    def run(self, until: float | None = None) -> SimResult:
        """Run until every client's script ended (or ``until`` virtual seconds)."""
        wall = time.perf_counter()
        self.clock.run(until)
        wall = time.perf_counter() - wall
        stuck = [c.pid for c in self.calls.values() if c.done_at is None]
        if until is None and stuck:  # no event left, yet calls that never ran: a bug, not a result
            raise RuntimeError(f"The simulation stalled at {self.clock.now:.6f} s with {len(stuck)} call(s) that "
                               f"never ran ({stuck[:5]}); slotted and waiting: {self.islands.info()}")
        stats = self.engine.stats()
        stats["scheduler"] = self.islands.info()
        stats["clients"] = {t.id: {"name": t.name, "done": self.islands.done.get(t.id, 0),
                                   "busy_s": self.engine.client_busy.get(t.id, 0.0),
                                   "ops": self.engine.client_ops.get(t.id, 0)}
                            for t in self.tenants.values()}
        rows = list(self.engine.links.transfers)  # (start, end, src, dst, link, nbytes)
        return SimResult(self.topology, self.costs, self.clock.now, self.clock.events, self.engine.device_ops,
                         wall, self.tenants, list(self.calls.values()), stats, self.engine.gangs(), rows)

    # -- the scheduler --------------------------------------------------------------
    def arrive(self, calls: list[Call], weight: float) -> None:
        """A message of ``calls`` reaches the scheduler; a client's stream hands it the messages
        in order, each once the one before it was taken in."""
        waiting = self._streams[calls[0].client]
        waiting.append((calls, weight))
        if len(waiting) == 1:
            self._take(calls, weight, first=True)

    def _take(self, calls: list[Call], weight: float, first: bool) -> None:
        """Take in a slice of a message's ``calls`` as ``SchedulerPlugin.call`` does: the first call
        alone, then the calls of :data:`~pathdask.scheduler.plugin.CALL_SLICE` of its handler's
        time (:meth:`~.model.CostModel.scheduler_s`). Their dispatches go when the slice is done,
        and the next slice is taken in before the hosts take them in."""
        start = self.clock.now
        done, taken, after = start, 0, 0.0
        for call in calls:
            take, later = self._scheduler_s(call)
            done = self.scheduler_cpu.book(done, take)
            after += later
            taken += 1
            if first or done - start >= CALL_SLICE:
                break
        self.clock.at(done, self._taken, calls[:taken], calls[taken:], weight, after)

    def _taken(self, calls: list[Call], rest: list[Call], weight: float, after: float) -> None:
        """A slice of ``calls`` was taken in: the next is taken in, their dispatches go, and then
        the rest of the scheduler's work for them (``after`` seconds)."""
        if rest:
            self._take(rest, weight, first=False)
        else:
            waiting = self._streams[calls[0].client]
            waiting.popleft()
            if waiting:
                self._take(*waiting[0], first=True)
        for call in calls:
            self._submit(call, weight)
        # the rest of the scheduler's work for the slice's calls, behind the hosts taking them in
        if after:
            self.scheduler_cpu.book(self.clock.now + self.costs.message_s, after)

    def _submit(self, call: Call, weight: float) -> None:
        c, sched = self.costs, call.schedule
        own = c.host_dispatch_s + c.host_op_s * sched.ops_per_host + (c.lone_host_s if call.lone else 0.0)
        r = self.route(sched)
        if r is None:
            call.dispatched = self.hosts.book(sched.hosts, self.clock.now + c.message_s, own)
        else:
            call.dispatched = r.descend(self.hosts, self.clock.now + c.message_s, own, c)
        sub = Submission(call.pid, call.client, sched.host_devices, sched.cost, call.deps)
        self._slotted(self.islands.submit(sub, weight))

    def _slotted(self, slotted: list[tuple[int, Submission]], late: bool = False) -> None:
        """``slotted`` programs get their slots; ``late``: after their calls were taken in, so
        their orders go to their hosts apart from their calls."""
        c, now = self.costs, self.clock.now
        # the scheduler's CPU per order sent apart (only then: the waiting programs are counted)
        sent = c.late_order_s + c.late_order_waiting_s * len(self.islands.policy) if late and slotted else 0.0
        for slot, sub in slotted:
            call = self.calls[sub.pid]
            order_at = now + c.message_s  # the order goes with the call's dispatch
            if late:  # sent, then taken in by each host (down a tree: its forwards' CPU is the call's)
                hosts, r = call.schedule.hosts, self.route(call.schedule)
                at, own = self.scheduler_cpu.book(now, sent) + c.message_s, np.full(len(hosts), c.late_order_host_s)
                order_at = float((self.hosts.book(hosts, at, own) if r is None
                                  else r.descend(self.hosts, at, own, c, forward_s=0.0)).max())
            call.slot, call.order_at = slot, order_at
            self.order.append(call)
        self._advance()

    def _advance(self) -> None:
        """Run the slotted programs, in slot order, whose hosts all have them by now."""
        now = self.clock.now
        while self.order:
            call = self.order[0]
            assert call.dispatched is not None and call.order_at is not None
            ready = np.maximum(call.dispatched, call.order_at)
            when = float(ready.max())
            if self.shared is not None:  # one CPU: a program's devices take it up when they reach it
                when = max(when, float(self.engine.modelled[call.schedule.devices].min()))
            # simpy reaches a wake-up at ``when`` as ``now + (when - now)``, which may fall short
            # of ``when`` by a rounding error: that is the same instant, not a later one
            if when > now + TICK_S:
                if self._wake is None or self._wake > when or self._wake <= now:
                    self._wake = when
                    self.clock.at(when, self._advance)
                return
            self.order.popleft()
            call.started = float(ready.min())
            ends = np.maximum(self.engine.run(call.schedule, ready, call.pid, call.client), now)
            r = self.route(call.schedule)
            if r is None:
                self.clock.at(float(ends.max()) + self.costs.message_s, self._program_done, call)
            else:  # up the tree, from when its first host ended
                self.clock.at(float(ends.min()), self._ascend, call, ends, r)

    def _ascend(self, call: Call, ends: np.ndarray, r: Route) -> None:
        """``call``'s endings go up its tree (:meth:`Route.ascend`), each host that reports paying
        its share of the lone-done CPU; the scheduler has them once the first host reported."""
        share = 0.0 if call.lone else self._ends_alone(call.schedule)
        told = r.ascend(self.hosts, ends, share * self.costs.lone_done_host_s, self.costs)
        self.clock.at(told, self._program_done, call, share)

    def _ends_alone(self, sched: Schedule) -> float:
        """The share of the lone-done costs a pipelined call of ``sched`` pays: the more its gangs
        outlast the control plane's work for a call (on the one processor, or on the busiest
        one), the more of its endings come to an idle control plane and travel alone
        (:meth:`CostModel.lone_done_at`)."""
        known = self._alone.get(id(sched))
        if known is None:
            c, n, r = self.costs, sched.n_hosts, self.route(sched)
            kernels = [st for st in sched.steps if st.kind == "kernel"]
            own = [len(st.devs) * own_seconds(st, c) for st in kernels]
            relays, busiest = r.relay_cpu(c) if r is not None else (0.0, 0.0)
            parts = [c.client_call_s + c.client_host_s * n,
                     sum(c.scheduler_s(n, tree=r is not None)),
                     n * c.host_dispatch_s + c.host_op_s * float(sched.ops_per_host.sum()), sum(own), relays]
            cpu = sum(parts) if self.costs.shared_cpu else max(parts[0], parts[1], parts[2] / n, busiest,
                                                               sum(own) / max(len(sched.devices), 1))
            stretch = sum(st.cost for st in kernels) / cpu if cpu > 0 else np.inf
            known = self._alone[id(sched)] = (sched, c.lone_done_at(stretch))
        return known[1]

    def _program_done(self, call: Call, up: float | None = None) -> None:
        """The scheduler has ``call``'s endings: each host's, or (``up``: the share of the lone-done
        CPU its hosts paid on the way) its tree's first host's."""
        c, now, r = self.costs, self.clock.now, self.route(call.schedule)
        call.done_at = told = now
        n = call.schedule.n_hosts
        if call.lone:  # each host's hand-offs, one after another (on separate processors, along a path)
            told += c.lone_wait_host_s * (n if r is None or c.shared_cpu else r.path_hosts)
        elif up is not None:
            if up:
                told = self.scheduler_cpu.book(now, up * c.lone_done_s)
        elif share := self._ends_alone(call.schedule):
            hosts = call.schedule.hosts
            sent = self.hosts.book(hosts, now, np.full(len(hosts), share * c.lone_done_host_s))
            told = self.scheduler_cpu.book(float(sent.max()), share * c.lone_done_s)
        assert call.done is not None
        self.clock.at(told + c.message_s, call.done.succeed)
        # the scheduler learns of a lone call's ending only after the done wait (per ending it takes)
        wait = c.done_wait_s + c.done_wait_host_s * (n if r is None else 1) if call.lone else 0.0
        if wait > 0:
            self.clock.at(now + wait, self._learned, call)
        else:
            self._learned(call)

    def _learned(self, call: Call) -> None:
        """The scheduler learns that ``call``'s hosts ended it: the policy may slot others now."""
        slotted = []
        for addr in call.schedule.host_devices:
            slotted += self.islands.host_done(call.pid, addr)
        self._slotted(slotted, late=True)


def simulate(topology: Topology, clients: Iterable[ClientScript], costs: CostModel | None = None,
             policy: str = "fifo", until: float | None = None, trace_gangs: int = 20000,
             window: tuple[float, float] | None = None, fanout: Fanout | None = None) -> SimResult:
    """Simulate ``clients`` on ``topology``: the real lowering, policies and link model on a
    virtual clock. ``window``: the span over which each client's device time is summed
    (``stats["clients"][id]["busy_s"]``); ``fanout``: the fan-out trees' shape (default: the
    dask config's ``pathdask.fanout``; :meth:`Fanout.off` for none).

    Examples
    --------
    >>> topo = pw.Topology(islands=1, hosts_per_island=512, devices_per_host=4)   # doctest: +SKIP
    >>> result = simulate(topo, [ClientScript("bench", opbyop)])                  # doctest: +SKIP
    >>> result.trace.pathdask.plot()                                              # doctest: +SKIP
    """
    sim = Simulation(topology, costs, policy, trace_gangs, fanout=fanout)
    sim.engine.window = window
    for c in clients:
        sim.client(c.name, c.script, c.weight)
    return sim.run(until)
