"""Large pieces move between hosts in chunks, received straight into their place.

A piece bigger than ``pathdask.transfer-chunk`` is cut into chunks of about
that size (:func:`pathdask.chunking.split`: no copy of a contiguous piece, and
one chunk at a time of a strided one, such as a reshard's slice of a block). The
receiving host allocates the whole piece on its first chunk and receives every
chunk straight into its place (:class:`Reassembly`), so neither side ever
holds two full copies, and chunks to different peers interleave on the wire
instead of one whole piece blocking the next.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..chunking import empty
from ..core.bounded import remember
from .transfer import SlotKey

#: what travels with each chunk: (exchange key, source device, piece shape, dtype str, byte
#: offset, the piece's stamp: when it may start to move and its scale (``links.py``))
ChunkMeta = tuple[SlotKey, int, tuple[int, ...], str, int, tuple[float, float]]


class Reassembly:
    """Pieces arriving chunk by chunk, by (exchange key, source device).

    Threads: socket receivers and the event loop call in; ``lock`` guards ``partial``
    and ``ended``.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: (key, src) -> [the piece, its bytes, bytes still to come]
        self.partial: dict[tuple[SlotKey, int], list[Any]] = {}
        #: programs that ended here: their late chunks are received and forgotten
        self.ended: OrderedDict[str, None] = OrderedDict()

    def target(self, meta: ChunkMeta, nbytes: int) -> memoryview:
        """Where a chunk of ``nbytes`` bytes goes: a writable slice of its piece."""
        key, src, shape, dtype, offset, _ = meta
        with self.lock:
            if key[0] in self.ended:
                return memoryview(bytearray(nbytes))
            entry = self.partial.get((key, src))
            if entry is None:
                piece, data = empty(shape, dtype)
                entry = self.partial[(key, src)] = [piece, data, piece.nbytes]
        return entry[1][offset:offset + nbytes]  # type: ignore[no-any-return]

    def landed(self, meta: ChunkMeta, nbytes: int) -> np.ndarray | None:
        """A chunk is in place; the whole piece once its last chunk is."""
        key, src = meta[0], meta[1]
        with self.lock:
            entry = self.partial.get((key, src))
            if entry is None:  # dropped while it arrived: nothing waits for it
                return None
            entry[2] -= nbytes
            if entry[2] > 0:
                return None
            del self.partial[(key, src)]
        piece: np.ndarray = entry[0]
        piece.flags.writeable = False
        return piece

    def drop(self, program: str) -> None:
        """Forget the partial pieces of a program that ended here (a sender may have died)."""
        with self.lock:
            remember(self.ended, program, None)
            for k in [k for k in self.partial if k[0][0] == program]:
                del self.partial[k]
