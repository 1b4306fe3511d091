"""What the scheduler plugin answers about the hosts: stats, diagnosis, transfers, traces.

:class:`SchedulerAnswers` is the observation half of
:class:`~pathdask.scheduler.plugin.PathwaysScheduler`: each answer asks every
live host (:meth:`SchedulerAnswers.ask_hosts`, the one fan-out) and merges
their replies. It changes nothing but the recorded observations.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from dask.utils import parse_timedelta

from ..core.island import SchedulerCore
from ..dashboard.collect import Collector
from ..dashboard.views import timeline
from ..protocol import (
    HostDiagnose,
    HostResetObservations,
    HostStats,
    HostTransfers,
    HostWaitIdle,
    Message,
    ask,
)
from ..worker.links import add_stats
from .liveness import HostLiveness
from .meter import CallMeter
from .resources import ResourceManager

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.scheduler")

#: seconds a host has to answer a diagnosis (a diagnosis is asked while something waits)
DIAGNOSE_TIMEOUT = 5.0


class SchedulerAnswers:
    """Observation, from every host. See the module docstring."""

    scheduler: Scheduler
    core: SchedulerCore
    resources: ResourceManager
    activity: Collector
    liveness: HostLiveness
    clients: dict[str, dict[str, Any]]
    progress: asyncio.Event
    meter: CallMeter

    @property
    def order(self) -> Any:
        return self.core.order

    async def ask_hosts(self, msg: Message, hosts: list[str] | None = None,
                        timeout: float | None = None) -> dict[str, Any]:
        """Ask every live host (or ``hosts``) ``msg``; a host that fails to answer (it died, is
        leaving, or the scheduler is closing), or not within ``timeout`` seconds, is left out of
        the replies, logged at debug level: callers see who answered, and background pulls ask
        again."""
        async def one(addr: str) -> tuple[str, Any]:
            try:
                return addr, await asyncio.wait_for(ask(self.scheduler.rpc(addr), msg), timeout)
            except Exception as e:  # noqa: BLE001
                logger.debug("pathdask: %s did not answer %s: %r", addr, msg.kind, e)
                return addr, None

        asked = list(self.resources.hosts) if hosts is None else hosts
        replies = await asyncio.gather(*(one(a) for a in asked))
        return {addr: reply for addr, reply in replies if reply is not None}

    async def diagnose(self) -> dict[str, Any]:
        """Per host, each device's state and queue; per client, programs waiting and slotted."""
        # a silent host is not asked (its answer would wait out a TCP timeout); the others get
        # a bounded time, so that a diagnosis answers while programs wait on a silent host
        silent = self.liveness.silent()
        asked = [a for a in self.resources.hosts if a not in silent]
        replies = await self.ask_hosts(HostDiagnose(), asked, timeout=DIAGNOSE_TIMEOUT)
        hosts = {a: r for a, r in replies.items() if isinstance(r, dict)}
        counts = self.order.by_client()
        clients = {cid: {**c, **counts.get(cid, {"waiting": 0, "slotted": 0})} for cid, c in self.clients.items()}
        island_host = {a: (h.island, h.host) for a, h in self.resources.hosts.items()}
        return {"hosts": hosts, "clients": clients,
                "unreachable": sorted(set(self.resources.hosts) - set(hosts) - set(silent)),
                "silent": {a: {"silent_s": s, "island": island_host.get(a, (None, None))[0],
                               "host": island_host.get(a, (None, None))[1],
                               "timeout_s": self.liveness.timeout} for a, s in silent.items()}}

    async def stats(self) -> dict[str, Any]:
        replies = await self.ask_hosts(HostStats())
        return {**_merge(replies), "scheduler": {**self.meter.snapshot(), "fanned": self.core.fanned}}

    async def transfers(self) -> list[Any]:
        """Every host's recent modelled transfers (``links.py``), with wall-clock times."""
        replies = await self.ask_hosts(HostTransfers())
        return sorted(t for reply in replies.values() if isinstance(reply, (list, tuple)) for t in reply)

    async def reset_observations(self) -> None:
        await self.ask_hosts(HostResetObservations())
        self.activity.record.clear()

    async def trace(self, timeout: Any = "10s") -> dict[str, Any]:
        """Every recorded gang (the dashboard's timeline view), once the programs that were
        slotted when it was asked have ended everywhere, so that their gangs are all in it."""
        deadline = asyncio.get_running_loop().time() + parse_timedelta(timeout)
        running = set(self.order.inflight)
        while running & set(self.order.inflight):
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                break  # a program that does not end: trace what ran so far
        await self.activity.refresh()
        return timeline(self.activity.record)

    async def wait_idle(self, timeout: Any = "10s") -> dict[str, Any]:
        """Wait until every host holds no buffers and no program; raises ``TimeoutError`` otherwise."""
        seconds = parse_timedelta(timeout)
        try:
            replies = await asyncio.wait_for(self.ask_hosts(HostWaitIdle()), seconds)
        except TimeoutError:
            stats = _merge(await self.ask_hosts(HostStats()))
            busy = {d: (s["bytes_in_use"], s["buffers"], s["pending_programs"])
                    for d, s in stats["devices"].items() if s["buffers"] or s["pending_programs"]}
            raise TimeoutError(
                f"The pathdask hosts were not idle within {seconds:g}s: {stats['programs']} program(s) "
                f"dispatched and unfinished; devices holding (bytes, buffers, queued programs): {busy}. "
                "Release the arrays you no longer need, or see system.diagnose() for what devices wait for"
            ) from None
        return _merge(replies)



def _merge(replies: dict[str, Any]) -> dict[str, Any]:
    """One ``device_stats()`` from every host's: devices, link classes and NICs.

    Link classes are counted where transfers arrive, so hosts' counts add up;
    the longest queue and wait are maxima.
    """
    devices: dict[int, Any] = {}
    links: dict[str, dict[str, Any]] = {}
    nics: dict[str, dict[str, Any]] = {}
    programs = 0
    for reply in replies.values():
        if not isinstance(reply, dict) or "devices" not in reply:
            continue
        devices.update({int(k): v for k, v in reply["devices"].items()})
        for cls, v in reply["links"].items():
            add_stats(links.setdefault(cls, {}), v)
        for host, sides in reply.get("nics", {}).items():
            # summed, not replaced: a receiving host also holds an (idle) copy of the sender's
            # NIC port, which would otherwise hide the sender's own count
            for side, v in sides.items():
                add_stats(nics.setdefault(host, {}).setdefault(side, {}), v)
        programs += reply["programs"]
    return {"devices": dict(sorted(devices.items())), "links": links, "nics": dict(sorted(nics.items())),
            "programs": programs}
