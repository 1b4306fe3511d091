"""Planned interruptions: a host that is leaving on purpose first lets its clients suspend.

A client opts in with ``client.suspend_on_interruption(path, state)``. When a
host closes gracefully (``retire_workers``, or SIGTERM to ``dask worker``), its
runtime asks the scheduler plugin, before it lets go of any buffer, whether
anyone must save first (``pathdask_host_leaving``). The plugin publishes a Dask
event on the topic :data:`TOPIC` naming the opted-in clients with a slice on
that host, and answers once each of them says it has suspended
(``pathdask_suspended``) or after ``pathdask.suspend-timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import dask
from dask.utils import parse_timedelta

from ..protocol import INTERRUPTION_TOPIC, HostRetiring, fields_of

if TYPE_CHECKING:
    from distributed import Scheduler

    from .resources import ResourceManager

logger = logging.getLogger("pathdask.scheduler")

TOPIC = INTERRUPTION_TOPIC


class Interruptions:
    """Which clients asked to be suspended, and which suspends a leaving host waits for."""

    def __init__(self, scheduler: Scheduler, resources: ResourceManager) -> None:
        self.scheduler, self.resources = scheduler, resources
        self.opted_in: set[str] = set()
        self.changed = asyncio.Condition()
        #: (host, client) pairs still suspending
        self.pending: set[tuple[str, str]] = set()
        #: hosts leaving now -> the ask in progress: a host that leaves by SIGTERM is reported both
        #: by its own teardown and by Dask's closing_gracefully, and its clients are asked once
        self.leaving: dict[str, asyncio.Task[list[str]]] = {}

    def opt_in(self, client: str) -> None:
        self.opted_in.add(client)

    async def forget(self, client: str) -> None:
        """A client left: nothing waits for it any more."""
        self.opted_in.discard(client)
        async with self.changed:
            self.pending = {p for p in self.pending if p[1] != client}
            self.changed.notify_all()

    async def host_leaving(self, address: str) -> list[str]:
        """Ask the opted-in clients with a slice on ``address`` to suspend; wait for them.

        Returns the clients that suspended in time. A second report of the same host
        waits for the first one's ask instead of asking again.
        """
        task = self.leaving.get(address)
        if task is None:
            task = self.leaving[address] = asyncio.create_task(self._ask(address))
            task.add_done_callback(lambda _: self.leaving.pop(address, None))
        return await asyncio.shield(task)

    async def _ask(self, address: str) -> list[str]:
        rec = self.resources.hosts.get(address)
        if rec is None:
            return []
        ids = {d.id for d in rec.devices}
        clients = sorted({s.client for s in self.resources.slices.values() if ids & set(s.devices)}
                         & self.opted_in)
        if not clients:
            return []
        logger.info("pathdask: host %s is leaving; asking clients %s to suspend", address, clients)
        async with self.changed:
            self.pending |= {(address, c) for c in clients}
        self.scheduler.log_event(TOPIC, fields_of(HostRetiring(address, clients)))
        timeout = parse_timedelta(dask.config.get("pathdask.suspend-timeout"))
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(
                    lambda: not any(h == address for h, _ in self.pending)), timeout)
            except TimeoutError:
                late = sorted(c for h, c in self.pending if h == address)
                logger.warning("pathdask: clients %s did not suspend within %gs; host %s leaves anyway",
                               late, timeout, address)
                self.pending = {p for p in self.pending if p[0] != address}
                return sorted(set(clients) - set(late))
        return clients

    async def suspended(self, client: str, host: str, error: Any = None) -> None:
        """A client finished (or failed) its suspend for ``host``."""
        if error:
            logger.warning("pathdask: client %s could not suspend before host %s left: %s", client, host, error)
        async with self.changed:
            self.pending.discard((host, client))
            self.changed.notify_all()
