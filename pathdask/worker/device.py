"""Device streams: one thread per modelled device, running gangs in the global order."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from ..topology import DeviceInfo
from .execute import run_op

if TYPE_CHECKING:
    from .runtime import HostProgram, HostRuntime


class DeviceStream:
    """A FIFO stream of programs for one device.

    Program ids enter ``order`` in slot order (from the scheduler's order
    messages). The stream runs the head only once its ops have been dispatched
    to this host, and never runs ahead of it, even if a later program is ready:
    that is what keeps collectives free of deadlock.
    """

    def __init__(self, rt: HostRuntime, info: DeviceInfo) -> None:
        self.rt = rt
        self.info = info
        self.order: deque[str] = deque()
        self.cond = threading.Condition()
        self.closing = False
        self.busy_s = 0.0
        self.gangs_run = 0
        self.exchanges = 0
        self.exchange_wait_s = 0.0  # real time spent waiting for peers' pieces
        self.running: str | None = None
        self.gaps: deque[float] = deque(maxlen=4096)  # idle time between back-to-back gangs
        #: (start, end, program, gang name, client) of recent gangs, for timelines
        self.timeline: deque[tuple[float, float, str, str, str]] = deque(maxlen=20000)
        self.thread = threading.Thread(
            target=self._run, name=f"pathdask-device-{info.id}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

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
        return len(self.order)

    def _next(self) -> str | None:
        with self.cond:
            while not self.closing:
                if self.order and self.rt.is_dispatched(self.order[0], self.info.id):
                    pid = self.order.popleft()
                    self.running = pid
                    return pid
                # The head is not dispatched yet: wait, and never run a later program first.
                self.cond.wait()
            return None

    def _wait_release(self, prog: HostProgram, gang: int) -> None:
        """Sequential dispatch: hold the device until this gang's Dask task released it."""
        with self.cond:
            while gang not in (prog.released or ()) and prog.check(gang) is None and not self.closing:
                self.cond.wait(0.1)

    def _run(self) -> None:
        last_end: float | None = None  # end of the previous gang if another one was queued
        clock = 0.0  # modelled end of the previous gang
        while True:
            pid = self._next()
            if pid is None:
                return
            prog = self.rt.programs.get(pid)
            ops = prog.plan.ops.get(self.info.id, ()) if prog is not None else ()
            for i, op in enumerate(ops):
                assert prog is not None
                if prog.released is not None:
                    self._wait_release(prog, op.gang)
                    last_end = None  # waiting for dispatch is not a back-to-back gap
                begin = time.perf_counter()
                if last_end is not None:
                    self.gaps.append(begin - last_end)
                clock = run_op(self.rt, prog, self.info, op, clock if last_end is not None else None)
                self.gangs_run += 1
                self.timeline.append((begin, time.perf_counter(), pid, prog.plan.gangs[op.gang].name,
                                      prog.client))
                if prog.released is not None:
                    self.rt.gang_done(prog, self.info.id, op.gang)
                backlog = i + 1 < len(ops) or bool(self.order)
                last_end = time.perf_counter() if backlog else None
            self.running = None
            self.rt.device_done(pid, self.info.id)
