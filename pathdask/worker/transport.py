"""The host-to-host data path: direct sockets between host runtimes.

Device threads write pieces straight to a peer host's socket, and a receiver
thread per connection hands them to the mailbox. Neither side goes through an
event loop, so a collective's hop costs a socket write and a wake-up instead of
two thread hand-offs and a trip through Dask's batched comms. Each host tells the
scheduler plugin where its transport listens, and the plugin announces it to
every other host (``protocol.HostJoined``), so that a peer's first piece never
waits on a lookup, and a dead peer is never asked. Pickle protocol 5 sends NumPy
buffers out of band, without copies. ``pathdask.transport: dask`` switches back to
Dask's comms (one-way batched streams), which the benchmarks compare.

Clients fetch results on the same transport (``client/fetch.py``): a request
is answered on its own connection (an :class:`Answer`), once the values are
computed, by the thread that stored the last of them (a device's): the answer
leaves as the value is stored, with no thread hand-off. Only a large answer is
left to another thread, so that no device waits for a slow reader.

Security follows Dask's own settings. Every connection opens with a secret
token that the scheduler plugin gave each host and client when it registered
(over Dask's comms; a Dask client can run code on the workers anyway); a peer
without it is cut off before anything it sends is unpickled.
When Dask uses TLS, the connections are TLS too, with the worker's own
certificates and contexts (``Security.get_listen_args``/``get_connection_args``).
"""

from __future__ import annotations

import hmac
import logging
import pickle
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

from ..protocol import CHUNK
from .frames import (
    CHUNK_FRAME,
    HEADER,
    LENGTH,
    connect,
    read_payload,
    readable_now,
    recv_exact,
    recv_into,
    write_message,
)

logger = logging.getLogger("pathdask.transport")

#: the first element of a message that asks for an answer on its connection: ``(REQUEST, request)``
REQUEST = "request"
#: seconds between a TLS receiver's checks, while its request waits for its answer, that the
#: asker is still there (a plain connection's receiver reads on: a hang-up ends the wait at once)
POLL_S = 1.0


class Answer:
    """The one answer to a client's request on its connection, given once, from any thread.

    A small answer is written at once by the thread that gives it: a device's, as it stores
    the last value asked for, so that nothing is handed to another thread on the way back. A
    ``large`` one is written by another thread, so that no device waits for a slow reader.
    On a plain connection the receiver thread reads on meanwhile (the asker's hang-up ends the
    wait at once); a TLS connection is never used by two threads at once, so there the receiver
    waits for the answer (``given``), and writes a large one itself.
    """

    __slots__ = ("conn", "write_lock", "lock", "done", "given", "large", "stop")

    def __init__(self, conn: socket.socket, write_lock: threading.Lock, waited: bool) -> None:
        self.conn, self.write_lock = conn, write_lock
        self.lock = threading.Lock()
        self.done = False
        #: set once the answer is written, or left in ``large``: only where the receiver waits
        self.given = threading.Event() if waited else None
        self.large: Any = None
        #: what stops the waiting for the answer's values (``SocketTransport`` ``serve``'s return)
        self.stop: Callable[[], None] | None = None

    def give(self, answer: Any, large: bool = False) -> bool:
        """Answer the request (``False`` if it had its answer already)."""
        with self.lock:
            if self.done:
                return False
            self.done = True
        if large and self.given is not None:
            self.large = answer
        elif large:
            threading.Thread(target=self.write, args=(answer,), name="pathdask-answer", daemon=True).start()
        else:
            self.write(answer)
        if self.given is not None:
            self.given.set()
        return True

    def write(self, answer: Any) -> None:
        try:
            with self.write_lock:
                write_message(self.conn, answer)
        except OSError:
            pass  # the asker left: its receiver thread sees the connection closed

    def abandon(self) -> None:
        """The asker hung up, or asked again first: stop waiting for the values (an asker still
        there is answered with an error)."""
        self.give(("error", ConnectionAbortedError("nobody waits for this answer any more")))
        if self.stop is not None:
            self.stop()


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
    serve : callable, optional
        ``serve(request, answer)`` takes a ``(REQUEST, request)`` message (a client
        fetching results, ``client/fetch.py``) in the receiver thread and gives its
        :class:`Answer` then or later, from any thread; it returns a function that
        stops its waiting, called if the asker hangs up first (or asks again).
    server_tls, client_tls : ssl.SSLContext, optional
        TLS contexts for accepted and opened connections (both or neither).
    """

    def __init__(self, host: str, handle: Callable[[Any], None], sink: Callable[[Any, int], memoryview],
                 token: bytes, server_tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None,
                 serve: Callable[[Any, Answer], Callable[[], None]] | None = None) -> None:
        self.handle, self.sink, self.serve = handle, sink, serve
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
        with lock:
            write_message(sock, message)

    def send_chunk(self, peer: str, meta: Any, data: memoryview) -> None:
        """Send ``data`` (bytes) with a small ``meta``; the peer receives the bytes straight
        into the buffer its ``sink(meta, nbytes)`` returns, with no copy in between."""
        sock, lock = self._peer(peer)
        payload = pickle.dumps(meta, protocol=5)
        head = HEADER.pack(len(payload), CHUNK_FRAME) + payload + LENGTH.pack(data.nbytes)
        with lock:
            sock.sendall(head)
            sock.sendall(data)

    def _peer(self, peer: str) -> tuple[socket.socket, threading.Lock]:
        entry = self.peers.get(peer)
        if entry is None:
            with self.lock:
                entry = self.peers.get(peer)
                if entry is None:
                    entry = self.peers[peer] = (connect(peer, self.token, self.client_tls), threading.Lock())
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
        """The connection, after TLS and the token check; ``None`` if the peer failed either,
        and then it is counted (``rejected``) before it is closed."""
        try:
            if self.server_tls is not None:
                # handshake here, not in ``wrap_socket``, which closes the socket on failure
                conn = self.server_tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                conn.do_handshake()
            token = bytes(recv_exact(conn, len(self.token)))
        except (ssl.SSLError, ConnectionError, OSError) as e:
            logger.warning("pathdask: refused a peer connection (%s: %s)", type(e).__name__, e)
            self.rejected += 1
            conn.close()
            return None
        if not hmac.compare_digest(token, self.token):
            logger.warning("pathdask: refused a peer connection that did not present the host token")
            self.rejected += 1
            conn.close()
            return None
        with self.lock:
            self.conns.append(conn)
        return conn

    def _receive(self, raw: socket.socket) -> None:
        conn = self._authenticate(raw)
        if conn is None:
            return
        asked: Answer | None = None  # the last request's answer
        write_lock = threading.Lock()
        try:
            while not self.closing:
                size, nbuf = HEADER.unpack(recv_exact(conn, HEADER.size))
                if nbuf == CHUNK_FRAME:
                    self._receive_chunk(conn, pickle.loads(recv_exact(conn, size)))
                    continue
                message = read_payload(conn, size, nbuf)
                if isinstance(message, tuple) and message and message[0] == REQUEST:
                    # a client's request, answered on its connection: it waits for nothing else
                    if asked is not None and not asked.done:  # a client asks one thing at a time
                        conn.shutdown(socket.SHUT_RDWR)
                        raise ConnectionError("a client asked again before its answer")
                    asked = self._serve(message[1], conn, write_lock)
                    continue
                try:
                    self.handle(message)
                except Exception:
                    logger.exception("pathdask: failed to handle a message from a peer host")
        except (ConnectionError, OSError):
            pass  # the peer went away or we are closing
        finally:
            if asked is not None and not asked.done:
                asked.abandon()

    def _serve(self, request: Any, conn: socket.socket, write_lock: threading.Lock) -> Answer:
        """Take a request; on TLS, also wait until its answer is out, or until the asker hung
        up (readable means EOF, a reset, or a second request before this answer)."""
        answer = Answer(conn, write_lock, waited=isinstance(conn, ssl.SSLSocket))
        if self.serve is None:
            answer.give(("error", RuntimeError("this transport answers no requests")))
        else:
            try:
                answer.stop = self.serve(request, answer)
            except Exception as e:  # noqa: BLE001 - the asker gets it, typed
                logger.exception("pathdask: failed to answer a request")
                answer.give(("error", RuntimeError(f"{type(e).__name__}: {e}")))
        if answer.given is not None:
            while not answer.given.wait(POLL_S):
                if self.closing or readable_now(conn):
                    answer.abandon()
            if answer.large is not None:
                answer.write(answer.large)
        return answer

    def _receive_chunk(self, conn: socket.socket, meta: Any) -> None:
        (n,) = LENGTH.unpack(recv_exact(conn, LENGTH.size))
        recv_into(conn, self.sink(meta, n))
        try:
            self.handle((CHUNK, meta, n))
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
