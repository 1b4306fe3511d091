"""Silent hosts: a host whose heartbeats stop is declared lost within ``pathdask.host-timeout``.

A host behind a dead switch port sends no FIN: its sockets stay open and its
programs wait. Dask notices only after ``distributed.scheduler.worker-ttl``
(5 minutes by default), and even with a short TTL its removal waits for an RPC
to the worker's nanny (``Scheduler.restart_workers``), which cannot reach a
partitioned machine either: 30 s more (``distributed.comm.timeouts.connect``).

:class:`HostLiveness` reads the heartbeats Dask's workers already send (every
0.5 s up to 10 workers, 1 s up to 50; ``WorkerState.last_seen``) and, once a
pathdask host has been silent for ``pathdask.host-timeout``, removes its worker
from the scheduler at once. The plugin's ``remove_worker`` hook then fails the
programs that use it with ``DeviceLostError``, as for a crashed worker. In the
background it keeps asking the worker's nanny to restart it: a host that was
alive behind the partition restarts when the link heals, and its new worker
takes its old place in the topology (``--pathdask-host N``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask.utils import parse_timedelta
from distributed.core import rpc
from distributed.metrics import time

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.scheduler")

#: the Dask event topic a silent host is announced on
TOPIC = "pathdask-host-silent"

#: how long the nanny of a host declared lost is asked, again and again, to restart it
RESTART_WINDOW = 600.0


def host_timeout() -> float:
    """``pathdask.host-timeout`` in seconds (``0`` or ``None`` turns the check off)."""
    import dask.config

    value = dask.config.get("pathdask.host-timeout", None)
    return float(parse_timedelta(value) or 0.0) if value not in (None, False) else 0.0


class HostLiveness:
    """Watches the pathdask hosts' heartbeats on the scheduler. See the module docstring.

    Parameters
    ----------
    scheduler : Scheduler
        Whose ``workers`` (``last_seen``, ``nanny``) are read and whose ``remove_worker`` is called.
    is_host : callable
        Whether a worker address is a pathdask host (workers without devices are Dask's to watch).
    timeout : float
        Seconds of silence after which a host is lost; ``0`` turns the check off.
    """

    def __init__(self, scheduler: Scheduler, is_host: Callable[[str], bool], timeout: float) -> None:
        self.scheduler = scheduler
        self.is_host = is_host
        self.timeout = timeout
        #: address -> seconds it had been silent when it was declared lost (read by membership)
        self.declared: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._restarts: set[asyncio.Task[None]] = set()

    @property
    def interval(self) -> float:
        """How often heartbeats are checked: a tenth of the timeout, between 0.1 and 1 s."""
        return min(1.0, max(0.1, self.timeout / 10))

    def start(self) -> None:
        if self.timeout and self._task is None:
            self._task = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        for task in (self._task, *self._restarts):
            if task is not None:
                task.cancel()
        self._task = None
        self._restarts.clear()

    def silence(self) -> dict[str, float]:
        """Seconds since each pathdask host's last heartbeat."""
        now = time()
        return {addr: now - ws.last_seen for addr, ws in list(self.scheduler.workers.items())
                if self.is_host(addr)}

    def silent(self, fraction: float = 0.2) -> dict[str, float]:
        """The hosts silent for longer than ``fraction`` of the timeout (a heartbeat is 0.5-2 s)."""
        threshold = max(2.0, fraction * self.timeout) if self.timeout else 2.0
        return {a: round(s, 1) for a, s in self.silence().items() if s > threshold}

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for addr, seconds in self.silence().items():
                if seconds > self.timeout and addr not in self.declared:
                    try:
                        await self._declare_lost(addr, seconds)
                    except Exception:  # one host's removal failing must not stop the watch
                        logger.exception("pathdask: could not remove silent host %s", addr)

    async def _declare_lost(self, addr: str, seconds: float) -> None:
        ws = self.scheduler.workers.get(addr)
        if ws is None:
            return
        nanny = ws.nanny
        self.declared[addr] = seconds
        logger.warning("pathdask: host %s sent no heartbeat for %.1fs (pathdask.host-timeout %gs); "
                       "its devices are lost", addr, seconds, self.timeout)
        self.scheduler.log_event(TOPIC, {"action": "host-silent", "worker": addr, "silent_s": seconds,
                                         "timeout_s": self.timeout})
        try:
            # close=False: a close order could reach the worker only when the link heals, and
            # would then stop it for good; the nanny restarts it instead (below)
            await self.scheduler.remove_worker(addr, stimulus_id=f"pathdask-host-timeout-{time()}",
                                               close=False)
        finally:
            self.declared.pop(addr, None)
        if nanny:
            task = asyncio.ensure_future(self._restart(addr, nanny))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)

    async def _restart(self, addr: str, nanny: str) -> None:
        """Ask ``nanny`` to restart its worker until it answers: at once for a hung process,
        when the link heals for a partitioned machine."""
        deadline = time() + RESTART_WINDOW
        attempt = max(2.0, self.timeout)
        while time() < deadline:
            try:
                async with rpc(nanny, connection_args=self.scheduler.connection_args, timeout=attempt) as r:
                    await asyncio.wait_for(r.kill(reason="pathdask-host-timeout"), attempt * 2)
                logger.info("pathdask: the nanny of silent host %s restarted its worker", addr)
                return
            except (OSError, TimeoutError) as e:
                logger.debug("pathdask: nanny %s of silent host %s not reachable yet: %r", nanny, addr, e)
            except Exception as e:  # noqa: BLE001 - the nanny answered: it has no worker to restart
                logger.info("pathdask: the nanny of silent host %s answered %r", addr, e)
                return
            await asyncio.sleep(1.0)
        logger.warning("pathdask: the nanny of silent host %s did not answer for %gs", addr, RESTART_WINDOW)

    def describe(self, addr: str) -> Any:
        """Why ``addr`` left, if it was declared lost here: a phrase for the error message."""
        seconds = self.declared.get(addr)
        if seconds is None:
            return None
        return f"silent for {seconds:.1f}s, past pathdask.host-timeout of {self.timeout:g}s"
