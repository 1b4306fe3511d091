"""A host writes the shards it holds to a checkpoint (``client.suspend``), straight to storage.

The client creates the zarr group and its arrays (metadata only); each host
then writes its own shards as chunks, all hosts at once. No shard passes
through the client or the scheduler. Reading back is a
:class:`~pathdask.ops.LoadOp`, run by the device that will hold the block.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed.core import error_message

if TYPE_CHECKING:
    from .host import Host

#: (array name, program, value id, device, region of the global array)
Write = tuple[str, str, int, int, tuple[slice, ...]]


async def save(rt: Host, path: str, writes: list[Write]) -> dict[str, Any]:
    """The ``pathdask_save`` handler: write each listed shard once it is computed.

    Returns ``{"bytes": n}``, or ``{"error": ...}`` (a failed program or a storage error)
    for the client to raise.
    """
    try:
        blocks = []
        for name, pid, vid, dev, index in writes:
            cause = rt.ledger.dropped(pid)
            if cause is not None:
                raise cause
            blocks.append((name, index, await rt.store.wait_value((pid, vid), dev)))
        return {"bytes": await asyncio.to_thread(_write, path, blocks)}
    except Exception as e:
        return {"error": error_message(e)}


def _write(path: str, blocks: list[tuple[str, tuple[slice, ...], np.ndarray]]) -> int:
    import zarr

    arrays: dict[str, Any] = {}
    for name, index, block in blocks:
        if name not in arrays:
            arrays[name] = zarr.open_array(store=f"{path}/{name}", mode="r+")
        arrays[name][index] = block
    return sum(b.nbytes for _, _, b in blocks)
