"""Each host's process on a CPU of its own, as each host has a machine of its own.

On a machine of few cores, the host processes' threads (devices, exchanges, the event
loop) otherwise move between cores and meet each other on one: a collective then waits
for whichever peer's thread the kernel has set aside, and the same run of Figure 5 takes
from 1x to 2x its best time. Pinned, each host process keeps a core as it would keep its
machine, and runs spread by a few percent. The controller (the client and the scheduler)
is left free: there is no core for it alone, as there is no machine for it alone.
"""

from __future__ import annotations

import os
from typing import Any

from ..affinity import can_pin, pin

__all__ = ["hosts_on_own_cpus"]


def hosts_on_own_cpus(dask_client: Any, hosts: list[str]) -> dict[str, int] | None:
    """Pin every thread of each of ``hosts``' worker processes, in that order, to a CPU of its
    own, round robin over the CPUs this process may use; the CPU of each host, or ``None`` (and
    nothing pinned) where that cannot be: a host in this process (threads mode), fewer than two
    CPUs, or a platform that cannot pin threads."""
    cpus = sorted(os.sched_getaffinity(0)) if can_pin() else []
    if len(cpus) < 2 or os.getpid() in dask_client.run(os.getpid, workers=hosts).values():
        return None
    placed = {host: cpus[i % len(cpus)] for i, host in enumerate(hosts)}
    dask_client.run(_pin_here, placed, workers=hosts)
    return placed


def _pin_here(placed: dict[str, int], dask_worker: Any = None) -> None:
    """On a host: every thread of this process, and those they start, on its CPU in ``placed``."""
    cpu = placed[dask_worker.address]
    pin(lambda tid: {cpu})
