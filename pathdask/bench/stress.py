"""``pathdask bench stress``: many fresh systems, random tenants, random chaos; nothing may hang.

Each run starts a new :class:`~pathdask.LocalSystem` (2 islands x 2 hosts x 2
devices, 64 MiB of HBM each) and draws, from ``random.Random(seed * 1000 + run)``:

- the policy (``fifo`` or ``proportional``) and a dispatch jitter in [0, 3] ms;
- 1 to ``max_clients`` clients, each a thread of this process or a process of its
  own (``pw.connect``), with a weight from (1, 2, 4, 8);
- per client, two meshes of shape ``{a: 1}``, ``{a: 2}``, ``{a: 4}`` or
  ``{a: 2, b: 2}``, on one island or on both; meshes of different clients overlap;
- per client, an in-flight depth from 1 to ``max_depth``, and random programs:
  chains of 1 to ``max_steps`` steps (element-wise kernels, ``psum`` over either
  axis, tiled ``all_gather``, ``ppermute`` shifts, tiled ``all_to_all``, moves to
  the other mesh and changes of partition spec), some reused (cached plans), some
  fed the previous program's still pending output;
- with ``chaos``: clients that ``close()`` mid-stream (threads) or are SIGKILLed
  mid-stream (processes), one host whose next dispatch fails, and, with worker
  processes, one SIGKILLed worker.

Every result is compared with a NumPy reference computed alongside. Programs hit
by chaos may fail, but only with ``DeviceLostError``, ``GangAbortedError``,
``DispatchError`` or ``PlanMissingError``; a client stops at its first such error.

Reported per run: a hang (no client ended a program for ``hang_seconds``, or one
result waited twice that long; then ``system.diagnose()`` is recorded and the run
is abandoned), wrong results (any other exception, a typed error with no chaos
before it, or a mismatch with NumPy), bytes left in the stores once every client
closed, programs checked, and ``stall_end_s``: the longest time from a chaos event
until every program of the surviving clients that was in flight then had ended.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .. import (
    DeviceLostError,
    DispatchError,
    GangAbortedError,
    P,
    PartitionSpec,
    PlanMissingError,
    all_gather,
    all_to_all,
    axis_index,
    function,
    ppermute,
    program,
    psum,
)
from ..faults import fail_next_dispatch
from ..system import LocalSystem
from ..topology import Topology
from .report import table, write_json

Echo = Callable[[str], Any]
Sink = Callable[..., None]
Step = tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray], str]

TYPED = (DeviceLostError, GangAbortedError, DispatchError, PlanMissingError)
MESH_SHAPES: tuple[dict[str, int], ...] = ({"a": 1}, {"a": 2}, {"a": 4}, {"a": 2, "b": 2})
WEIGHTS = (1.0, 2.0, 4.0, 8.0)
STEP_KINDS = ("scale", "tanh", "offset", "psum", "gather", "permute", "all_to_all", "move", "respec")


def topology() -> Topology:
    """The stress topology: 8 devices in 2 islands of 4."""
    return Topology(islands=2, hosts_per_island=2, devices_per_host=2, hbm=64 * 2**20)  # 64 MiB


@dataclass
class Config:
    """What ``pathdask bench stress`` randomises, and how far.

    Parameters
    ----------
    runs : int
        Fresh systems, one after another.
    seed : int
        Run ``r`` draws everything from ``random.Random(seed * 1000 + r)``.
    processes : bool
        Worker processes (and then worker kills) or all hosts in this process.
    hang_seconds : float
        No program ended for this long (or one result waited twice this long): a hang.
    min_clients, max_clients, programs_per_client, max_depth, max_steps : int
        Bounds of the random clients, their programs, in-flight depth and steps.
    chaos : bool
        Close or SIGKILL clients mid-stream, and kill a worker (with ``processes``).
    process_clients : float
        Chance that a client runs in a process of its own.
    process_client_budget : int or None
        At most this many process clients over all runs (``None``: no limit).
    client_chaos : float
        Chance, per thread client, that it closes itself mid-stream.
    process_kill : float
        Chance, per process client, that it is SIGKILLed mid-stream.
    worker_kill : float
        Chance, per run with ``processes``, that one worker process is SIGKILLed.
    dispatch_fail : float
        Chance, per run, that one host's next dispatch fails mid-stream.
    """

    runs: int = 20
    seed: int = 0
    processes: bool = False
    hang_seconds: float = 30.0
    min_clients: int = 1
    max_clients: int = 8
    programs_per_client: int = 24
    max_depth: int = 16
    max_steps: int = 4
    chaos: bool = True
    process_clients: float = 0.25
    process_client_budget: int | None = None
    client_chaos: float = 0.25
    process_kill: float = 0.5
    worker_kill: float = 0.5
    dispatch_fail: float = 0.3

    @classmethod
    def small(cls) -> Config:
        """CI size: 4 runs of up to 3 thread clients; at most 2 process clients, SIGKILLed."""
        return cls(runs=4, min_clients=2, max_clients=3, programs_per_client=10, max_depth=6,
                   process_clients=0.4, process_client_budget=2, client_chaos=0.3, process_kill=1.0)


@dataclass
class ClientPlan:
    """One client of one run; picklable, so that a process client gets it as it is."""

    index: int
    name: str
    weight: float
    process: bool
    depth: int
    programs: int
    max_steps: int
    seed: int
    shapes: tuple[dict[str, int], ...]
    islands: tuple[int, ...]
    close_after: int | None = None  # a thread client closes itself after submitting this many
    kill_after: int | None = None  # a process client asks to be SIGKILLed after submitting this many


@dataclass
class RunPlan:
    seed: int
    policy: str
    jitter: float
    clients: list[ClientPlan]
    kill_worker_after: int | None = None  # SIGKILL a worker once this many programs ended (and all started)
    victim: int = 0  # which worker, as an index into the sorted worker addresses
    fail_dispatch_after: int | None = None  # one host's next dispatch fails once this many ended


# -- random programs and their NumPy meaning ------------------------------------------------------
def _specs(mesh: Any) -> list[PartitionSpec]:
    """Specs valid for a (rows, cols) array with rows % 16 == 0 and cols % 4 == 0 on ``mesh``."""
    specs = [P("a"), P(), P(None, "a")]
    if "b" in mesh.shape:
        specs += [P("b"), P(None, "b"), P("a", "b"), P(("a", "b"))]
    return specs


def _elementwise(rng: random.Random, mesh: Any, kind: str) -> Step:
    spec = rng.choice(_specs(mesh))
    if kind == "tanh":
        f = function(np.tanh, in_specs=spec, out_specs=spec, name="tanh")
        return (lambda x: f(x, mesh=mesh)), np.tanh, f"tanh{spec}"
    a, c = rng.uniform(-2, 2), rng.uniform(-1, 1)
    g = function(lambda b: b * a + c, in_specs=spec, out_specs=spec, name="scale")
    return (lambda x: g(x, mesh=mesh)), (lambda v: v * a + c), f"scale{spec}"


def _offset(rng: random.Random, mesh: Any, rows: int) -> Step:
    n, s = mesh.shape["a"], rng.uniform(-1, 1)
    f = function(lambda b: b + s * axis_index("a"), in_specs=P("a"), out_specs=P("a"), name="offset")
    ramp = np.repeat(np.arange(n), rows // n)[:, None]
    return (lambda x: f(x, mesh=mesh)), (lambda v: v + s * ramp), "offset"


def _psum(rng: random.Random, mesh: Any) -> Step:
    axis = rng.choice(mesh.axis_names)
    n = mesh.shape[axis]
    if axis == "b":  # blocks are replicated over b: the sum is n times each
        f = function(lambda b: psum(b, "b"), in_specs=P("a"), out_specs=P("a"), name="psum_b")
        return (lambda x: f(x, mesh=mesh)), (lambda v: v * n), "psum_b"
    # every device ends with the sum of the n row blocks: the global array is that sum tiled n times
    g = function(lambda b: psum(b, "a"), in_specs=P("a"), out_specs=P("a"), name="psum_a")
    return (lambda x: g(x, mesh=mesh)), (lambda v: np.tile(v.reshape(n, -1, v.shape[1]).sum(0), (n, 1))), "psum_a"


def _collective(rng: random.Random, mesh: Any, kind: str) -> Step:
    n = mesh.shape["a"]
    if kind == "gather":
        f = function(lambda b: all_gather(b, "a", tiled=True), in_specs=P("a"), out_specs=P(), name="gather")
        return (lambda x: f(x, mesh=mesh)), (lambda v: v), "gather"
    if kind == "permute":
        s = rng.randrange(n) + 1
        perm = [(i, (i + s) % n) for i in range(n)]
        g = function(lambda b: ppermute(b, "a", perm), in_specs=P("a"), out_specs=P("a"), name="permute")
        return ((lambda x: g(x, mesh=mesh)),
                (lambda v: np.roll(v.reshape(n, -1, v.shape[1]), s, 0).reshape(v.shape)), f"permute{s}")
    # tiled all_to_all of row blocks: device j gets chunk j of every block, in member order
    h = function(lambda b: all_to_all(b, "a", 0, 0, tiled=True), in_specs=P("a"), out_specs=P("a"),
                 name="all_to_all")
    return ((lambda x: h(x, mesh=mesh)),
            (lambda v: v.reshape(n, n, -1, v.shape[1]).transpose(1, 0, 2, 3).reshape(v.shape)), "all_to_all")


def _move(rng: random.Random, mesh: Any, other: Any, kind: str) -> Step:
    target = other if kind == "move" else rng.choice([mesh, other])
    spec = P("a") if kind == "move" else rng.choice(_specs(target))
    f = function(lambda b: b - 0.5, in_specs=spec, out_specs=spec, name=kind)
    return (lambda x: f(x, mesh=target)), (lambda v: v - 0.5), f"{kind}{spec}"


def _step(rng: random.Random, mesh: Any, other: Any, rows: int) -> Step:
    """One random step: (a function of one sharded array, its NumPy meaning, a name)."""
    kind = rng.choice(STEP_KINDS)
    if kind in ("scale", "tanh"):
        return _elementwise(rng, mesh, kind)
    if kind == "offset":
        return _offset(rng, mesh, rows)
    if kind == "psum":
        return _psum(rng, mesh)
    if kind in ("gather", "permute", "all_to_all"):
        return _collective(rng, mesh, kind)
    return _move(rng, mesh, other, kind)


@dataclass
class Chain:
    """A random ``@program`` of a few steps, its NumPy reference and where its input starts."""

    prog: Any
    refs: list[Callable[[np.ndarray], np.ndarray]]
    names: list[str]
    shape: tuple[int, int]
    mesh: Any
    spec: PartitionSpec

    def reference(self, value: np.ndarray) -> np.ndarray:
        for ref in self.refs:
            value = ref(value)
        return value


def random_chain(rng: random.Random, meshes: list[Any], max_steps: int) -> Chain:
    """A chain of 1 to ``max_steps`` random steps over the client's two meshes."""
    rows, cols = 16 * rng.randint(1, 2), rng.choice([4, 8])  # any spec of any mesh divides these
    steps = []
    for _ in range(rng.randint(1, max_steps)):
        mesh, other = rng.sample(meshes, 2)
        steps.append(_step(rng, mesh, other, rows))

    def chain(x: Any) -> Any:
        for f, _, _ in steps:
            x = f(x)
        return x

    start = rng.choice(meshes)
    return Chain(program(chain), [r for _, r, _ in steps], [n for _, _, n in steps], (rows, cols), start,
                 rng.choice(_specs(start)))


# -- one client: the same loop in a thread or in a process -------------------------------------
@dataclass
class Call:
    k: int
    out: Any
    expected: np.ndarray
    t0: float
    desc: str = ""


def check(call: Call, timeout: float) -> tuple[str, str]:
    """``(outcome, detail)``: ``ok``, ``typed`` (an allowed error), ``timeout`` or ``wrong``."""
    try:
        got = call.out.result(timeout=timeout)
    except TimeoutError as e:
        return "timeout", str(e)
    except TYPED as e:
        return "typed", repr(e)
    except Exception as e:  # noqa: BLE001 - any other error is a wrong result
        return "wrong", repr(e)
    exp = call.expected
    scale = max(1.0, float(np.abs(exp).max()))
    if got.shape != exp.shape or not np.allclose(got, exp, rtol=1e-9, atol=1e-9 * scale):
        diff = float(np.abs(got - exp).max()) if got.shape == exp.shape else math.nan
        return "wrong", f"mismatch: shape {got.shape} vs {exp.shape}, max abs diff {diff:g}"
    return "ok", ""


def _submit(client: Any, rng: random.Random, meshes: list[Any], library: list[Chain], last: Call | None,
            k: int, max_steps: int) -> Call:
    chain = rng.choice(library) if rng.random() < 0.5 else random_chain(rng, meshes, max_steps)
    t0 = time.time()
    if last is not None and last.expected.shape == chain.shape and rng.random() < 0.3:
        x, value = last.out, last.expected  # the previous program's output, maybe still pending
        source = f"program {last.k}'s output"
    else:
        value = np.random.default_rng(rng.randrange(2**32)).normal(size=chain.shape)
        x = client.put(value, chain.mesh, chain.spec)
        source = f"a put on devices {list(chain.mesh.device_ids)} as {chain.spec}"
    out = chain.prog(x)
    desc = (f"{chain.names} on meshes {[(m.shape, list(m.device_ids)) for m in meshes]} of input {source}; "
            f"pid {getattr(out, '_pid', '?')}")
    return Call(k, out, chain.reference(value), t0, desc)


def _end(sink: Sink, call: Call, timeout: float) -> str:
    outcome, detail = check(call, timeout)
    if outcome != "ok":
        detail = f"{detail} [program {call.desc}]"
    sink("program", k=call.k, t0=call.t0, t1=time.time(), outcome=outcome, detail=detail)
    return outcome


def drive(client: Any, plan: ClientPlan, sink: Sink, stop: threading.Event, timeout: float) -> None:
    """Submit ``plan.programs`` random programs, ``plan.depth`` in flight, checking each in order.

    Stops at the first error; closes the client itself (chaos) at ``plan.close_after``.
    """
    rng = random.Random(plan.seed)
    meshes = [client.mesh(shape, island=island) for shape, island in zip(plan.shapes, plan.islands)]
    sink("started")
    library = [random_chain(rng, meshes, plan.max_steps) for _ in range(rng.randint(1, 3))]
    pending: deque[Call] = deque()
    last: Call | None = None
    failed = False
    for k in range(plan.programs):
        if stop.is_set() or failed:
            break
        t0 = time.time()
        try:
            last = _submit(client, rng, meshes, library, last, k, plan.max_steps)
        except Exception as e:  # noqa: BLE001 - classified like a result
            sink("program", k=k, t0=t0, t1=time.time(), outcome="typed" if isinstance(e, TYPED) else "wrong",
                 detail=f"at submission: {e!r}")
            break
        pending.append(last)
        if plan.close_after == k + 1:
            sink("chaos", what="close-client")
            client.close()
            return
        if plan.kill_after == k + 1:
            sink("kill_me")
        while len(pending) >= plan.depth and not failed:
            failed = _end(sink, pending.popleft(), timeout) != "ok"
    if failed:
        _end_all(sink, pending, timeout)
    while pending and not stop.is_set():
        _end(sink, pending.popleft(), timeout)


def _end_all(sink: Sink, pending: deque[Call], timeout: float) -> None:
    """Wait for every pending call at once (after a failure, each may take long to fail)."""
    threads = [threading.Thread(target=_end, args=(sink, call, timeout), daemon=True) for call in pending]
    pending.clear()
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 10
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))


def _client_body(make: Callable[[], Any], plan: ClientPlan, sink: Sink, stop: threading.Event,
                 timeout: float) -> None:
    client = None
    try:
        client = make()
        drive(client, plan, sink, stop, timeout)
    except BaseException as e:  # noqa: BLE001 - reported to the harness
        sink("crash", error=repr(e), typed=isinstance(e, TYPED))
    finally:
        if client is not None:
            client.close()
        sink("finished")


def process_client(address: str, plan: ClientPlan, conn: Connection, timeout: float) -> None:
    """A client in a process of its own (spawned): reports each event on ``conn``."""
    from .. import connect

    lock = threading.Lock()  # a Connection is not thread-safe; _end_all reports from threads

    def sink(kind: str, **data: Any) -> None:
        data.setdefault("t", time.time())
        with lock:
            conn.send((kind, data))

    try:
        _client_body(lambda: connect(address, name=plan.name, weight=plan.weight), plan, sink,
                     threading.Event(), timeout)
    finally:
        conn.close()


# -- the harness side of one run --------------------------------------------------------------
@dataclass
class RunState:
    """What the clients of one run reported; every change notifies ``cond``."""

    n: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    last_progress: float = field(default_factory=time.time)
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    victims: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)  # meshes made: a worker kill cannot fail them
    finished: set[int] = field(default_factory=set)
    kill_requests: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    ended: int = 0

    def sink(self, index: int) -> Sink:
        def report(kind: str, **data: Any) -> None:
            self.apply(index, kind, data)

        return report

    def apply(self, index: int, kind: str, data: dict[str, Any]) -> None:
        with self.cond:
            now = time.time()
            self.last_progress = now
            if kind == "program":
                self.ended += 1
                self.records.append({"client": index, **data})
                if data["outcome"] == "timeout":
                    self.timeouts.append(f"client {index} program {data['k']}: {data['detail']}")
            elif kind == "chaos":
                self.victims.add(index)
                self.events.append({"t": data.get("t", now), "kind": data["what"], "client": index})
            elif kind == "started":
                self.started.add(index)
            elif kind == "kill_me":
                self.kill_requests.append(index)
            elif kind == "crash" and index not in self.victims:
                self.records.append({"client": index, "k": -1, "t0": now, "t1": now,
                                     "outcome": "typed" if data["typed"] else "wrong",
                                     "detail": f"client crashed: {data['error']}"})
            elif kind == "eof" and index not in self.finished:
                self.problems.append(f"process client {index} died without finishing")
            if kind in ("finished", "eof"):
                self.finished.add(index)
            self.cond.notify_all()

    def chaos(self, kind: str, **data: Any) -> None:
        with self.cond:
            self.events.append({"t": time.time(), "kind": kind, **data})
            self.last_progress = time.time()


def _reader(conn: Connection, index: int, state: RunState) -> None:
    while True:
        try:
            kind, data = conn.recv()
        except Exception:  # noqa: BLE001 - EOF, or a message cut short by a SIGKILL
            conn.close()
            state.apply(index, "eof", {})
            return
        state.apply(index, kind, data)


class Agent:
    """Strikes one host of a run's system once enough programs ended (see ``fire``)."""

    kind = ""

    def __init__(self, system: LocalSystem, after: int, victim: int, state: RunState) -> None:
        from distributed import Client as DaskClient

        self.dask = DaskClient(system.scheduler_address, set_as_default=False, timeout=30)
        pids = self.dask.run(os.getpid)
        self.address = sorted(pids)[victim % len(pids)]
        self.pid = int(pids[self.address])
        self.island = next(d["island"] for d in system.devices() if d["address"] == self.address)
        self.after, self.state, self.fired = after, state, False

    def maybe_fire(self, ended: int) -> None:
        if self.fired or ended < self.after:
            return
        self.fired = True
        self.state.chaos(self.kind, host=self.address, island=self.island)
        with contextlib.suppress(OSError, KeyError):  # the host left already: nothing to strike
            self.fire()

    def fire(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.dask.close()


class WorkerKiller(Agent):
    """SIGKILLs one worker process (started by the LocalSystem)."""

    kind = "kill-worker"

    def fire(self) -> None:
        os.kill(self.pid, signal.SIGKILL)  # a worker of our own LocalSystem, by its PID

    def wait_hosts(self) -> None:
        self.dask.sync(self.dask.scheduler.pathdask_wait_hosts, timeout="60s")


class DispatchFailer(Agent):
    """Makes the next dispatch on one host fail."""

    kind = "fail-dispatch"

    def fire(self) -> None:
        self.dask.run(fail_next_dispatch, workers=[self.address])


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` in a daemon thread; its result, its exception, or ``TimeoutError`` after ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)!r} did not return within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class Run:
    """One run: start its clients, watch them, apply chaos, and judge what they report."""

    def __init__(self, system: LocalSystem, cfg: Config, plan: RunPlan) -> None:
        self.system, self.cfg, self.plan = system, cfg, plan
        self.state = RunState(len(plan.clients))
        self.t0 = self.state.last_progress  # times in the report are seconds since this
        self.stop = threading.Event()
        # longer than a hang: a result that is slow but ends shows up in stall_end_s, not as a hang
        self.result_timeout = 2 * cfg.hang_seconds
        self.threads: list[threading.Thread] = []
        self.procs: dict[int, Any] = {}
        self.clients: list[Any] = []  # the thread clients, to close them after a hang
        self.killer: WorkerKiller | None = None
        self.failer: DispatchFailer | None = None

    def _thread_client(self, plan: ClientPlan) -> Any:
        c = self.system.client(name=plan.name, weight=plan.weight)
        self.clients.append(c)
        return c

    def start(self) -> None:
        import multiprocessing

        if self.plan.kill_worker_after is not None:
            self.killer = WorkerKiller(self.system, self.plan.kill_worker_after, self.plan.victim, self.state)
        if self.plan.fail_dispatch_after is not None:
            self.failer = DispatchFailer(self.system, self.plan.fail_dispatch_after, self.plan.victim + 1,
                                         self.state)
        ctx = multiprocessing.get_context("spawn")
        for c in self.plan.clients:
            if c.process:
                here, there = ctx.Pipe(duplex=False)
                p = ctx.Process(target=process_client, daemon=True,
                                args=(self.system.scheduler_address, c, there, self.result_timeout))
                p.start()
                there.close()
                self.procs[c.index] = p
                threading.Thread(target=_reader, args=(here, c.index, self.state), daemon=True).start()
            else:
                t = threading.Thread(target=_client_body, daemon=True, args=(
                    functools.partial(self._thread_client, c), c,
                    self.state.sink(c.index), self.stop, self.result_timeout))
                t.start()
                self.threads.append(t)

    def _kill_client(self, index: int) -> None:
        p = self.procs[index]
        with self.state.cond:
            if index in self.state.finished:
                return
            self.state.victims.add(index)
            self.state.finished.add(index)
            self.state.events.append({"t": time.time(), "kind": "kill-client", "client": index})
        os.kill(p.pid, signal.SIGKILL)  # a client process we started, by its PID

    def watch(self) -> str | None:
        """Until every client finished: ``None``; or the reason of a hang."""
        st = self.state
        while True:
            with st.cond:
                st.cond.wait(timeout=0.25)
                requests, st.kill_requests = st.kill_requests, []
                done = len(st.finished) == st.n
                all_started = len(st.started | st.finished) == st.n
                idle, ended, timeouts = time.time() - st.last_progress, st.ended, list(st.timeouts)
            for index in requests:
                self._kill_client(index)
            for agent in (self.killer, self.failer):
                if agent is not None and all_started and not done:
                    agent.maybe_fire(ended)
            if timeouts:
                return f"a result waited more than {self.result_timeout:g}s: {timeouts[0]}"
            if done:
                return None
            if idle > self.cfg.hang_seconds:
                return f"no client ended a program for {idle:.1f}s"

    def abandon(self) -> None:
        """After a hang: stop the threads, kill our client processes, close the clients."""
        self.stop.set()
        for p in self.procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # ours, by its PID
        for c in list(self.clients):
            with contextlib.suppress(Exception):  # best effort; the system closes next
                bounded(c.close, 10)

    def join(self) -> None:
        deadline = time.monotonic() + 15
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        for p in self.procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()  # ours, by its handle
                p.join(5)

    def leftover(self) -> tuple[int, str | None]:
        """Bytes left in the stores once every client closed (and the error, if not idle)."""
        try:
            if self.killer is not None and self.killer.fired:
                self.killer.wait_hosts()
            stats = self.system.wait_idle(timeout="20s")
        except Exception as e:  # noqa: BLE001 - a TimeoutError (or a lost scheduler) is a leftover
            return -1, f"{type(e).__name__}: {e}"
        left = sum(s["bytes_in_use"] for s in stats["devices"].values())
        buffers = sum(s["buffers"] for s in stats["devices"].values())
        return left, (f"{buffers} buffer(s) left" if buffers and not left else None)

    def stall_end(self) -> float | None:
        """Longest time from a chaos event until the programs of surviving clients then in flight ended."""
        st = self.state
        if not st.events:
            return None
        worst = 0.0
        for ev in st.events:
            for r in st.records:
                if r["client"] not in st.victims and r["t0"] <= ev["t"] <= r["t1"]:
                    worst = max(worst, r["t1"] - ev["t"])
        return worst

    def judge(self) -> tuple[list[str], list[str], int]:
        """(wrong results, typed failures, programs checked)."""
        st = self.state
        first_chaos = min((ev["t"] for ev in st.events), default=math.inf)
        wrong, typed = list(st.problems), list[str]()
        for r in st.records:
            where = f"client {r['client']} program {r['k']}: {r['detail']}"
            if r["outcome"] == "wrong":
                wrong.append(where)
            elif r["outcome"] == "typed" and r["t1"] >= first_chaos:
                typed.append(where)
            elif r["outcome"] == "typed":
                wrong.append(f"{where} (a typed error with no chaos before it)")
        return wrong, typed, sum(r["outcome"] in ("ok", "wrong") and r["k"] >= 0 for r in st.records)

    def close(self) -> None:
        for agent in (self.killer, self.failer):
            if agent is not None:
                with contextlib.suppress(Exception):  # best effort
                    bounded(agent.close, 10)


def plan_run(cfg: Config, run: int, budget: list[int | None]) -> RunPlan:
    """Everything random about run ``run``; ``budget[0]`` counts process clients still allowed."""
    rng = random.Random(cfg.seed * 1000 + run)
    topo = topology()
    clients = []
    for i in range(rng.randint(min(cfg.min_clients, cfg.max_clients), cfg.max_clients)):
        process = rng.random() < cfg.process_clients and budget[0] != 0
        if process and budget[0] is not None:
            budget[0] -= 1
        programs = rng.randint(max(2, cfg.programs_per_client // 2), cfg.programs_per_client)
        shapes = tuple(dict(rng.choice(MESH_SHAPES)) for _ in range(2))
        island = rng.randrange(topo.islands)
        islands = (island, island if rng.random() < 0.5 else rng.randrange(topo.islands))
        plan = ClientPlan(i, f"stress-{'p' if process else 't'}{i}", rng.choice(WEIGHTS), process,
                          rng.randint(1, cfg.max_depth), programs, cfg.max_steps, rng.randrange(2**32),
                          shapes, islands)
        if cfg.chaos and rng.random() < (cfg.process_kill if process else cfg.client_chaos):
            at = rng.randint(max(1, programs // 3), programs - 1)  # mid-stream, after some results
            if process:
                plan.kill_after = at
            else:
                plan.close_after = at
        clients.append(plan)
    kill = None
    if cfg.chaos and cfg.processes and rng.random() < cfg.worker_kill:
        kill = rng.randint(1, max(1, sum(c.programs for c in clients) // 2))
    fail = None
    if cfg.chaos and rng.random() < cfg.dispatch_fail:
        fail = rng.randint(1, max(1, sum(c.programs for c in clients) // 2))
    return RunPlan(cfg.seed * 1000 + run, rng.choice(["fifo", "proportional"]), rng.uniform(0, 0.003),
                   clients, kill, rng.randrange(topo.num_hosts), fail)


def run_once(cfg: Config, plan: RunPlan, index: int) -> dict[str, Any]:
    """One fresh system, its clients and chaos; the run's report."""
    start = time.perf_counter()
    system = LocalSystem(topology(), processes=cfg.processes, dashboard_address=None, policy=plan.policy,
                         dispatch_jitter=plan.jitter)
    system.start()
    run = Run(system, cfg, plan)
    diagnosis = None
    try:
        run.start()
        hang = run.watch()
        if hang is not None:
            try:
                diagnosis = str(bounded(system.diagnose, 30))
            except Exception as e:  # noqa: BLE001 - the hang is the finding; this only explains it
                diagnosis = f"(diagnose failed: {type(e).__name__}: {e})"
            run.abandon()
        run.join()
        left, left_error = (0, None) if hang else run.leftover()
    finally:
        run.close()
        with contextlib.suppress(Exception):  # move on to the next fresh system
            bounded(system.close, 60)
    wrong, typed, checked = run.judge()
    return {
        "run": index, "seed": plan.seed, "policy": plan.policy, "dispatch_jitter": plan.jitter,
        "processes": cfg.processes, "clients": [asdict(c) for c in plan.clients],
        "kill_worker_after": plan.kill_worker_after,
        "chaos_events": [{**e, "t": e["t"] - run.t0} for e in run.state.events],
        "hang": hang is not None, "hang_reason": hang, "diagnosis": diagnosis,
        "wrong": wrong, "typed_failures": typed, "programs_checked": checked,
        "programs_ended": run.state.ended, "bytes_left": left, "leftover_error": left_error,
        "stall_end_s": run.stall_end(), "seconds": time.perf_counter() - start,
        "failed_programs": [{**r, "t0": r["t0"] - run.t0, "t1": r["t1"] - run.t0} for r in run.state.records
                            if r["outcome"] != "ok"],
    }


def _line(r: dict[str, Any], runs: int) -> str:
    procs = sum(c["process"] for c in r["clients"])
    chaos = ",".join(e["kind"] for e in r["chaos_events"]) or "none"
    stall = "-" if r["stall_end_s"] is None else f"{r['stall_end_s']:.2f}s"
    status = "HANG" if r["hang"] else ("FAIL" if r["wrong"] or r["bytes_left"] or r["leftover_error"] else "ok")
    return (f"run {r['run'] + 1}/{runs} seed {r['seed']}: {status}; {len(r['clients'])} client(s) ({procs} proc), "
            f"{r['policy']}, jitter {r['dispatch_jitter'] * 1e3:.1f} ms, chaos {chaos}; "
            f"{r['programs_checked']} checked, {len(r['typed_failures'])} typed failure(s), "
            f"{len(r['wrong'])} wrong, {r['bytes_left']} bytes left, stall_end {stall}, {r['seconds']:.1f} s")


def _one(cfg: Config, index: int, budget: list[int | None], echo: Echo) -> dict[str, Any]:
    """Run ``index``, with its progress line and, for a failed run, what went wrong."""
    r = run_once(cfg, plan_run(cfg, index, budget), index)
    echo(_line(r, cfg.runs))
    for problem in r["wrong"][:5]:
        echo(f"  wrong: {problem}")
    if r["hang"]:
        echo(f"  hang: {r['hang_reason']}\n{r['diagnosis']}")
    if r["leftover_error"]:
        echo(f"  leftover: {r['leftover_error']}")
    return r


def summarize(runs: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    stalls = [r["stall_end_s"] for r in runs if r["stall_end_s"] is not None]
    return {
        "runs": len(runs),
        "runs_with_hangs": sum(r["hang"] for r in runs),
        "wrong_results": sum(len(r["wrong"]) for r in runs),
        "runs_with_bytes_left": sum(bool(r["bytes_left"] or r["leftover_error"]) for r in runs),
        "programs_checked": sum(r["programs_checked"] for r in runs),
        "typed_failures": sum(len(r["typed_failures"]) for r in runs),
        "max_stall_end_s": max(stalls) if stalls else None,
        "runs_per_minute": 60 * len(runs) / seconds if seconds else None,
    }


class ClosedCommFilter(logging.Filter):
    """Drops the scheduler's "Closed comm ... while trying to write" for clients closed mid-stream
    on purpose (that is the chaos); everything else is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Closed comm")


def run(cfg: Config, out: str = "bench-results", echo: Echo = print) -> dict[str, Any]:
    """Run ``cfg.runs`` fresh systems; print a line per run and a summary; write ``<out>/stress.json``.

    Returns ``{"config", "runs": [per-run reports], "summary"}``; failures are reported, not raised.
    """
    budget: list[int | None] = [cfg.process_client_budget]
    reports = []
    start = time.perf_counter()
    echo(f"pathdask bench stress: {cfg.runs} run(s), seed {cfg.seed}, "
         f"{'worker processes' if cfg.processes else 'threads'}, hang after {cfg.hang_seconds:g}s")
    quiet = ClosedCommFilter()
    logging.getLogger("distributed.scheduler").addFilter(quiet)
    try:
        for i in range(cfg.runs):
            reports.append(_one(cfg, i, budget, echo))
    finally:
        logging.getLogger("distributed.scheduler").removeFilter(quiet)
    summary = summarize(reports, time.perf_counter() - start)
    echo(table(["runs", "runs with hangs", "wrong results", "runs with bytes left", "programs checked",
                "typed failures", "max stall_end_s", "runs per minute"],
               [[summary[k] for k in ("runs", "runs_with_hangs", "wrong_results", "runs_with_bytes_left",
                                      "programs_checked", "typed_failures", "max_stall_end_s",
                                      "runs_per_minute")]]))
    result = {"config": asdict(cfg), "runs": reports, "summary": summary}
    write_json(os.path.join(out, "stress.json"), result)
    echo(f"wrote {os.path.join(out, 'stress.json')}")
    return result
