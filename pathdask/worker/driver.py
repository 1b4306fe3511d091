"""How a host's device streams get a thread: one each, or one driver for all.

``pathdask.driver: host`` (the default) runs every device stream of a host as a
greenlet on one driver thread, as a real host's CPU drives its accelerators
from one runtime. A device's wait (for its dispatch, for its peers' pieces in a
collective, for memory, for its modelled time) yields to the driver, which runs
the host's other devices meanwhile, and blocks only when every device waits.
Compared with a thread per device (``pathdask.driver: device``) that saves a
thread hand-off (and a fight for the GIL) per device per gang, and the pieces
that the host's devices send to one peer host in one collective go as one
message (:meth:`Driver.defer`).

What a device waits on is a :class:`Waitable`, a ``threading.Condition``
whose ``wait``, on a device greenlet, parks that greenlet instead of blocking
the thread, and whose ``notify`` wakes the driver. Other threads (the worker's
event loop, socket receivers) use it as a plain condition. Waits keep their
semantics: they may wake spuriously, and every caller re-checks in a loop.

Kernel bodies that compute for real (NumPy) run one device at a time on a
host here; with ``device`` they may overlap where NumPy releases the GIL. A
device about to run a body yields once first (:func:`yield_to_others`): the
devices woken with it (at the end of a collective they all waited on, say) end
their waits before that compute holds the thread. A body that blocks for real
(``time.sleep``, I/O) holds its host's other devices meanwhile: model device
time with a function's ``cost=`` instead.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from greenlet import getcurrent, greenlet

logger = logging.getLogger("pathdask.worker")

DRIVERS = ("host", "device")

#: the driver whose greenlet is running on this thread, if any
_current: contextvars.ContextVar[Driver | None] = contextvars.ContextVar("pathdask_driver", default=None)


def current() -> Driver | None:
    """The driver of the device greenlet that calls, or ``None`` (a thread of its own)."""
    return _current.get()


class Driver:
    """One thread running device streams' loops (:meth:`drive`) as greenlets.

    ``flush(outbox)`` sends the pieces that devices deferred (:meth:`defer`),
    per peer address; the driver calls it whenever the devices that could run
    have run, before it blocks. It runs on the driver thread, so it must fail
    the gangs of pieces it cannot send itself: their senders have moved on.

    Threads: ``gen`` and ``sleeping`` are guarded by ``cond``; ``parked``, ``yielded`` and
    ``outbox`` are touched only on the driver thread.
    """

    def __init__(self, name: str, flush: Callable[[dict[str, list[Any]]], None]) -> None:
        self.flush = flush
        self.targets: list[Callable[[], None]] = []
        self.cond = threading.Condition(threading.Lock())
        self.gen = 0  # counts pokes: a greenlet parked at an older count may go on
        self.sleeping = False  # the driver waits in ``_woken``: a poke must notify it
        self.parked: dict[greenlet, tuple[int | None, float | None]] = {}
        self.yielded: list[greenlet] = []
        self.outbox: dict[str, list[Any]] = defaultdict(list)
        self.hub: greenlet | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def drive(self, targets: list[Callable[[], None]]) -> threading.Thread:
        """The (unstarted) thread that will run ``targets``, each a device's loop."""
        self.targets = targets
        return self.thread

    # -- any thread --------------------------------------------------------------
    def poke(self) -> None:
        """Something a device may wait for changed: let the parked devices look again."""
        with self.cond:
            self.gen += 1
            if self.sleeping:
                self.cond.notify()

    # -- device greenlets ----------------------------------------------------------
    def token(self) -> int:
        with self.cond:
            return self.gen

    def park(self, token: int | None, deadline: float | None) -> None:
        """Give the thread to the other devices until a poke after ``token`` (``None``: none
        counts) or ``deadline`` (``time.perf_counter``), whichever comes first."""
        assert self.hub is not None
        self.parked[getcurrent()] = (token, deadline)
        self.hub.switch()

    def pause(self) -> None:
        """Let the host's other devices run first (say, up to their part of this exchange)."""
        assert self.hub is not None
        self.yielded.append(getcurrent())
        self.hub.switch()

    def defer(self, outbox: dict[str, list[Any]]) -> None:
        """Send the pieces of ``outbox`` (by peer address) with the other devices' pieces for
        the same peers, once they ran."""
        for address, pieces in outbox.items():
            self.outbox[address].extend(pieces)

    # -- the driver thread ---------------------------------------------------------
    def _run(self) -> None:
        self.hub = getcurrent()
        live = [greenlet(self._guard(t)) for t in self.targets]
        ready = list(live)
        while live:
            for g in ready:
                g.switch()
            live = [g for g in live if not g.dead]
            if self.outbox:
                outbox, self.outbox = self.outbox, defaultdict(list)
                try:
                    self.flush(outbox)
                except Exception:  # the devices must go on: a dead driver would hang its host
                    logger.exception("pathdask: sending deferred pieces failed")
            ready, self.yielded = self.yielded, []
            ready += self._woken(block=not ready)

    def _woken(self, block: bool) -> list[greenlet]:
        """The parked greenlets that may go on; waits for one if ``block``."""
        with self.cond:
            while True:
                now = time.perf_counter()
                woken = [g for g, (token, deadline) in self.parked.items()
                         if (token is not None and token != self.gen) or (deadline is not None and deadline <= now)]
                if woken or not block or not self.parked:
                    break
                deadlines = [d for _, d in self.parked.values() if d is not None]
                self.sleeping = True
                try:
                    self.cond.wait(min(deadlines) - now if deadlines else None)
                finally:
                    self.sleeping = False
        for g in woken:
            del self.parked[g]
        return woken

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            _current.set(self)
            try:
                target()
            except Exception:  # as a thread of its own would: the others go on
                logger.exception("pathdask device stream %s failed", getattr(target, "__name__", target))
        return run


class Waitable(threading.Condition):
    """A condition whose ``wait`` on a device greenlet of ``driver`` parks it (see the module).

    ``driver`` is ``None`` where each device has a thread: then it is a plain condition.
    """

    def __init__(self, driver: Driver | None = None) -> None:
        super().__init__()  # an RLock, as threading.Condition's
        self.driver = driver

    def wait(self, timeout: float | None = None) -> bool:
        d = self.driver
        if d is None or current() is not d:
            return super().wait(timeout)
        token = d.token()  # before the lock goes: a notify after it wakes us
        saved = self._release_save()  # type: ignore[attr-defined]
        try:
            d.park(token, None if timeout is None else time.perf_counter() + timeout)
        finally:
            self._acquire_restore(saved)  # type: ignore[attr-defined]
        return True

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        if self.driver is not None:
            self.driver.poke()

    def notify_all(self) -> None:
        super().notify_all()
        if self.driver is not None:
            self.driver.poke()


def yield_to_others() -> None:
    """On a host's driver thread, let the host's other devices that may run go first; on a
    thread of its own, nothing. A device about to hold the thread with a kernel body's compute
    calls it, so that the devices woken with it (say, at the end of a collective they all waited
    on) end what they were woken for before that compute: else they wait for it, and the
    devices of other hosts then wait for them."""
    d = current()
    if d is not None:
        d.pause()


def sleep_until(deadline: float) -> None:
    """Hold the calling device until ``deadline`` (``time.perf_counter``), yielding the host's
    thread to its other devices where they share one."""
    d = current()
    if d is not None:
        d.park(None, deadline)
    else:
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
