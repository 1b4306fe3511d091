"""The Dask tasks a lowered program consists of; they run on the host they are pinned to."""

from __future__ import annotations

from typing import Any

from ..errors import DeviceLostError
from ..ops import HostPlan
from .runtime import runtime


async def dispatch_task(pid: str, plan: HostPlan | str, inputs: tuple[tuple[str, int], ...], client: str,
                        gated: bool = False) -> str:
    """Register this host's part of a program with its runtime; returns before execution.

    ``plan`` is the host's plan, or its id when an earlier call brought it here.
    """
    rt = runtime()
    plan = await rt.plan(plan)
    if rt.address not in {d.address for g in plan.gangs.values() for d in g.members}:
        # Dask recomputes lost keys on a replacement worker; a program cannot follow its host.
        raise DeviceLostError(
            f"Program {pid} was planned for a host that left the cluster; {rt.address} replaced it. "
            "Call the program again on a new mesh"
        )
    return await rt.dispatch(pid, plan, inputs, client, gated=gated)


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
