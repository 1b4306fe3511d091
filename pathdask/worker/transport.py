"""The host-to-host data path: direct sockets between host runtimes.

Device threads write pieces straight to a peer host's socket, and a receiver
thread per connection hands them to the mailbox. Neither side goes through an
event loop, so a collective's hop costs a socket write and a wake-up instead of
two thread hand-offs and a trip through Dask's batched comms. Peers find each
other through a Dask handler (``pathdask_transport``) on the worker, so the
connection follows Dask's own worker addresses. Pickle protocol 5 sends NumPy
buffers out of band, without copies. ``pathdask.transport: dask`` switches back to
Dask's comms (one-way batched streams), which the benchmarks compare.
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("pathdask.transport")

_HEADER = struct.Struct("!II")  # pickle length, number of out-of-band buffers
_LEN = struct.Struct("!Q")


def _recv_exact(sock: socket.socket, n: int) -> memoryview:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return view


class SocketTransport:
    """Listens on ``host`` and sends framed, pickled messages to peers by address.

    Parameters
    ----------
    host : str
        Interface to listen on (the worker's own host).
    handle : callable
        Called in a receiver thread with each message object that arrives.
    """

    def __init__(self, host: str, handle: Callable[[Any], None]) -> None:
        self.handle = handle
        self.listener = socket.create_server((host, 0))
        host, port = self.listener.getsockname()[:2]
        self.address = f"{host}:{port}"
        self.peers: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self.lock = threading.Lock()
        self.closing = False
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, name="pathdask-accept", daemon=True)]
        self.threads[0].start()

    # -- sending (any thread) -----------------------------------------------
    def send(self, peer: str, message: Any) -> None:
        sock, lock = self._peer(peer)
        buffers: list[pickle.PickleBuffer] = []
        payload = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        parts: list[Any] = [_HEADER.pack(len(payload), len(raws)), payload]
        for r in raws:
            parts += [_LEN.pack(r.nbytes), r]
        with lock:
            if len(payload) + sum(r.nbytes for r in raws) < 1 << 16:
                sock.sendall(b"".join(parts))  # one write, one wake-up on the other side
            else:
                for part in parts:  # large buffers go without a copy
                    sock.sendall(part)

    def _peer(self, peer: str) -> tuple[socket.socket, threading.Lock]:
        entry = self.peers.get(peer)
        if entry is None:
            with self.lock:
                entry = self.peers.get(peer)
                if entry is None:
                    host, port = peer.rsplit(":", 1)
                    sock = socket.create_connection((host, int(port)))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    entry = self.peers[peer] = (sock, threading.Lock())
        return entry

    # -- receiving -------------------------------------------------------------
    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.append(conn)
            t = threading.Thread(target=self._receive, args=(conn,), name="pathdask-recv", daemon=True)
            self.threads.append(t)
            t.start()

    def _receive(self, conn: socket.socket) -> None:
        try:
            while not self.closing:
                size, nbuf = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
                payload = _recv_exact(conn, size)
                buffers = []
                for _ in range(nbuf):
                    (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                    buffers.append(_recv_exact(conn, n))
                message = pickle.loads(payload, buffers=buffers)
                try:
                    self.handle(message)
                except Exception:
                    logger.exception("pathdask: failed to handle a message from a peer host")
        except (ConnectionError, OSError):
            pass  # the peer went away or we are closing

    def close(self) -> None:
        self.closing = True
        for s in [self.listener, *self.conns, *(p[0] for p in self.peers.values())]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(timeout=2)
