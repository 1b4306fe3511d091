"""The Dask tasks a lowered program consists of; they run on the host they are pinned to."""

from __future__ import annotations

from ..ops import HostPlan
from .runtime import runtime


async def dispatch_task(pid: str, plan: HostPlan, inputs: tuple[tuple[str, int], ...], client: str) -> str:
    """Register this host's part of a program with its runtime; returns before execution."""
    return await runtime().dispatch(pid, plan, inputs, client)


def output_task(pid: str, index: int) -> tuple[str, int]:
    """A program output's handle on this host. Its key owns the output's buffers here."""
    return (pid, index)
