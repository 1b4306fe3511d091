"""The host-to-host data path: direct sockets between host runtimes.

Device threads write pieces straight to a peer host's socket, and a receiver
thread per connection hands them to the mailbox. Neither side goes through an
event loop, so a collective's hop costs a socket write and a wake-up instead of
two thread hand-offs and a trip through Dask's batched comms. Each host tells the
scheduler plugin where its transport listens, and the plugin announces it to
every other host (``pathdask-host-joined``), so that a peer's first piece never
waits on a lookup, and a dead peer is never asked. Pickle protocol 5 sends NumPy
buffers out of band, without copies. ``pathdask.transport: dask`` switches back to
Dask's comms (one-way batched streams), which the benchmarks compare.

Security follows Dask's own settings. Every connection opens with a secret
token that the scheduler plugin gave each host when it registered (over Dask's
comms); a peer without it is cut off before anything it sends is unpickled.
When Dask uses TLS, the connections are TLS too, with the worker's own
certificates and contexts (``Security.get_listen_args``/``get_connection_args``).
"""

from __future__ import annotations

import hmac
import logging
import pickle
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger("pathdask.transport")

_HEADER = struct.Struct("!II")  # pickle length, number of out-of-band buffers (or _CHUNK)
_LEN = struct.Struct("!Q")
#: in place of the number of buffers: a chunk frame, whose one buffer goes where ``sink`` says
_CHUNK = 0xFFFFFFFF


def _recv_into(sock: socket.socket, view: memoryview) -> memoryview:
    n, got = view.nbytes, 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return view


def _recv_exact(sock: socket.socket, n: int) -> memoryview:
    # np.empty, not bytearray: nothing is zero-filled only to be overwritten
    return _recv_into(sock, np.empty(n, dtype=np.uint8).data)


class SocketTransport:
    """Listens on ``host`` and sends framed, pickled messages to peers by address.

    Parameters
    ----------
    host : str
        Interface to listen on (the worker's own host).
    handle : callable
        Called in a receiver thread with each message object that arrives, and
        with ``("chunk", meta, nbytes)`` once a chunk's bytes are in place.
    sink : callable
        ``sink(meta, nbytes)`` says where a chunk's bytes go: a writable
        ``memoryview`` of ``nbytes`` bytes (see :meth:`send_chunk`).
    token : bytes
        The secret every peer presents first; connections without it are closed.
    server_tls, client_tls : ssl.SSLContext, optional
        TLS contexts for accepted and opened connections (both or neither).
    """

    def __init__(self, host: str, handle: Callable[[Any], None], sink: Callable[[Any, int], memoryview],
                 token: bytes, server_tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None) -> None:
        self.handle, self.sink = handle, sink
        self.token = token
        self.server_tls, self.client_tls = server_tls, client_tls
        self.rejected = 0  # connections closed for a wrong token or a failed TLS handshake
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

    def send_chunk(self, peer: str, meta: Any, data: memoryview) -> None:
        """Send ``data`` (bytes) with a small ``meta``; the peer receives the bytes straight
        into the buffer its ``sink(meta, nbytes)`` returns, with no copy in between."""
        sock, lock = self._peer(peer)
        payload = pickle.dumps(meta, protocol=5)
        head = _HEADER.pack(len(payload), _CHUNK) + payload + _LEN.pack(data.nbytes)
        with lock:
            sock.sendall(head)
            sock.sendall(data)

    def _peer(self, peer: str) -> tuple[socket.socket, threading.Lock]:
        entry = self.peers.get(peer)
        if entry is None:
            with self.lock:
                entry = self.peers.get(peer)
                if entry is None:
                    host, port = peer.rsplit(":", 1)
                    sock = socket.create_connection((host, int(port)))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if self.client_tls is not None:
                        sock = self.client_tls.wrap_socket(sock)
                    sock.sendall(self.token)
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
            t = threading.Thread(target=self._receive, args=(conn,), name="pathdask-recv", daemon=True)
            self.threads.append(t)
            t.start()

    def _authenticate(self, conn: socket.socket) -> socket.socket | None:
        """The connection, after TLS and the token check; ``None`` if the peer failed either."""
        try:
            if self.server_tls is not None:
                conn = self.server_tls.wrap_socket(conn, server_side=True)
            token = bytes(_recv_exact(conn, len(self.token)))
        except (ssl.SSLError, ConnectionError, OSError) as e:
            logger.warning("pathdask: refused a peer connection (%s: %s)", type(e).__name__, e)
            self.rejected += 1
            return None
        if not hmac.compare_digest(token, self.token):
            logger.warning("pathdask: refused a peer connection that did not present the host token")
            self.rejected += 1
            return None
        with self.lock:
            self.conns.append(conn)
        return conn

    def _receive(self, raw: socket.socket) -> None:
        conn = self._authenticate(raw)
        if conn is None:
            raw.close()
            return
        try:
            while not self.closing:
                size, nbuf = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
                payload = _recv_exact(conn, size)
                if nbuf == _CHUNK:
                    self._receive_chunk(conn, pickle.loads(payload))
                    continue
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

    def _receive_chunk(self, conn: socket.socket, meta: Any) -> None:
        (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
        _recv_into(conn, self.sink(meta, n))
        try:
            self.handle(("chunk", meta, n))
        except Exception:
            logger.exception("pathdask: failed to handle a chunk from a peer host")

    def close(self) -> None:
        self.closing = True
        with self.lock:
            socks = [self.listener, *self.conns, *(p[0] for p in self.peers.values())]
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(timeout=2)
