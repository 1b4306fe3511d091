"""The Dask tasks a lowered program consists of; they run on the host they are pinned to.

None of them waits, while it holds one of Dask's execution slots, for a side
effect of another Dask task: a dispatch finds its plan in the host's cache
(its client sent it ahead) or fails at once, and sequential dispatch's gang
tasks leave the thread pool (``secede``) before they wait for their device.
"""

from __future__ import annotations

from typing import Any

from ..ops import HostPlan
from .runtime import runtime


async def dispatch_task(pid: str, plan: HostPlan | str, inputs: tuple[tuple[str, int], ...], client: str,
                        gated: bool = False) -> str:
    """Register this host's part of a program with its runtime; returns before execution.

    ``plan`` is the host's plan, or the id of a plan its client sent ahead.
    """
    return await runtime().dispatch(pid, plan, inputs, client, gated=gated)


def run_gang_task(registered: str, pid: str, gang: int, device: int, *upstream: Any) -> str:
    """Sequential dispatch: release one gang on one device; return once it ran.

    The wait leaves Dask's thread pool (``secede``), so that waiting gangs never
    keep the next ones in the devices' order from being released.
    """
    from distributed import secede

    done = runtime().release_gang(pid, gang, device)
    secede()
    done.wait()
    return pid


def output_task(pid: str, index: int, *upstream: Any) -> tuple[str, int]:
    """A program output's handle on this host. Its key owns the output's buffers here."""
    return (pid, index)
