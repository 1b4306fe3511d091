"""A tiny TCP/UDP echo to measure links between namespaces (there may be no ``ping``).

Standard library only, run as a file inside a namespace::

    ip netns exec NS python -I echo.py serve IP PORT        # prints "ready", serves until killed
    ip netns exec NS python -I echo.py rtt IP PORT N         # JSON: N one-byte TCP round trips (s)
    ip netns exec NS python -I echo.py send IP PORT BYTES    # JSON: bytes/s of one TCP transfer
    ip netns exec NS python -I echo.py udp IP PORT N         # JSON: sequence numbers echoed back

``serve`` answers on TCP (a first byte ``e``: echo each byte; ``s``: read an
8-byte length, swallow that many bytes, answer ``k``) and echoes UDP datagrams.
``udp`` sends N numbered datagrams, 1 ms apart, and reports which came back, in
which order.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

__all__ = ["main"]


def _tcp(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = conn.recv(1)
        if mode == b"e":
            while data := conn.recv(65536):
                conn.sendall(data)
        elif mode == b"s":
            left = struct.unpack("!Q", _exactly(conn, 8))[0]
            while left > 0:
                data = conn.recv(min(left, 1 << 20))
                if not data:
                    return
                left -= len(data)
            conn.sendall(b"k")


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection early")
        data += chunk
    return data


def serve(host: str, port: int) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((host, port))

    def echo_udp() -> None:
        while True:
            data, peer = udp.recvfrom(2048)
            udp.sendto(data, peer)

    threading.Thread(target=echo_udp, daemon=True).start()
    server = socket.create_server((host, port))
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_tcp, args=(conn,), daemon=True).start()


def _connect(host: str, port: int, mode: bytes) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=30)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(mode)
    return conn


def rtt(host: str, port: int, n: int) -> list[float]:
    """Seconds of ``n`` one-byte round trips over one connection (after one to warm it)."""
    with _connect(host, port, b"e") as conn:
        times = []
        for _ in range(n + 1):
            start = time.perf_counter()
            conn.sendall(b"x")
            _exactly(conn, 1)
            times.append(time.perf_counter() - start)
    return times[1:]


def send(host: str, port: int, nbytes: int) -> float:
    """Bytes per second of one transfer of ``nbytes``, until the far end has them all."""
    block = bytes(1 << 20)
    with _connect(host, port, b"s") as conn:
        start = time.perf_counter()
        conn.sendall(struct.pack("!Q", nbytes))
        left = nbytes
        while left > 0:
            left -= conn.send(block[: min(left, len(block))])
        _exactly(conn, 1)
        return nbytes / (time.perf_counter() - start)


def udp(host: str, port: int, n: int) -> list[int]:
    """Sequence numbers of the ``n`` datagrams (sent 1 ms apart) that came back within 2 s, in the
    order they came."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((host, port))
    back: list[int] = []

    def drain(timeout: float) -> None:  # as they come: a full receive buffer would drop some
        sock.settimeout(timeout)
        try:
            while len(back) < n:
                back.append(struct.unpack("!I", sock.recv(64))[0])
                sock.settimeout(timeout)
        except (TimeoutError, BlockingIOError):
            pass

    for i in range(n):
        sock.send(struct.pack("!I", i))
        deadline = time.perf_counter() + 0.001
        while (left := deadline - time.perf_counter()) > 0:
            drain(left)
    drain(2.0)
    return back


def main(argv: list[str]) -> None:
    command, host, port = argv[0], argv[1], int(argv[2])
    if command == "serve":
        serve(host, port)
        return
    count = int(argv[3])
    result = {"rtt": rtt, "send": send, "udp": udp}[command](host, port, count)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
