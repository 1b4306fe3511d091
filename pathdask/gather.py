"""Gathering a program output from the hosts that hold its shards.

Two callers share it: the client's ``ShardedArray.result()``, which asks the
hosts itself, and the finalize task of ``dask.compute`` on a ShardedArray,
which Dask runs on a worker (``worker/tasks.py``). Only how a host is asked
differs; which shards are fetched, and how they are assembled, is here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from distributed.core import clean_exception

from .sharding import Sharding

__all__ = ["OutputRef", "gather", "raise_reply_error"]

#: a buffer in a host's store: (producing program, value id, device id)
Buffer = tuple[str, int, int]
#: ``ask(address, buffers)`` sends the ``pathdask_fetch`` request to one host
Ask = Callable[[str, list[Buffer]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class OutputRef:
    """Where a program output's shards are: value ``vid`` of program ``pid``, split by ``sharding``."""

    pid: str
    vid: int
    sharding: Sharding
    dtype: str

    def shards(self) -> dict[str, list[tuple[int, Buffer]]]:
        """Per host, (mesh position, buffer) of one copy of each distinct block."""
        want: dict[str, list[tuple[int, Buffer]]] = {}
        for positions in self.sharding.positions_by_block().values():
            p = positions[0]
            dev = self.sharding.mesh.devices[p]
            want.setdefault(dev.address, []).append((p, (self.pid, self.vid, dev.id)))
        return want


def raise_reply_error(error: dict[str, Any]) -> NoReturn:
    """Raise the exception of an ``error_message`` reply, with its own type and traceback."""
    _, exc, tb = clean_exception(**error)
    assert exc is not None
    raise exc.with_traceback(tb)


async def gather(ref: OutputRef, ask: Ask) -> np.ndarray:
    """The global array of ``ref``, its blocks fetched from their hosts in parallel.

    The hosts answer once the shards are computed, or with the error that ended
    the program, which is raised here with its own type.
    """
    want = ref.shards()

    async def fetch_from(addr: str, items: list[tuple[int, Buffer]]) -> list[np.ndarray]:
        reply = await ask(addr, [b for _, b in items])
        if "error" in reply:
            raise_reply_error(reply["error"])
        return list(reply["values"])

    replies = await asyncio.gather(*(fetch_from(addr, items) for addr, items in want.items()))
    blocks = {p: value for items, reply in zip(want.values(), replies) for (p, _), value in zip(items, reply)}
    return ref.sharding.assemble(blocks, np.dtype(ref.dtype))
