"""A scheduler with a thread and a CPU of its own, its hosts in the same process.

``pathdask bench dispatch --hosts`` measures the scheduler plugin's CPU per call
(:class:`~pathdask.scheduler.meter.CallMeter`) as the hosts a call uses grow. In
an embedded system (``LocalSystem(processes=False)``) the hosts' handlers run on
the scheduler's event loop, between its own handlers of each call, and the
device threads run on the same CPUs: what they leave in the CPU's caches, the
scheduler's next handler pays for, and the more hosts a call wakes, the more
that is. A deployed scheduler has a machine of its own.

:class:`ApartSystem` runs the hosts on an event loop of their own, another thread
of this process (all hosts still share one interpreter: threads mode), and
:func:`cpu_of_its_own` pins the scheduler's thread, and the client's, to one CPU
and every other thread to the others. What the plugin's meter reads there is its
own work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from distributed import LocalCluster, Worker

from ..affinity import can_pin, pin
from ..system import LocalSystem

__all__ = ["ApartSystem", "cpu_of_its_own"]

#: seconds the hosts have to start, and then to close
START_TIMEOUT = 120.0


class ApartSystem(LocalSystem):
    """A :class:`~pathdask.LocalSystem` in threads mode whose hosts run on an event loop (a
    thread) of their own instead of the scheduler's; its clients share the scheduler's."""

    def __init__(self, topology: Any, **kwargs: Any) -> None:
        super().__init__(topology, processes=False, dashboard_address=None, **kwargs)
        self._hosts_loop: asyncio.AbstractEventLoop | None = None
        self._hosts_thread: threading.Thread | None = None
        self._workers: list[Worker] = []

    def _make_cluster(self) -> LocalCluster:
        """The scheduler alone, then the hosts, on their own event loop, connected to it."""
        kwargs = self._cluster_kwargs
        self.cluster = LocalCluster(**{**kwargs, "n_workers": 0})
        try:
            loop = self._hosts_loop = asyncio.new_event_loop()
            self._hosts_thread = threading.Thread(target=loop.run_forever, name="pathdask-hosts-loop", daemon=True)
            self._hosts_thread.start()
            address = self.cluster.scheduler_address

            async def start_hosts() -> list[Worker]:
                return [await Worker(address, name=i, nthreads=kwargs["threads_per_worker"], host=kwargs["host"],
                                     memory_limit=kwargs["memory_limit"], data=kwargs["data"], dashboard=False)
                        for i in range(self.topology.num_hosts)]

            self._workers = asyncio.run_coroutine_threadsafe(start_hosts(), loop).result(START_TIMEOUT)
        except BaseException:
            self.close()
            raise
        return self.cluster

    def _stop(self) -> None:
        loop = self._hosts_loop
        if loop is not None:
            async def close_hosts() -> None:
                await asyncio.gather(*(w.close() for w in self._workers), return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(close_hosts(), loop).result(START_TIMEOUT)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                if self._hosts_thread is not None:
                    self._hosts_thread.join(START_TIMEOUT)
                loop.close()
                self._hosts_loop, self._hosts_thread, self._workers = None, None, []
        super()._stop()


@contextlib.contextmanager
def cpu_of_its_own(threads: set[int]) -> Iterator[int | None]:
    """Run ``threads`` (native thread ids of this process) on one CPU, and every other
    thread of this process, and those they start meanwhile, on the other CPUs it may use.
    Yields that CPU, or ``None`` where there is no second CPU or threads cannot be pinned
    (then nothing changes). On exit every thread may use them all again."""
    allowed = os.sched_getaffinity(0) if can_pin() else set()
    if len(allowed) < 2:
        yield None
        return
    own = min(allowed)
    pin(lambda tid: {own} if tid in threads else allowed - {own})
    try:
        yield own
    finally:
        pin(lambda tid: allowed)
