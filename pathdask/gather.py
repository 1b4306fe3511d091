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
from distributed.protocol import to_serialize

from .sharding import Sharding

__all__ = ["OutputRef", "assemble", "decode_block", "encode_block", "gather", "raise_reply_error"]

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

    def shards(self, avoid: frozenset[int] = frozenset()) -> dict[str, list[tuple[int, Buffer]]]:
        """Per host, (mesh position, buffer) of one copy of each distinct block, from a device
        not in ``avoid`` (say, lost ones); :meth:`missing` says which blocks have none."""
        want: dict[str, list[tuple[int, Buffer]]] = {}
        devices = self.sharding.mesh.devices
        for positions in self.sharding.positions_by_block().values():
            p = next((q for q in positions if devices[q].id not in avoid), None)
            if p is None:
                continue
            want.setdefault(devices[p].address, []).append((p, (self.pid, self.vid, devices[p].id)))
        return want

    def missing(self, avoid: frozenset[int]) -> list[tuple[int, ...]]:
        """Blocks (by block index) whose every copy is on a device in ``avoid``."""
        devices = self.sharding.mesh.devices
        return [blk for blk, positions in self.sharding.positions_by_block().items()
                if all(devices[q].id in avoid for q in positions)]


#: blocks up to this size travel inside the reply's message, as bytes, instead of as frames of
#: Dask's serialization (which costs tens of microseconds per array, whatever its size)
INLINE_BYTES = 64 * 1024


def encode_block(value: np.ndarray) -> Any:
    """A host's block for a fetch reply: small plain arrays inline, others serialized by Dask."""
    if value.nbytes <= INLINE_BYTES and value.dtype.kind in "biufcmM" and not value.dtype.fields:
        return ("inline", value.dtype.str, list(value.shape), value.tobytes())
    return to_serialize(value)


def decode_block(block: Any) -> np.ndarray:
    """The array of :func:`encode_block`'s output (read-only when it came inline)."""
    if isinstance(block, (list, tuple)) and len(block) == 4 and block[0] == "inline":
        _, dtype, shape, data = block
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    return np.asarray(block)


def raise_reply_error(error: dict[str, Any]) -> NoReturn:
    """Raise the exception of an ``error_message`` reply, with its own type and traceback."""
    _, exc, tb = clean_exception(**error)
    assert exc is not None
    raise exc.with_traceback(tb)


async def gather(ref: OutputRef, ask: Ask, avoid: frozenset[int] = frozenset()) -> np.ndarray:
    """The global array of ``ref``, its blocks fetched from their hosts in parallel.

    The hosts answer once the shards are computed, or with the error that ended
    the program, which is raised here with its own type.
    """
    want = ref.shards(avoid)

    async def fetch_from(addr: str, items: list[tuple[int, Buffer]]) -> list[np.ndarray]:
        reply = await ask(addr, [b for _, b in items])
        if "error" in reply:
            raise_reply_error(reply["error"])
        return [decode_block(b) for b in reply["values"]]

    replies = await asyncio.gather(*(fetch_from(addr, items) for addr, items in want.items()))
    return assemble(ref, want, dict(zip(want, replies)))


def assemble(ref: OutputRef, want: dict[str, list[tuple[int, Buffer]]], replies: dict[str, list[np.ndarray]]) -> np.ndarray:
    """The global array from each host's values, in the order ``want`` asked them."""
    blocks = {p: value for addr, items in want.items() for (p, _), value in zip(items, replies[addr])}
    return ref.sharding.assemble(blocks, np.dtype(ref.dtype))
