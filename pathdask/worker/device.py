"""Device streams: one per modelled device, running gangs in the global order (``driver.py``
says which thread runs each)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

from ..core.bounded import newest
from ..core.ledger import HostProgram
from ..stopwatch import mark
from ..topology import DeviceInfo
from .driver import Driver, Waitable
from .execute import run_op
from .host import Host


class Head(NamedTuple):
    """What a device is doing: ``dispatch`` (its head is not dispatched here yet) or ``run``."""

    pid: str
    phase: str
    gang: str
    since: float  # time.monotonic()


class GangRecord(NamedTuple):
    """One gang a device ran: ``time.perf_counter()`` times and the bytes it moved.

    ``bytes_in`` came to this device from other devices during the gang (its
    collectives and reshards); ``bytes_out`` left it for other devices.

    A stream keeps its records as plain tuples, which the garbage collector stops
    tracking (it never untracks a tuple subclass): tens of thousands of records
    would otherwise be scanned by every full collection, a pause of a tenth of a
    second in one process. They are named when read.
    """

    start: float
    end: float
    program: str
    gang: str
    client: str
    bytes_in: int
    bytes_out: int
    name: str  # the program's name


class DeviceStream:
    """A FIFO stream of programs for one device.

    Program ids enter ``order`` in slot order (from the scheduler's order
    messages). The stream runs the head only once its ops have been dispatched
    to this host, and never runs ahead of it, even if a later program is ready:
    that is what keeps collectives free of deadlock. A dropped head is ready
    too: the stream pops it without running anything, so it never waits on a
    program that can no longer be dispatched.

    Threads: ``order``, ``closing``, ``gaps``, ``timeline`` and ``recorded`` are
    guarded by ``cond``. ``head`` and the counters are written only by the device
    thread; others read them (``head`` is an immutable tuple, replaced whole).
    """

    def __init__(self, host: Host, info: DeviceInfo, driver: Driver | None = None) -> None:
        self.host = host
        self.info = info
        self.order: deque[str] = deque()
        self.cond = Waitable(driver)
        self.closing = False
        self.busy_s = 0.0
        self.gangs_run = 0
        self.exchanges = 0
        self.exchange_wait_s = 0.0  # real time spent waiting for peers' pieces
        self.head: Head | None = None
        self.gaps: deque[float] = deque(maxlen=4096)  # idle time between back-to-back gangs
        self.bytes_in = 0  # bytes received from other devices (exchanges)
        self.bytes_out = 0  # bytes sent to other devices
        #: recent gangs, for timelines and the dashboard; ``recorded`` counts every one ever
        self.timeline: deque[tuple[Any, ...]] = deque(maxlen=20000)  # GangRecord fields
        self.recorded = 0

    def enqueue(self, pid: str) -> None:
        with self.cond:
            self.order.append(pid)
            self.cond.notify()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()

    @property
    def pending(self) -> int:
        with self.cond:
            return len(self.order)

    def queue(self, limit: int = 8) -> list[str]:
        """The first ``limit`` programs waiting behind the head."""
        with self.cond:
            return [pid for _, pid in zip(range(limit), self.order)]

    def gaps_snapshot(self) -> list[float]:
        with self.cond:
            return list(self.gaps)

    def timeline_since(self, since: float = 0.0) -> list[tuple[float, float, str, str, str]]:
        """(start, end, program, gang, client) of the timeline entries started after ``since``."""
        with self.cond:
            return [t[:5] for t in self.timeline if t[0] >= since]

    def records_after(self, cursor: int) -> tuple[list[GangRecord], int]:
        """The gangs recorded since ``cursor`` (a previous return's count) and the new count.

        A cursor from before this stream existed (larger than its count) reads all it has.
        """
        with self.cond:
            return [GangRecord._make(r) for r in newest(self.timeline, self.recorded, cursor)], self.recorded

    def reset_observations(self) -> None:
        with self.cond:
            self.gaps.clear()
            self.timeline.clear()

    def _next(self) -> str | None:
        with self.cond:
            while not self.closing:
                if self.order:
                    pid = self.order[0]
                    if self.host.ledger.ready(pid):
                        return self.order.popleft()
                    if self.head is None or self.head.pid != pid:
                        self.head = Head(pid, "dispatch", "", time.monotonic())
                else:
                    self.head = None
                # The head is not dispatched yet: wait, and never run a later program first.
                self.cond.wait()
            return None

    def _wait_release(self, prog: HostProgram, gang: int) -> None:
        """Sequential dispatch: hold the device until this gang's Dask task released it."""
        with self.cond:
            while gang not in (prog.released or ()) and prog.check(gang) is None and not self.closing:
                self.cond.wait(0.1)

    def run(self) -> None:
        """The device's loop, on a thread of its own or a greenlet of its host's driver."""
        last_end: float | None = None  # end of the previous gang if another one was queued
        clock = 0.0  # modelled end of the previous gang
        while True:
            pid = self._next()
            if pid is None:
                return
            prog = self.host.ledger.get(pid)  # None: dropped before it was dispatched here
            ops = prog.plan.ops.get(self.info.id, ()) if prog is not None else ()
            for i, op in enumerate(ops):
                assert prog is not None
                gang = prog.plan.gangs[op.gang].name
                if prog.released is not None:
                    self.head = Head(pid, "release", gang, time.monotonic())
                    self._wait_release(prog, op.gang)
                    last_end = None  # waiting for dispatch is not a back-to-back gap
                self.head = Head(pid, "run", gang, time.monotonic())
                moved = self.bytes_in, self.bytes_out
                mark("run", pid)
                begin = time.perf_counter()
                clock = run_op(self.host, prog, self.info, op, clock if last_end is not None else None)
                end = time.perf_counter()
                with self.cond:
                    if last_end is not None:
                        self.gaps.append(begin - last_end)
                    self.timeline.append((begin, end, pid, gang, prog.client, self.bytes_in - moved[0],
                                          self.bytes_out - moved[1], prog.plan.name))
                    self.recorded += 1
                    backlog = i + 1 < len(ops) or bool(self.order)
                if prog.released is not None:
                    self.host.gang_done(prog, self.info.id, op.gang)
                last_end = end if backlog else None
            self.head = None
            self.host.device_done(pid, self.info.id)
