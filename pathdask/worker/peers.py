"""Messages between host runtimes: piece deliveries and gang aborts.

By default they go over :class:`~pathdask.worker.transport.SocketTransport`,
written straight from the threads that run the devices (``driver.py``). Hosts that run in one process (a
``LocalSystem(processes=False)``) hand them to each other as plain calls on the
sending thread, with ``pathdask.in-process-peers`` (the default): no socket, no
receiver thread, no pickling; the modelled link times stay as they are. With ``pathdask.transport: dask`` they
go as one-way messages over Dask comms: a ``BatchedSend`` per peer, opened
through the peer's ``PEER_STREAM_OP`` handler and served by Dask's own
``handle_stream``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
from distributed.batched import BatchedSend
from distributed.comm import connect, get_address_host
from distributed.protocol import to_serialize

from ..errors import DeviceLostError
from ..protocol import ABORT, CHUNK, PEER_OPS, PEER_STREAM_OP, RECORD, XFER, TransportOf, ask
from .transport import Answer, SocketTransport

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("pathdask.worker")

TRANSPORTS = ("socket", "dask")
#: seconds a device waits for the scheduler to say where a peer's transport listens
TRANSPORT_LOOKUP_S = 10.0
#: the length of the hosts' shared token (``secrets.token_bytes``)
TOKEN_BYTES = 32

#: the hosts of this process (threads mode), by worker address, while their runtimes run;
#: guarded by ``_HERE_LOCK``. With ``pathdask.in-process-peers``, messages between them are calls.
_HERE: dict[str, Peers] = {}
_HERE_LOCK = threading.Lock()


class Peers:
    """Sends ``("xfer", pieces)``, ``("abort", pid, gang, cause)`` and chunks of large pieces
    (:meth:`send_chunk`) to other hosts, from any thread.

    ``handle`` receives the same tuples from the socket transport, and
    ``("chunk", meta, nbytes)`` once ``sink(meta, nbytes)`` received a chunk's
    bytes; the Dask path delivers them through the worker's stream handlers
    ``PEER_OPS`` (``protocol.py``) instead.
    """

    def __init__(self, worker: Worker, loop: asyncio.AbstractEventLoop, kind: str,
                 handle: Callable[[tuple[Any, ...]], None], sink: Callable[[Any, int], memoryview],
                 serve: Callable[[Any, Answer], Callable[[], None]] | None = None) -> None:
        if kind not in TRANSPORTS:
            raise ValueError(f"pathdask.transport must be 'socket' or 'dask', got {kind!r}")
        self.worker, self.loop, self.kind, self.handle, self.sink = worker, loop, kind, handle, sink
        self.serve = serve  # clients' requests on the socket transport (their fetches)
        self.transport: SocketTransport | None = None
        #: worker address -> its transport address; device threads fill it, under ``_lock``
        self.addresses: dict[str, str] = {}
        self._lock = threading.Lock()
        #: hosts known to have left: nothing is sent to them. Replaced whole (on the event
        #: loop), never mutated, so device threads can read it without a lock.
        self.lost: frozenset[str] = frozenset()
        # event loop only: Dask-comms streams to peers, and messages waiting for one to open
        self.streams: dict[str, BatchedSend] = {}
        self.backlog: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.in_process = bool(dask.config.get("pathdask.in-process-peers"))

    def start(self) -> None:
        """Open the socket transport (if chosen) with Dask's TLS settings.

        Until :meth:`admit` gives it the hosts' shared token, it refuses every connection.
        """
        if self.in_process:
            with _HERE_LOCK:
                _HERE[self.worker.address] = self
        if self.kind != "socket":
            return
        security = self.worker.security
        self.transport = SocketTransport(
            get_address_host(self.worker.address), self.handle, self.sink, secrets.token_bytes(TOKEN_BYTES),
            security.get_listen_args("worker").get("ssl_context"),
            security.get_connection_args("worker").get("ssl_context"), self.serve,
        )

    @property
    def address(self) -> str | None:
        """Where this host's socket transport listens (``None`` on Dask comms)."""
        return self.transport.address if self.transport else None

    def _here(self, addr: str) -> Peers | None:
        """The peer ``addr`` if it runs in this process and takes calls."""
        if not self.in_process:
            return None
        with _HERE_LOCK:
            peer = _HERE.get(addr)
        return peer if peer is not self else None

    def send(self, addr: str, kind: str, *args: Any) -> None:
        if addr in self.lost:
            return  # it left: nothing there waits for this, and connecting would only time out
        peer = self._here(addr)
        if peer is not None:  # a host of this process: handed over on this thread, as its receiver would
            peer.handle((kind, *args))
            return
        if self.transport is not None:
            with self._reaching(addr):
                self.transport.send(self._transport_address(addr), (kind, *args))
            return
        msg: dict[str, Any]
        if kind == XFER:
            msg = {"op": PEER_OPS[XFER], "pieces": [(k, s, to_serialize(v), r) for k, s, v, r in args[0]]}
        elif kind == RECORD:
            msg = {"op": PEER_OPS[RECORD], "fields": args[0]}
        else:
            pid, gang, cause = args
            msg = {"op": PEER_OPS[ABORT], "pid": pid, "gang": gang, "cause": to_serialize(cause)}
        self.loop.call_soon_threadsafe(self._send, addr, msg)

    def send_chunk(self, addr: str, meta: Any, data: memoryview) -> None:
        """One chunk of a large piece; the peer receives it straight into place."""
        if addr in self.lost:
            return
        peer = self._here(addr)
        if peer is not None:
            target = peer.sink(meta, data.nbytes)
            np.frombuffer(target, np.uint8)[:] = np.frombuffer(data, np.uint8)
            peer.handle((CHUNK, meta, data.nbytes))
            return
        if self.transport is not None:
            with self._reaching(addr):
                self.transport.send_chunk(self._transport_address(addr), meta, data)
            return
        # the view keeps its (immutable) buffer alive until Dask has written it
        msg = {"op": PEER_OPS[CHUNK], "meta": meta, "data": to_serialize(np.frombuffer(data, np.uint8))}
        self.loop.call_soon_threadsafe(self._send, addr, msg)

    def on_chunk(self, meta: Any, data: np.ndarray) -> None:
        """The chunk stream handler (Dask comms): put the bytes in place."""
        target = self.sink(meta, data.nbytes)
        target[:] = data.reshape(-1).view(np.uint8).data
        self.handle((CHUNK, meta, data.nbytes))

    @contextlib.contextmanager
    def _reaching(self, addr: str) -> Iterator[None]:
        """A reset or refused connection means the host died: mark it lost, raise DeviceLostError."""
        try:
            yield
        except (OSError, TimeoutError) as e:
            self.mark_lost(addr)
            raise DeviceLostError(
                f"Host {addr} cannot be reached ({type(e).__name__}: {e}); it left the cluster"
            ) from e

    def _transport_address(self, addr: str) -> str:
        """Where ``addr``'s transport listens. The scheduler announces each host's (:meth:`admit`,
        :meth:`mark_joined`); a host that has not heard asks the scheduler, never the peer, which
        may be dead."""
        with self._lock:
            found = self.addresses.get(addr)
        if found is None:
            fut = asyncio.run_coroutine_threadsafe(ask(self.worker.scheduler, TransportOf(addr)), self.loop)
            found = fut.result(timeout=TRANSPORT_LOOKUP_S)
            if found is None:
                raise ConnectionRefusedError(f"the scheduler knows no transport of {addr}")
            with self._lock:
                self.addresses[addr] = found
        return found

    def admit(self, token: bytes, transports: dict[str, str]) -> None:
        """This host registered: the token the hosts present to each other, and where the
        transports of the hosts that joined before it listen (later ones: :meth:`mark_joined`)."""
        if self.transport is not None:
            self.transport.token = token
        with self._lock:
            self.addresses.update(transports)

    def mark_lost(self, host: str) -> None:
        self.lost = self.lost | {host}

    def mark_joined(self, host: str, transport: str | None = None) -> None:
        """A host (re)joined, its transport listening at ``transport`` (a worker restarted on a
        fixed address has a new one)."""
        self.lost = self.lost - {host}
        with self._lock:
            if transport is None:
                self.addresses.pop(host, None)
            else:
                self.addresses[host] = transport

    def _send(self, addr: str, msg: dict[str, Any]) -> None:
        bs = self.streams.get(addr)
        if bs is not None:
            bs.send(msg)
            return
        backlog = self.backlog[addr]
        backlog.append(msg)
        if len(backlog) == 1:
            asyncio.ensure_future(self._connect(addr))

    async def _connect(self, addr: str) -> None:
        try:
            comm = await connect(addr, **self.worker.connection_args)
            await comm.write({"op": PEER_STREAM_OP, "reply": False})
        except Exception:
            logger.exception("pathdask: cannot open a stream to peer host %s", addr)
            self.backlog.pop(addr, None)
            return
        bs = BatchedSend(interval="0ms")
        bs.start(comm)
        self.streams[addr] = bs
        for msg in self.backlog.pop(addr, []):
            bs.send(msg)

    async def handle_stream(self, comm: Any) -> None:
        """The ``PEER_STREAM_OP`` handler: a peer's one-way stream of messages."""
        await self.worker.handle_stream(comm)

    async def close(self) -> None:
        with _HERE_LOCK:
            if _HERE.get(self.worker.address) is self:
                del _HERE[self.worker.address]
        for bs in self.streams.values():
            bs.abort()
        if self.transport is not None:
            await asyncio.to_thread(self.transport.close)
