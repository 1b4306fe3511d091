"""The Dask tasks a lowered program consists of; they run on the host they are pinned to.

Also the finalize task of ``dask.compute`` on a ShardedArray (``gather_task``).

None of them waits, while it holds one of Dask's execution slots, for a side
effect of another Dask task: a dispatch finds its plan in the host's cache
(its client sent it ahead) or fails at once, and sequential dispatch's gang
tasks leave the thread pool (``secede``) before they wait for their device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DeviceLostError
from ..gather import Buffer, OutputRef, gather
from ..ops import HostPlan
from ..protocol import Fetch, ask
from .runtime import runtime


async def dispatch_task(pid: str, plan: HostPlan | str, inputs: tuple[tuple[str, int], ...], client: str,
                        gated: bool = False) -> str:
    """Register this host's part of a program with its runtime; returns before execution.

    ``plan`` is the host's plan, or the id of a plan its client sent ahead. A
    coroutine, so that the worker runs it on its event loop, where the runtime's
    control state lives.
    """
    return runtime().dispatch(pid, plan, inputs, client, gated=gated)


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


async def output_task(pid: str, index: int, *upstream: Any) -> tuple[str, int]:
    """A program output's handle on this host. Its key owns the output's buffers here.

    A coroutine, so that the worker runs it on its event loop, not in its thread pool.
    """
    return (pid, index)


def gather_task(handles: list[Any], ref: OutputRef) -> np.ndarray:
    """``dask.compute``'s finalize of a ShardedArray: its global array, gathered from the hosts.

    ``handles`` are the values of the array's output keys; the shards themselves are
    fetched from their hosts, as ``ShardedArray.result()`` does. The wait for the
    devices leaves Dask's thread pool (``secede``), as it may take a while.
    """
    from distributed import get_worker, secede
    from distributed.utils import sync

    worker = get_worker()
    secede()

    async def fetch(addr: str, buffers: list[Buffer]) -> dict[str, Any]:
        try:
            return dict(await ask(worker.rpc(addr), Fetch(buffers)))
        except OSError as e:  # CommClosedError is one
            raise DeviceLostError(f"Host {addr}, which holds shards of this array, is gone "
                                  f"({type(e).__name__}: {e})") from e

    return sync(worker.loop, gather, ref, fetch)
