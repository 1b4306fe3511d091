"""``Hosts``: what a client asks its hosts directly, never through the scheduler.

Plans go to the hosts that run them, a program's results come back from the
hosts that hold their shards, and the hosts say how an array's shards are
(pending, ready, failed). Results come over the hosts' socket transports where
they have them (``fetch.py``), else over Dask's comms. Every question to a host
fails with :class:`~pathdask.errors.DeviceLostError` as soon as the scheduler
knows the host is gone, rather than after Dask's whole connect timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import dask
import numpy as np
from dask.utils import parse_timedelta
from distributed import Client as DaskClient

from ..errors import ClientClosedError, DeviceLostError
from ..gather import OutputRef, gather
from ..protocol import Fetch, HostsGone, Message, Status, TransportOf, WaitHostGone, ask
from .fetch import HOST_CHECK_AFTER, HostSockets, Unreachable
from .observe import Observer

__all__ = ["Hosts"]

logger = logging.getLogger("pathdask.client")


class Hosts:
    """A client's line to the hosts of its system, over the Dask client ``dask``.

    ``info`` is the scheduler's answer to the client's registration: where the
    hosts' socket transports listen, and their token.
    """

    def __init__(self, dask_client: DaskClient, info: dict[str, Any], observer: Observer) -> None:
        self.dask = dask_client
        self._observer = observer
        #: results come over the hosts' socket transports where they have them (``fetch.py``)
        self._sockets: HostSockets | None = None
        if info.get("transports") and dask.config.get("pathdask.transport") == "socket":
            security = self.dask.security
            self._sockets = HostSockets(info["transport_token"], info["transports"],
                                        security.get_connection_args("client").get("ssl_context"),
                                        self.transport_of, self.hosts_gone, self.left_within)

    async def ask(self, addr: str, msg: Message, role: str) -> Any:
        """Send host ``addr`` an RPC record (``protocol.py``); ``DeviceLostError`` as soon as the host is known gone.

        ``role`` says what the host is to this question, for the error ("holds shards of this array").
        """
        gone = DeviceLostError(f"Host {addr}, which {role}, left the cluster")
        try:
            return await _unless_gone(ask(self.dask.rpc(addr), msg),
                                      lambda: ask(self.dask.scheduler, WaitHostGone(addr)), gone)
        except OSError as e:  # CommClosedError is one
            raise DeviceLostError(f"Host {addr}, which {role}, is gone ({type(e).__name__}: {e})") from e

    def status(self, ref: OutputRef) -> str:
        """``error`` if any shard of ``ref`` failed, ``ready`` once all are computed, else ``pending``."""
        async def ask() -> list[list[str]]:
            return list(await asyncio.gather(*(
                self.ask(addr, Status([b for _, b in items]), "holds shards of this array")
                for addr, items in ref.shards().items())))

        try:
            states = {s for reply in self.dask.sync(ask) for s in reply}
        except (OSError, DeviceLostError):
            return "error"  # a host holding shards is gone
        return "error" if "error" in states else "pending" if "pending" in states else "ready"

    def fetch(self, ref: OutputRef, timeout: Any = None, avoid: frozenset[int] = frozenset()) -> np.ndarray:
        """The global array of ``ref``'s shards, once computed (from devices not in ``avoid``)."""
        seconds = parse_timedelta(timeout) if timeout is not None else None
        if self._sockets is not None:
            try:
                return self._sockets.fetch(ref, avoid, seconds)
            except Unreachable as e:
                logger.warning("pathdask: %s; results come over Dask's comms from now on", e)
                self._sockets.close()
                self._sockets = None
            except TimeoutError:
                assert seconds is not None
                raise _not_ready(ref, seconds, self.dask.sync(self._observer.waiting_for, ref.pid)) from None

        async def ask(addr: str, buffers: list[tuple[str, int, int]]) -> dict[str, Any]:
            return dict(await self.ask(addr, Fetch(buffers), "holds shards of this array"))

        async def fetch() -> np.ndarray:
            # The hosts answer once the shards are computed, or with the error that ended
            # the program: a failed kernel, a failed dispatch (dropped on every host by
            # the scheduler), a lost host.
            try:
                return await asyncio.wait_for(gather(ref, ask, avoid), seconds)
            except TimeoutError:
                assert seconds is not None
                raise _not_ready(ref, seconds, await self._observer.waiting_for(ref.pid)) from None

        return self.dask.sync(fetch)

    def hosts_gone(self, hosts: list[str]) -> list[str]:
        """Which of ``hosts`` have left the cluster."""
        return list(self.dask.sync(ask, self._scheduler(f"waiting for hosts {hosts}"), HostsGone(hosts)))

    def left_within(self, host: str, seconds: float) -> bool:
        """Whether the scheduler says within ``seconds`` that ``host`` left the cluster."""
        waiting = ask(self._scheduler(f"waiting for host {host} to leave"), WaitHostGone(host))

        async def wait() -> bool:
            try:
                await asyncio.wait_for(waiting, seconds)
            except TimeoutError:
                return False
            return True

        return bool(self.dask.sync(wait))

    def transport_of(self, host: str) -> str | None:
        """Where host ``host``'s socket transport listens now; ``None`` if it has left."""
        found = self.dask.sync(ask, self._scheduler(f"looking up host {host}"), TransportOf(host))
        return None if found is None else str(found)

    def _scheduler(self, doing: str) -> Any:
        """The Dask client's scheduler RPC; ``ClientClosedError`` once that client closed (a fetch
        still waiting then asks no more)."""
        scheduler = self.dask.scheduler
        if scheduler is None:
            raise ClientClosedError(f"the client closed while {doing}; its arrays and meshes are gone. "
                                    "Keep the client open until its results are read")
        return scheduler

    def close(self) -> None:
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None


async def _unless_gone(work: Awaitable[Any], gone_waiter: Callable[[], Awaitable[Any]], gone: BaseException) -> Any:
    """``await work``, unless the scheduler says first that its host left (then raise ``gone``).

    Quick answers (the common case) never ask the scheduler.
    """
    tasks = [asyncio.ensure_future(work)]
    try:  # also when we are cancelled (the caller was interrupted): nothing is left unread
        done, _ = await asyncio.wait(tasks, timeout=HOST_CHECK_AFTER)
        if not done:
            tasks.append(asyncio.ensure_future(gone_waiter()))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done:
            return tasks[0].result()
        tasks[1].result()
        raise gone
    finally:
        for t in tasks:
            t.cancel()  # no-op for a finished one
            t.add_done_callback(_consume)  # whichever we did not read, its outcome is read


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _not_ready(ref: OutputRef, seconds: float, waits: str) -> TimeoutError:
    return TimeoutError(f"The shards of program {ref.pid} were not ready within {seconds:g}s. {waits}")
