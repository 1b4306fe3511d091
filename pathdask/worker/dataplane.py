"""The data plane of a host: pieces of collectives and moves, to and from its peers.

:class:`DataPlane` is the half of :class:`~pathdask.worker.runtime.HostRuntime`
that device threads and socket receivers call: a collective's exchange, a move's
pieces, their modelled arrival, and aborting a gang on every member host. It
holds no control state: which programs run is the host core's
(``core/host.py``).

Threads: ``move``/``exchange``/``close_gang``/``abort_gang`` run on device
threads (or the host's driver); ``_on_message``/``on_xfer``/``on_abort`` on
socket receivers or the event loop. What they share locks itself: the
:class:`~pathdask.worker.transfer.Mailbox`, the
:class:`~pathdask.worker.links.LinkModel`, :class:`~pathdask.worker.peers.Peers`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..chunking import split
from ..core.ledger import HostProgram, Ledger
from ..ops import GangSpec
from ..protocol import ABORT, CHUNK, RECORD, XFER
from ..sharding import contiguous
from ..topology import DeviceInfo
from .chunks import Reassembly
from .device import DeviceStream
from .driver import current as current_driver
from .links import LinkModel
from .peers import Peers
from .transfer import Mailbox, wait_until

logger = logging.getLogger("pathdask.worker")

#: a piece on its way: (exchange key, source device, value, (modelled ready time, scale))
Piece = tuple[tuple[str, int, int, int], int, np.ndarray, tuple[float, float]]


class DataPlane:
    """Pieces between devices, here and on peer hosts. See the module docstring."""

    address: str
    chunk: int
    devices: dict[int, DeviceInfo]
    streams: dict[int, DeviceStream]
    links: LinkModel
    mailbox: Mailbox
    peers: Peers
    reassembly: Reassembly
    ledger: Ledger
    loop: asyncio.AbstractEventLoop
    on_peer_record: Callable[[dict[str, Any]], None]  # the runtime's: a control record from a peer

    # -- data plane: exchange ----------------------------------------------------
    def exchange(
        self, pid: str, gang: int, seq: int, me: DeviceInfo,
        sends: dict[DeviceInfo, np.ndarray], sources: set[int],
    ) -> dict[int, np.ndarray]:
        """A collective's exchange: send pieces now, wait for those from ``sources`` (device thread)."""
        return self.move(pid, gang, seq, me, sends, sources)[0]

    def move(
        self, pid: str, gang: int, seq: int, me: DeviceInfo,
        sends: dict[DeviceInfo, np.ndarray], sources: set[int], *,
        start: float | None = None, scale: float = 1.0,
    ) -> tuple[dict[int, np.ndarray], float]:
        """Send pieces to devices and wait for the pieces from ``sources`` (device thread).

        ``start`` is when the pieces are modelled to leave (default: now); each is stamped
        with the time its sender's port lets it go and ``scale``, the modelled bytes per real
        byte (``links.py``); the receiver books its port as the piece comes. Returns the
        pieces and when the last one is modelled to have arrived. If the pieces really
        came later (this machine's overhead, not the modelled system's), the next gang
        still starts from the modelled time, as back-to-back gangs do (``execute.run_op``).
        """
        now = time.perf_counter()
        start = now if start is None else start
        stream = self.streams[me.id]
        remote: dict[str, list[Piece]] = defaultdict(list)
        local: list[Piece] = []
        for dst, value in sends.items():
            key = (pid, gang, seq, dst.id)
            if dst.id != me.id:
                stream.bytes_out += value.nbytes
            stamp = (self.links.depart(me, dst, value.nbytes, start, scale), scale)
            (local if dst.address == self.address else remote[dst.address]).append((key, me.id, value, stamp))
        if local:
            self._deliver(local)
        driver = current_driver()
        if driver is None:
            self._flush(remote)
        elif remote:  # with the host's other devices' pieces for the same peers, once they ran
            driver.defer(remote)
            driver.pause()
        if not sources:
            return {}, start
        sent = time.perf_counter()
        got = self.mailbox.collect((pid, gang, seq, me.id), sources)
        stream.exchanges += 1
        stream.exchange_wait_s += time.perf_counter() - sent
        deadline = start
        values = {}
        for src, (value, arrival) in got.items():
            values[src] = value
            if src != me.id:
                stream.bytes_in += value.nbytes
            deadline = max(deadline, arrival)
        wait_until(deadline, lambda: self.mailbox.check(pid, gang))
        return values, deadline

    def _send_pieces(self, addr: str, pieces: list[Piece]) -> None:
        """Small pieces go in one message; each large one streams in chunks (``chunks.py``)."""
        small = [(k, s, contiguous(v), r) for k, s, v, r in pieces if v.nbytes <= self.chunk]
        if small:
            self.peers.send(addr, XFER, small)
        for key, src, value, stamp in pieces:
            if value.nbytes > self.chunk:
                for offset, data in split(value, self.chunk):
                    self.peers.send_chunk(addr, (key, src, value.shape, value.dtype.str, offset, stamp), data)

    def _flush(self, outbox: dict[str, list[Piece]]) -> None:
        """Send pieces by peer address (device thread: a failure fails the sender's gang)."""
        for addr, pieces in outbox.items():
            self._send_pieces(addr, pieces)

    def _flush_deferred(self, outbox: dict[str, list[Piece]]) -> None:
        """The driver sends what its devices deferred. A peer that cannot be reached fails the
        gangs whose pieces were for it, as it would have failed their senders' gangs."""
        for addr, pieces in outbox.items():
            try:
                self._send_pieces(addr, pieces)
            except Exception as e:  # noqa: BLE001 - contained to those gangs
                for pid, gang in dict.fromkeys((key[0], key[1]) for key, *_ in pieces):
                    prog = self.ledger.get(pid)
                    if prog is not None:
                        self.abort_gang(prog, prog.plan.gangs[gang], e)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == XFER:
            self.on_xfer(message[1])
        elif message[0] == CHUNK:
            meta = message[1]
            piece = self.reassembly.landed(meta, message[2])
            if piece is not None:
                self._deliver([(meta[0], meta[1], piece, meta[5])])
        elif message[0] == ABORT:
            self.on_abort(*message[1:])
        elif message[0] == RECORD:  # a control record: the event loop takes it, as the scheduler's
            self.loop.call_soon_threadsafe(self.on_peer_record, message[1])

    def on_xfer(self, pieces: list[Any]) -> None:
        self._deliver([(tuple(key), src, value, stamp) for key, src, value, stamp in pieces])

    def _deliver(self, pieces: list[Piece]) -> None:
        """Pieces are here: their receiving ports are booked now, in the order they came, and
        the mailbox holds them with their modelled arrivals."""
        arrived = [(key, src, value, self.links.arrival(src, self.devices[key[3]], value.nbytes, *stamp))
                   for key, src, value, stamp in pieces]
        for mismatch in self.mailbox.deliver(arrived):  # a destination returned without this collective
            self.abort(mismatch.key[0], mismatch.key[1], mismatch.hosts, mismatch.error())

    def close_gang(self, pid: str, gang: GangSpec, device: int, collectives: int) -> None:
        """``device``'s body of ``gang`` returned after ``collectives`` collectives (device thread)."""
        mismatch = self.mailbox.close_gang(pid, gang.index, device, collectives, gang.name, gang.hosts)
        if mismatch is not None:
            raise mismatch.error()

    def abort_gang(self, prog: HostProgram, gang: GangSpec, cause: BaseException) -> None:
        """A member of ``gang`` failed: wake every member, here and on other hosts."""
        self.abort(prog.pid, gang.index, gang.hosts, cause)

    def abort(self, pid: str, gang: int, hosts: Iterable[str], cause: BaseException) -> None:
        self.mailbox.abort_gang(pid, gang, cause)
        for addr in set(hosts) - {self.address}:  # ``peers.send`` skips hosts known to be lost
            try:
                self.peers.send(addr, ABORT, pid, gang, picklable(cause))
            except Exception:  # the peer is gone: it has nothing to wake
                logger.warning("pathdask: could not tell host %s that gang %d of %s failed", addr, gang, pid)

    def on_abort(self, pid: str, gang: int, cause: BaseException) -> None:
        self.mailbox.abort_gang(pid, gang, cause)



def picklable(exc: BaseException) -> BaseException:
    """``exc``; else the same without its traceback; else a ``RuntimeError`` with its text.

    A stored cause (a dropped program's, a failed buffer's) is raised again by every reader,
    and each raise adds to its traceback; once Dask has installed tblib's pickling for its
    class (distributed does, for an exception that a task raised), pickling walks that
    traceback recursively and fails with ``RecursionError``. Without it the error keeps its type.
    """
    import pickle

    for candidate in (exc, exc.with_traceback(None)):
        try:
            pickle.loads(pickle.dumps(candidate))
            return candidate
        except Exception:  # noqa: BLE001, PERF203 - the next candidate, or the text
            continue
    return RuntimeError(f"{type(exc).__name__}: {exc}")
