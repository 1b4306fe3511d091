"""What a host answers: its clients' fetches and status, and the scheduler's observation.

:class:`HostAnswers` is the half of :class:`~pathdask.worker.runtime.HostRuntime`
that serves requests (``protocol.Fetch``, ``Status``, ``HostStats``,
``HostDiagnose``, ``HostActivity``, ``HostTransfers``, ``HostResetObservations``,
``HostWaitIdle``, and fetches on the socket transport). It only reads: the
ledger, the store, the device streams and the link model.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed.core import error_message

from ..core.ledger import Ledger
from ..core.plans import PlanCache
from ..gather import INLINE_BYTES, encode_block
from ..stopwatch import mark
from ..topology import DeviceInfo
from .activity import activity
from .dataplane import picklable
from .device import DeviceStream
from .futures import resolve
from .links import LinkModel
from .observe import diagnose, host_stats
from .store import BufferStore
from .transfer import Mailbox
from .transport import Answer

if TYPE_CHECKING:
    from distributed import Worker


class HostAnswers:
    """Requests a host answers. See the module docstring."""

    worker: Worker | None
    address: str
    island: int
    host: int
    mailbox: Mailbox
    plans: PlanCache
    ledger: Ledger
    store: BufferStore
    streams: dict[int, DeviceStream]
    links: LinkModel
    devices: dict[int, DeviceInfo]
    loop: asyncio.AbstractEventLoop
    _idle_waiters: list[asyncio.Future[None]]

    async def fetch(self, buffers: list[tuple[str, int, int]]) -> dict[str, Any]:
        """The values of program buffers on this host, once computed (client ``.result()``).

        A failed program is an answer, not a handler error: ``{"error": ...}`` carries the
        exception (``error_message``) for the client to raise, and nothing is logged here.
        """
        try:
            out = []
            for pid, vid, dev in buffers:
                cause = self._dropped(pid)
                if cause is not None:
                    return {"error": error_message(cause)}
                out.append(encode_block(await self.store.wait_value((pid, vid), dev)))
            return {"values": out}
        except Exception as e:
            return {"error": error_message(e)}

    def serve(self, request: tuple[str, Any], answer: Answer) -> Callable[[], None]:
        """A client's request on the socket transport (``client/fetch.py``), taken on its receiver
        thread: ``("fetch", buffers)`` is answered ``("values", arrays)`` once they are computed,
        by the thread that stores the last of them, or ``("error", exception)`` with the error
        that ended their program. Returns what stops the waiting (the asker hung up)."""
        kind, buffers = request
        if kind != "fetch":
            answer.give(("error", ValueError(f"unknown request {kind!r}; expected 'fetch'")))
            return _nothing
        for pid, _, _ in buffers:
            cause = self._dropped(pid)
            if cause is not None:
                answer.give(("error", cause))
                return _nothing
        return Gathering(self.store, buffers, answer).stop

    def _dropped(self, pid: str) -> BaseException | None:
        """Why ``pid`` was dropped here, ready to send; ``None`` if it was not. Given, never
        raised: each raise of the stored cause would add to its traceback."""
        cause = self.ledger.dropped(pid)
        return None if cause is None else picklable(cause)

    def status(self, buffers: list[tuple[str, int, int]]) -> list[str]:
        """Per buffer ``pending``, ``ready`` or ``error``, without waiting."""
        return ["error" if self.ledger.dropped(pid) is not None else self.store.state((pid, vid), dev)
                for pid, vid, dev in buffers]

    def stats(self) -> dict[str, Any]:
        return host_stats(self)

    def diagnose(self) -> dict[str, Any]:
        return diagnose(self)

    def activity(self, cursors: dict[str, list[tuple[int, int]]], limit: int) -> dict[str, Any]:
        """New gangs since the scheduler's cursors, with memory and link bytes (the dashboard)."""
        return activity(self, cursors, limit)

    def transfers(self) -> list[tuple[float, float, int, int, str, int]]:
        """The modelled transfers that arrived here (start, end, src, dst, link, bytes), wall-clock."""
        offset = time.time() - time.perf_counter()
        return [(t.start + offset, t.end + offset, *t[2:]) for t in self.links.recent()]

    def reset_observations(self) -> None:
        """Forget recorded gaps, timelines and transfers (benchmarks call this between runs)."""
        for s in self.streams.values():
            s.reset_observations()
        self.links.reset()

    def _is_idle(self) -> bool:
        return self.ledger.idle() and not any(s.pending or s.head for s in self.streams.values())

    async def wait_idle(self) -> dict[str, Any]:
        """Wait until this host holds no buffers and runs no program; return its stats."""
        while True:
            await self.store.wait_empty()
            if self._is_idle():
                return self.stats()
            fut = self.loop.create_future()
            self._idle_waiters.append(fut)
            await fut

    def _wake_idle(self) -> None:
        """Let ``wait_idle`` look again (event loop)."""
        waiters, self._idle_waiters = self._idle_waiters, []
        for fut in waiters:
            resolve(fut)


def _nothing() -> None:
    """Nothing to stop: the answer was given at once."""


class Gathering:
    """One fetch's values, gathered as their buffers settle (from the threads that settle them),
    then given as one answer: small values by the thread that stored the last, at once."""

    __slots__ = ("answer", "values", "left", "lock", "stops", "pid")

    def __init__(self, store: BufferStore, buffers: list[tuple[str, int, int]], answer: Answer) -> None:
        self.answer = answer
        self.values: list[np.ndarray | None] = [None] * len(buffers)
        self.left = len(buffers)
        self.lock = threading.Lock()
        self.pid = buffers[0][0] if buffers else ""
        self.stops: list[Callable[[], None]] = []
        if not buffers:
            self._give(("values", []), 0)
        for i, (pid, vid, dev) in enumerate(buffers):
            self.stops.append(store.when_settled((pid, vid), dev, functools.partial(self._settled, i)))

    def _settled(self, i: int, value: np.ndarray | None, error: BaseException | None) -> None:
        with self.lock:
            if self.left <= 0:
                return  # answered already (an error came first)
            if error is not None:
                self.left = 0
            else:
                self.values[i] = value
                self.left -= 1
                if self.left:
                    return
        if error is not None:
            self._give(("error", picklable(error)), 0)
            self.stop()
        else:
            self._give(("values", self.values), sum(v.nbytes for v in self.values if v is not None))

    def _give(self, answer: tuple[str, Any], nbytes: int) -> None:
        mark("served", self.pid)
        self.answer.give(answer, large=nbytes > INLINE_BYTES)

    def stop(self) -> None:
        """Stop waiting for the values that did not come (the asker hung up, or one failed)."""
        for stop in self.stops:
            stop()
