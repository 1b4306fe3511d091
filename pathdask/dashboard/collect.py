"""``Collector``: pulls device activity from the hosts into the scheduler's record.

Pull, not push: hosts keep their own bounded timelines, so nothing crosses
the network while nobody looks. While a page or an API route is watched
(``watch()``), the collector pulls every ``pathdask.dashboard.interval``; a
reader that needs fresh data (an API request, a trace) awaits ``refresh()``.
Concurrent refreshes share one pull. It runs on the scheduler's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol

import dask
from dask.utils import parse_timedelta
from tornado.ioloop import PeriodicCallback

from ..protocol import HostActivity
from .record import ActivityRecord

logger = logging.getLogger("pathdask.dashboard")

class Ask(Protocol):
    """``ask(message, timeout=seconds)``: the replies by host address, of those that answered
    in time (the scheduler plugin's ``ask_hosts``)."""

    def __call__(self, msg: HostActivity, *, timeout: float | None) -> Awaitable[dict[str, Any]]: ...


class Collector:
    """Keeps an :class:`ActivityRecord` fed from the hosts.

    Parameters
    ----------
    ask : callable
        Sends a message to every live host and returns the replies, by address, of those
        that answered within ``timeout`` seconds (the scheduler plugin's ``ask_hosts``).
        A host left out of one pull is asked again, from where it was, at the next.
    """

    def __init__(self, ask: Ask) -> None:
        cfg = dask.config.get("pathdask.dashboard")
        self.ask = ask
        self.record = ActivityRecord(int(cfg["gangs"]), int(cfg["samples"]))
        self.interval = parse_timedelta(cfg["interval"])
        self.watch_timeout = parse_timedelta(cfg["watch-timeout"])
        self.pull_timeout = parse_timedelta(cfg["pull-timeout"])
        self.window = parse_timedelta(cfg["window"])
        self.watched_until = 0.0  # time.monotonic()
        self.pulled_at = float("-inf")  # time.monotonic() of the last finished pull
        self._pull: asyncio.Task[None] | None = None
        self._callback = PeriodicCallback(self._tick, self.interval * 1000)

    def start(self) -> None:
        self._callback.start()

    def stop(self) -> None:
        self._callback.stop()

    def watch(self) -> None:
        """Someone looks: keep pulling for ``pathdask.dashboard.watch-timeout`` from now."""
        self.watched_until = time.monotonic() + self.watch_timeout

    @property
    def watched(self) -> bool:
        return time.monotonic() < self.watched_until

    async def refresh(self, max_age: float = 0.0, timeout: float | None = None) -> bool:
        """Pull unless the record is younger than ``max_age`` seconds; ``False`` if ``timeout``
        passed first (the record is then older, and the pull goes on)."""
        if time.monotonic() - self.pulled_at < max_age:
            return True
        if self._pull is None:
            self._pull = asyncio.ensure_future(self._pull_once())
        try:
            await asyncio.wait_for(asyncio.shield(self._pull), timeout)
        except TimeoutError:
            return False
        return True

    async def _pull_once(self) -> None:
        try:
            message = HostActivity(self.record.cursor_message(), self.record.gangs.maxlen or 0)
            self.record.add(await self.ask(message, timeout=self.pull_timeout))
        except Exception:  # a pull that fails leaves the record as it was; the next one retries
            logger.exception("pathdask: pulling device activity from the hosts failed")
        finally:
            self.pulled_at = time.monotonic()
            self._pull = None

    def _tick(self) -> None:
        if self.watched and self._pull is None:
            self._pull = asyncio.ensure_future(self._pull_once())
