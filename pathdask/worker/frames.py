"""How messages are framed on the hosts' transport connections (``transport.py``).

A message is pickled with protocol 5, its NumPy buffers out of band: a header
(the pickle's length and the number of buffers), the pickle, then each buffer
after its length, so that no buffer is copied on either side. A chunk frame
carries one large piece's bytes instead, received straight into their place.
A client reads the answer to its request in one read where it is small
(:func:`read_answer`).
"""

from __future__ import annotations

import pickle
import select
import socket
import ssl
import struct
from typing import Any

import numpy as np

__all__ = ["CHUNK_FRAME", "HEADER", "LENGTH", "connect", "read_answer", "read_payload", "readable_now",
           "recv_exact", "recv_into", "write_message"]

HEADER = struct.Struct("!II")  # pickle length, number of out-of-band buffers (or CHUNK_FRAME)
LENGTH = struct.Struct("!Q")
#: in place of the number of buffers: a chunk frame, whose one buffer goes where ``sink`` says
CHUNK_FRAME = 0xFFFFFFFF


def recv_into(sock: socket.socket, view: memoryview) -> memoryview:
    """Fill ``view`` from ``sock``; ``ConnectionError`` if the peer closes first."""
    n, got = view.nbytes, 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return view


def recv_exact(sock: socket.socket, n: int) -> memoryview:
    """The next ``n`` bytes from ``sock``, in memory of their own."""
    # np.empty, not bytearray: nothing is zero-filled only to be overwritten
    return recv_into(sock, np.empty(n, dtype=np.uint8).data)


def write_message(sock: socket.socket, message: Any) -> None:
    """Write one framed message: pickled with protocol 5, NumPy buffers out of band."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    parts: list[Any] = [HEADER.pack(len(payload), len(raws)), payload]
    for r in raws:
        parts += [LENGTH.pack(r.nbytes), r]
    if len(payload) + sum(r.nbytes for r in raws) < 1 << 16:
        sock.sendall(b"".join(parts))  # one write, one wake-up on the other side
    else:
        for part in parts:  # large buffers go without a copy
            sock.sendall(part)


def connect(address: str, token: bytes, tls: ssl.SSLContext | None, timeout: float | None = None) -> socket.socket:
    """A connection to the transport at ``address`` (``host:port``), through TLS where ``tls``
    is given, that has presented ``token``; it blocks with no timeout once open."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.wrap_socket(sock)
        sock.sendall(token)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


def readable_now(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or is closed) right now; any number of file
    descriptors (``select.select`` stops at 1024)."""
    try:
        poller = select.poll()  # no kernel object to make and close, as an epoll selector has
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # closed under us


#: what :func:`read_answer` asks of its first read: a small answer comes whole in it
FIRST_READ = 1 << 16


def read_answer(sock: socket.socket) -> Any:
    """Read the one message :func:`write_message` wrote as the answer to a request.

    A small answer is taken in one read, with one system call (and one return to the
    interpreter's lock) instead of one per part; a large one's buffers are read straight into
    arrays of their own. It must be the only message on its way: bytes past it are an error.
    """
    reader = _Reader(sock)
    size, nbuf = HEADER.unpack(reader.take(HEADER.size))
    if nbuf == CHUNK_FRAME:
        raise ConnectionError("a chunk frame came where an answer was expected")
    payload = reader.take(size)
    buffers = []
    for _ in range(nbuf):
        (n,) = LENGTH.unpack(reader.take(LENGTH.size))
        buffers.append(reader.take(n, own=True))
    if reader.left:
        raise ConnectionError(f"{reader.left} bytes came after an answer")
    return pickle.loads(payload, buffers=buffers)


class _Reader:
    """Parts of one message from a socket, after one first read of up to :data:`FIRST_READ` bytes."""

    __slots__ = ("sock", "data", "at")

    def __init__(self, sock: socket.socket) -> None:
        first = np.empty(FIRST_READ, dtype=np.uint8).data
        got = sock.recv_into(first)
        if got == 0:
            raise ConnectionError("peer closed the connection")
        self.sock, self.data, self.at = sock, first[:got], 0

    @property
    def left(self) -> int:
        return self.data.nbytes - self.at

    def take(self, n: int, own: bool = False) -> memoryview:
        """The next ``n`` bytes; ``own``: in memory of their own (what the message's arrays keep),
        not a view of the first read's."""
        have = min(n, self.left)
        if have == n and not own:
            self.at += n
            return self.data[self.at - n:self.at]
        out = np.empty(n, dtype=np.uint8).data
        out[:have] = self.data[self.at:self.at + have]
        self.at += have
        if have < n:
            recv_into(self.sock, out[have:])
        return out


def read_payload(sock: socket.socket, size: int, nbuf: int) -> Any:
    payload = recv_exact(sock, size)
    buffers = []
    for _ in range(nbuf):
        (n,) = LENGTH.unpack(recv_exact(sock, LENGTH.size))
        buffers.append(recv_exact(sock, n))
    return pickle.loads(payload, buffers=buffers)
