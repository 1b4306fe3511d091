"""Hosts joining, failing, retiring and leaving, as the scheduler plugin sees them.

:class:`HostMembership` is the half of
:class:`~pathdask.scheduler.plugin.PathwaysScheduler` that keeps the resource
manager's hosts and the hosts' transports, answers waiters on them, lets
opted-in clients suspend before a host retires (``interruptions.py``), and hands
a lost host to the core (:meth:`SchedulerCore.host_lost
<pathdask.core.island.SchedulerCore.host_lost>`), whose instructions the plugin
carries out (``apply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask.utils import parse_timedelta
from distributed.core import clean_exception
from distributed.protocol import Serialized, deserialize, to_serialize

from ..compat import scheduler_running, unfinished_keys_pinned_to
from ..core.island import Instruction, SchedulerCore
from ..errors import DeviceLostError
from ..ops import dispatched_program
from ..topology import Topology
from .interruptions import TOPIC, Interruptions
from .liveness import HostLiveness
from .resources import ResourceManager

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.scheduler")


class HostMembership:
    """Which hosts are in the cluster, and what happens as they come and go."""

    scheduler: Scheduler
    topology: Topology
    core: SchedulerCore
    resources: ResourceManager
    interruptions: Interruptions
    leaving: dict[str, asyncio.Future[list[str]]]
    _leaving_locks: dict[str, asyncio.Lock]
    hosts_changed: asyncio.Condition
    host_failures: dict[str, dict[str, Any]]
    transports: dict[str, str]
    transport_token: bytes
    liveness: HostLiveness
    ordering: bool
    dispatch_jitter: float
    #: carries out the core's instructions (``PathwaysScheduler.apply``)
    apply: Callable[[list[Instruction]], None]

    # -- planned interruptions (``interruptions.py``) ---------------------------------
    async def host_leaving(self, address: str) -> list[str]:
        """A host's runtime is closing: its opted-in clients suspend first (the same suspend
        as the one its retirement started, if it is retiring)."""
        leaving = self.leaving.get(address)
        if leaving is None:
            return await self.interruptions.host_leaving(address)
        return list(await asyncio.shield(leaving))

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        """Dask's event hook: a host going to ``closing_gracefully`` (``retire_workers``)
        starts its clients' suspend now, while its buffers are all still there."""
        if (isinstance(msg, dict) and msg.get("action") == "worker-status-change"
                and msg.get("status") == "closing_gracefully" and topic in self.resources.hosts
                and topic not in self.leaving):
            self.leaving[topic] = asyncio.ensure_future(self.interruptions.host_leaving(topic))

    def suspend_on_interruption(self, client: str) -> None:
        # Subscribe here too: the client's own subscription travels on its batched stream and
        # may arrive after a host starts leaving; once this RPC answers, the event will reach it.
        self.scheduler.subscribe_topic(TOPIC, client)
        self.interruptions.opt_in(client)

    async def suspended(self, client: str, host: str, error: Any = None) -> None:
        await self.interruptions.suspended(client, host, error)

    # -- hosts ---------------------------------------------------------------
    async def register_host(self, address: str, requested: int | None = None,
                            transport: str | None = None) -> dict[str, Any]:
        """A host runtime starts. Every other host learns where its socket ``transport``
        listens, on its stream and so before any program that uses it; the reply gives the
        host the others' (and the secret they present to each other)."""
        rec = self.resources.add_host(address, requested)
        if transport is None:
            self.transports.pop(address, None)
        else:  # a host restarted on its old address has a new one
            self.transports[address] = transport
        self.apply(self.core.host_joined(address, transport))
        await self._hosts_changed()
        logger.info("pathdask: %s is island %d host %d", address, rec.island, rec.host)
        return {
            "topology": self.topology.to_dict(),
            "island": rec.island,
            "host": rec.host,
            "ordering": self.ordering,
            "dispatch_jitter": self.dispatch_jitter,
            # a policy that holds programs back until slotted ones end needs each ending at once
            "prompt_endings": self.core.order.policy.window is not None,
            "transport_token": self.transport_token,
            "transports": {a: t for a, t in self.transports.items() if a != address},
        }

    def transport_of(self, host: str) -> str | None:
        """Where ``host``'s socket transport listens; ``None`` if it left (or has none)."""
        return self.transports.get(host) if host in self.resources.hosts else None

    def hosts_gone(self, hosts: list[str]) -> list[str]:
        """Which of ``hosts`` are not (or no longer) in the cluster."""
        return [h for h in hosts if h not in self.resources.hosts]

    async def host_failed(self, address: str, error: dict[str, Any]) -> None:
        """A worker's host runtime could not start; waiters learn it at once, with its error."""
        logger.error("pathdask: the host runtime on %s failed to start: %s", address, error.get("exception_text"))
        self.resources.remove_host(address)
        self.core.host_failed(address)
        self.transports.pop(address, None)
        self.host_failures[address] = error
        await self._hosts_changed()

    async def wait_hosts(self, n: int | None = None, timeout: Any = "30s") -> int:
        """Wait until ``n`` hosts (default: all of the topology) have registered."""
        n = self.topology.num_hosts if n is None else n
        seconds = parse_timedelta(timeout)
        async with self.hosts_changed:
            try:
                await asyncio.wait_for(
                    self.hosts_changed.wait_for(
                        lambda: len(self.resources.hosts) >= n or bool(self.host_failures)
                    ),
                    seconds,
                )
            except TimeoutError:
                raise TimeoutError(
                    f"Only {len(self.resources.hosts)} of {n} pathdask hosts registered within "
                    f"{seconds:g}s; check that every worker runs the pathdask preload"
                ) from None
        for address, error in self.host_failures.items():
            # the scheduler does not deserialize what handlers receive: unpack it here
            error = {k: deserialize(v.header, v.frames) if isinstance(v, Serialized) else v
                     for k, v in error.items()}
            _, exc, tb = clean_exception(**error)
            assert exc is not None
            raise type(exc)(f"The pathdask host runtime on {address} failed to start: {exc}").with_traceback(tb)
        return len(self.resources.hosts)

    async def wait_host_gone(self, address: str) -> None:
        """Return once host ``address`` is not (or no longer) in the cluster."""
        async with self.hosts_changed:
            await self.hosts_changed.wait_for(lambda: address not in self.resources.hosts)

    async def _hosts_changed(self) -> None:
        async with self.hosts_changed:
            self.hosts_changed.notify_all()

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> Any:
        """A host left: the programs that use its devices fail with DeviceLostError everywhere.

        A host that is retiring leaves once its clients have suspended: Dask awaits this.
        """
        self.core.host_leaving()  # out of Dask's workers from now on: calls look again
        leaving = self.leaving.get(worker)
        if leaving is not None:
            return self._remove_after(leaving, worker)
        self._remove_host(worker)
        return None

    async def _remove_after(self, leaving: asyncio.Future[Any], worker: str) -> None:
        for pid in self._stranded(worker):  # fail these now: a suspend must not wait for them
            reason = f"host {worker} retired before program {pid} was dispatched there"
            self.apply(self.core.end_program(pid, reason, to_serialize(DeviceLostError(reason))))
        with contextlib.suppress(Exception):
            await asyncio.shield(leaving)
        self.leaving.pop(worker, None)
        self._leaving_locks.pop(worker, None)
        self._remove_host(worker)

    def _remove_host(self, worker: str) -> None:
        self.transports.pop(worker, None)
        rec = self.resources.remove_host(worker)
        if rec is None:
            return
        asyncio.ensure_future(self._hosts_changed())  # wakes clients waiting on it (wait_host_gone)
        describe = f"island {rec.island}, host {rec.host}, devices {[d.id for d in rec.devices]}"
        why = self.liveness.describe(worker)
        if why:
            describe += f"; {why}"
        self.apply(self.core.host_lost(worker, describe, failing=scheduler_running(self.scheduler)))

    def _stranded(self, worker: str) -> list[str]:
        """Programs whose dispatch task for ``worker`` had not run when Dask began to remove it:
        Dask took the task off it, so they can never end there."""
        return [pid for key in unfinished_keys_pinned_to(self.scheduler, worker)
                if (pid := dispatched_program(key)) is not None]
