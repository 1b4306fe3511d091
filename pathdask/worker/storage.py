"""A host writes the shards it holds to a checkpoint (``client.suspend``), straight to storage.

The client creates a new checkpoint directory with its zarr group and arrays
(metadata only); each host then writes its own shards as chunks, all hosts at
once, from a thread of its own (its devices run on meanwhile), and answers each
chunk's checksum, which the client puts in the commit record
(``checkpoint_format.py``). No shard passes through the client or the
scheduler. Reading back is a :class:`~pathdask.ops.LoadOp`, run by the device
that will hold the block.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed.core import error_message

from ..checkpoint_format import write_chunk

if TYPE_CHECKING:
    from .host import Host

#: (array name, program, value id, device, chunk key)
Write = tuple[str, str, int, int, str]


async def save(rt: Host, path: str, writes: list[Write]) -> dict[str, Any]:
    """The ``pathdask_save`` handler: write each listed shard once it is computed.

    Returns ``{"bytes": n, "checksums": [...]}`` (one per write, in order); or
    ``{"error": ...}``, the error that ended a shard's program, for the client to
    raise; or ``{"write_error": ...}``, the storage's error (a full disk, no permission).
    """
    try:
        blocks = []
        for name, pid, vid, dev, key in writes:
            cause = rt.ledger.dropped(pid)
            if cause is not None:
                raise cause
            blocks.append((name, key, await rt.store.wait_value((pid, vid), dev)))
    except Exception as e:
        return {"error": error_message(e)}
    try:
        nbytes, sums = await asyncio.to_thread(_write, path, blocks)
    except Exception as e:
        return {"write_error": error_message(e)}
    return {"bytes": nbytes, "checksums": sums}


def _write(path: str, blocks: list[tuple[str, str, np.ndarray]]) -> tuple[int, list[int]]:
    sums = [_store(path, name, key, block) for name, key, block in blocks]
    return sum(b.nbytes for _, _, b in blocks), sums


def _store(path: str, name: str, key: str, block: np.ndarray) -> int:
    """Write one chunk; its checksum. One call per chunk: the tests wrap it to fail or hold a write."""
    return write_chunk(path, name, key, block)
