"""Blocks as runs of bytes: cut into chunks without copies, and filled chunk by chunk.

Large blocks cross process boundaries in chunks (a put's blocks, pieces of a
move between hosts). :func:`split` cuts a block into chunks of its C-order
bytes, copying only a strided block, and one chunk at a time; :func:`empty`
allocates the receiving block, whose pages the OS commits only as chunks land,
so a block in transit is never held twice.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .sharding import contiguous


def split(value: np.ndarray, chunk: int, offset: int = 0) -> Iterator[tuple[int, memoryview]]:
    """``(byte offset, bytes)`` pairs that cover ``value`` in C order, each at most about ``chunk``.

    A contiguous ``value`` is cut into views of its own buffer; a strided one is
    cut along its leading axes, and only one chunk at a time is made contiguous.
    """
    if value.flags.c_contiguous:
        flat = value.reshape(-1).view(np.uint8).data
        for start in range(0, value.nbytes, chunk):
            yield offset + start, flat[start:start + chunk]
        return
    row = value.nbytes // value.shape[0]  # bytes per index of the leading axis
    if row > chunk:  # one index is bigger than a chunk: cut inside it
        for i in range(value.shape[0]):
            yield from split(value[i], chunk, offset + i * row)
        return
    step = chunk // row
    for i in range(0, value.shape[0], step):
        yield offset + i * row, contiguous(value[i:i + step]).reshape(-1).view(np.uint8).data


def empty(shape: tuple[int, ...], dtype: str | np.dtype) -> tuple[np.ndarray, memoryview]:
    """A new block and a writable view of its bytes, to fill chunk by chunk."""
    block = np.empty(shape, dtype=dtype)
    return block, block.reshape(-1).view(np.uint8).data
