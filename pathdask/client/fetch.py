"""Fetching results over the hosts' socket transports, from the calling thread.

``result()`` asks each host that holds blocks of an array for their values on a
direct connection to that host's socket transport (``worker/transport.py``),
the one the hosts use for pieces. Neither the client's event loop nor Dask's
serialization is on the way: the calling thread writes the requests and waits
on the sockets, and each host answers from that connection's receiver thread as
soon as its devices stored the values.

The connection opens with the hosts' shared token, which the scheduler plugin
gives a client when it registers (a Dask client can run code on the workers
anyway), over TLS where Dask uses it. A connection carries one request at a
time; idle ones are kept for the next fetch.

A client that cannot reach a host's transport (a firewall that lets only Dask's
ports through) fetches over Dask's comms instead, from then on, and says so once
in its log.

Nothing waits forever. ``timeout`` bounds the whole fetch; a fetch still waiting
after :data:`HOST_CHECK_AFTER` asks the scheduler whether the hosts it waits for
have left (``DeviceLostError``), and again at doubling intervals up to
:data:`HOST_CHECK_MAX`, one message each time; a connection that closes or
resets is a lost host. A fetch that ends early (an error, a timeout, Ctrl-C) closes the
connections it did not read to the end, and the hosts stop waiting for their
values.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import DeviceLostError
from ..gather import OutputRef, assemble
from ..stopwatch import mark
from ..worker.frames import connect, read_answer, readable_now, write_message
from ..worker.transport import REQUEST

__all__ = ["HOST_CHECK_AFTER", "HostSockets", "Unreachable"]

#: a fetch that takes longer than this asks the scheduler whether its hosts have left (a dead
#: host's connection may not say so: its machine, not only its process, may be gone)
HOST_CHECK_AFTER = 0.5
#: the longest time between two such checks while a fetch waits (they double from HOST_CHECK_AFTER)
HOST_CHECK_MAX = 5.0
#: seconds to open a connection to a host's transport
CONNECT_TIMEOUT = 10.0
#: how long a client whose connection a host's transport refused waits for the scheduler to say
#: whether that host left (a killed host refuses before the scheduler has removed it), before
#: taking the host for unreachable from here (a firewall) and fetching over Dask's comms
GONE_WAIT = 2.0


class Unreachable(ConnectionError):
    """A host that is in the cluster refuses this client's connections, or drops them (a
    firewall that lets only Dask's ports through): its results are fetched over Dask's comms."""


class HostSockets:
    """A client's connections to the hosts' transports, for its fetches (any thread).

    Parameters
    ----------
    token : bytes
        The hosts' shared token, presented first on each connection.
    transports : dict
        Host (worker) address -> where its transport listens, as the scheduler knew them.
    tls : ssl.SSLContext, optional
        The client's TLS context where Dask uses TLS.
    lookup : callable
        ``lookup(host)`` asks the scheduler where ``host``'s transport listens now;
        ``None`` if the host has left.
    gone : callable
        ``gone(hosts)`` asks the scheduler which of ``hosts`` have left, in one message.
    left : callable
        ``left(host, seconds)``: whether the scheduler says within ``seconds`` that ``host`` left.
    """

    def __init__(self, token: bytes, transports: dict[str, str], tls: ssl.SSLContext | None,
                 lookup: Callable[[str], str | None], gone: Callable[[list[str]], list[str]],
                 left: Callable[[str, float], bool]) -> None:
        self.token, self.tls, self.lookup, self.gone, self.left = token, tls, lookup, gone, left
        self.addresses = dict(transports)
        self.idle: dict[str, list[socket.socket]] = defaultdict(list)
        self.lock = threading.Lock()
        self.closed = False

    def fetch(self, ref: OutputRef, avoid: frozenset[int] = frozenset(),
              timeout: float | None = None) -> np.ndarray:
        """The global array of ``ref``, its blocks asked of their hosts at once.

        Raises the error that ended the array's program with its own type,
        ``DeviceLostError`` if a host holding blocks left, and ``TimeoutError``
        after ``timeout`` seconds.
        """
        want = ref.shards(avoid)
        deadline = None if timeout is None else time.monotonic() + timeout
        asked: dict[socket.socket, str] = {}  # connections whose answer is not read yet
        replies: dict[str, list[np.ndarray]] = {}
        try:
            for addr, items in want.items():
                sock = self._connection(addr)
                asked[sock] = addr
                with _lost_if_cut(addr):
                    write_message(sock, (REQUEST, ("fetch", [b for _, b in items])))
            mark("asked", ref.pid)
            poller = select.poll()  # no file descriptor of its own to make and close, as epoll has
            by_fd: dict[int, socket.socket] = {}
            for sock in asked:
                poller.register(sock, select.POLLIN)
                by_fd[sock.fileno()] = sock
            every = HOST_CHECK_AFTER  # between checks that the hosts are still there, doubling
            check_at = time.monotonic() + every
            while asked:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TimeoutError(f"no answer within {timeout:g}s from host(s) {sorted(asked.values())}")
                until = check_at if deadline is None else min(check_at, deadline)
                for fd, _ in poller.poll(max(0.0, until - now) * 1e3):
                    sock = by_fd[fd]
                    addr = asked[sock]
                    with _lost_if_cut(addr):
                        kind, value = read_answer(sock)
                    poller.unregister(sock)
                    del asked[sock]
                    self._keep(addr, sock)
                    if kind == "error":
                        raise value
                    replies[addr] = value
                if asked and time.monotonic() >= check_at:
                    gone = self.gone(sorted(set(asked.values())))
                    if gone:
                        raise DeviceLostError(f"Host(s) {gone}, which hold shards of this array, left the cluster")
                    every = min(2 * every, HOST_CHECK_MAX)
                    check_at = time.monotonic() + every
        finally:
            for sock in asked:  # not read to the end: its host stops waiting when it sees it closed
                _close(sock)
        return assemble(ref, want, replies)

    def _connection(self, addr: str) -> socket.socket:
        """An idle connection to host ``addr``'s transport that is still open, or a new one.

        A host restarted on its address has a new transport: where the known one
        refuses, the scheduler is asked again. Where the one it names refuses too, the host
        may have just died (its process killed: the scheduler has not removed it yet), or be
        out of this client's reach: the scheduler's word decides, within :data:`GONE_WAIT`.
        Only a host still there after that is ``Unreachable``, which sends every later fetch
        over Dask's comms.
        """
        while True:
            with self.lock:
                if self.closed:
                    raise RuntimeError("this client is closed")
                idle = self.idle.get(addr)
                sock = idle.pop() if idle else None
                where = self.addresses.get(addr)
            if sock is None:
                break
            if not readable_now(sock):  # an idle connection has nothing to read unless it closed
                return sock
            _close(sock)
        if where is not None:
            try:
                return self._connect(where)
            except OSError:
                pass  # asked again below
        found = self.lookup(addr)
        if found is None:
            raise DeviceLostError(f"Host {addr}, which holds shards of this array, left the cluster")
        with self.lock:
            self.addresses[addr] = found
        try:
            return self._connect(found)
        except OSError as e:
            if self.left(addr, GONE_WAIT):
                raise DeviceLostError(f"Host {addr}, which holds shards of this array, left the cluster") from e
            # the host is there, but this client cannot reach its transport
            raise Unreachable(f"host {addr} is in the cluster, but its transport at {found} cannot be "
                              f"reached from this client ({type(e).__name__}: {e})") from e

    def _connect(self, where: str) -> socket.socket:
        return connect(where, self.token, self.tls, CONNECT_TIMEOUT)  # then the fetch waits with poll

    def _keep(self, addr: str, sock: socket.socket) -> None:
        with self.lock:
            if not self.closed:
                self.idle[addr].append(sock)
                return
        _close(sock)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            socks = [s for idle in self.idle.values() for s in idle]
            self.idle.clear()
        for s in socks:
            _close(s)


@contextlib.contextmanager
def _lost_if_cut(addr: str) -> Iterator[None]:
    """A connection to host ``addr`` that fails (refused, reset, closed) means the host is gone."""
    try:
        yield
    except TimeoutError:
        raise
    except OSError as e:
        raise DeviceLostError(f"Host {addr}, which holds shards of this array, is gone "
                              f"({type(e).__name__}: {e})") from e


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
