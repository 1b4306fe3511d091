"""A user-space delay line: two TAP devices, every Ethernet frame passed from one to the other late.

Where the kernel has no ``sch_netem``, a machine of
:class:`~pathdask.netns.harness.NetnsSystem` gets its link from this program
instead of a veth pair: TAP ``A`` becomes the machine's ``eth0`` (moved into its
namespace), TAP ``B`` is plugged into the bridge, and this process forwards
each frame A→B and B→A ``delay`` seconds after it read it, in order (one FIFO
of due times per direction), dropping each with probability ``loss`` and, if
given, pacing each direction to ``rate`` bit/s (a frame leaves ``delay`` after
its last bit has been sent at that rate).

The TAPs are not persistent: they vanish when this process exits, however it
exits, so stopping the process (by its PID) tears the link down.

It is one thread with ``select`` (microsecond timeouts), using only the
standard library, so that it starts in a fraction of a second when run as a
file (``python .../delayline.py``) rather than through the ``pathdask``
package. Protocol on its standard streams:

- once both TAPs exist it prints ``ready A B`` on stdout;
- each line on stdin sets its parameters (``delay=0.05 loss=0.01 rate=1e9``,
  any subset; ``rate=0`` removes the rate) and is answered with ``ok ...``, or
  ``stats``, answered with a JSON line of counters (frames and bytes
  forwarded, dropped by ``loss``, by the queue limit, by a failed write);
- end of stdin, SIGTERM or SIGINT stop it.

Run ``python -m pathdask.netns.delayline --a tapa --b tapb --delay 0.001``
(as root).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["DelayLineError", "Direction", "Params", "main", "open_tap", "serve", "update"]

TUN_PATH = "/dev/net/tun"
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
READ_SIZE = 65536 + 64  # a frame of the largest MTU a TAP takes, plus its Ethernet header
PR_SET_TIMERSLACK = 29
MAX_EARLY = 0.0001  # seconds: the most a wake-up is brought forward (then spun) for its latency
COARSE = 0.002  # seconds: a longer sleep stops this much short of its wake-up, then sleeps again
BATCH = 64  # frames read from one TAP before the other gets its turn


class DelayLineError(RuntimeError):
    """The delay line cannot be set up (no ``/dev/net/tun``, no permission, a bad name or value)."""


def open_tap(name: str) -> int:
    """Create TAP ``name`` (no packet-info header, not persistent); its non-blocking fd."""
    if not 0 < len(name.encode()) < 16:
        raise DelayLineError(f"TAP name {name!r} must have 1 to 15 bytes")
    try:
        fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DelayLineError(f"{TUN_PATH} is missing: load the tun module (modprobe tun) or, in a "
                             "container, pass the device (--device /dev/net/tun)") from None
    except PermissionError:
        raise DelayLineError(f"{TUN_PATH} cannot be opened: run as root (CAP_NET_ADMIN)") from None
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        raise DelayLineError(f"TUNSETIFF {name!r} failed: {e.strerror} (a device of that name "
                             "exists already, or CAP_NET_ADMIN is missing)") from None
    return fd


@dataclass
class Params:
    """One direction's one-way ``delay`` (s), ``loss`` (0-1), ``rate`` (bit/s, ``None``: unpaced) and
    ``limit`` (frames queued at most; beyond it, arriving frames are dropped)."""

    delay: float = 0.0
    loss: float = 0.0
    rate: float | None = None
    limit: int = 10000

    def check(self) -> None:
        if not self.delay >= 0:
            raise DelayLineError(f"delay must be >= 0 seconds, got {self.delay!r}")
        if not 0 <= self.loss <= 1:
            raise DelayLineError(f"loss must be a share from 0 to 1, got {self.loss!r}")
        if self.rate is not None and not self.rate > 0:
            raise DelayLineError(f"rate must be > 0 bit/s (or 0 for none), got {self.rate!r}")
        if self.limit < 1:
            raise DelayLineError(f"limit must be at least one frame, got {self.limit!r}")

    def __str__(self) -> str:
        return f"delay={self.delay!r} loss={self.loss!r} rate={self.rate or 0!r} limit={self.limit}"


def update(forth: Params, back: Params, line: str) -> None:
    """Set both directions from ``key=value`` words, all or nothing: ``delay``, ``loss``, ``rate``
    and ``limit`` are A→B's, ``back_delay``, ``back_loss``, ``back_rate``, ``back_limit`` B→A's."""
    new = {"": replace(forth), "back_": replace(back)}
    for word in line.split():
        key, _, value = word.partition("=")
        prefix = "back_" if key.startswith("back_") else ""
        name = key.removeprefix(prefix)
        try:
            number = float(value)
        except ValueError:
            raise DelayLineError(f"{word!r}: expected key=number") from None
        if name not in ("delay", "loss", "rate", "limit"):
            raise DelayLineError(f"{word!r}: the keys are delay, loss, rate, limit and their back_ forms")
        setattr(new[prefix], name, int(number) if name == "limit" else (number or None) if name == "rate"
                else number)
    for params in new.values():
        params.check()
    for params, changed in ((forth, new[""]), (back, new["back_"])):
        params.delay, params.loss, params.rate, params.limit = (changed.delay, changed.loss, changed.rate,
                                                                changed.limit)


@dataclass
class Direction:
    """Frames read from ``src`` on their way to ``dst``: a FIFO of ``(due, frame)``."""

    src: int
    dst: int
    params: Params
    queue: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    free_at: float = 0.0  # when the paced link has sent its last queued bit
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("frames", "bytes", "lost", "overflow", "failed"), 0))

    def take(self, rng: random.Random) -> None:
        """Read up to :data:`BATCH` frames from ``src`` and queue them with their due times."""
        for _ in range(BATCH):
            try:
                frame = os.read(self.src, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EIO, errno.EBADFD):  # the device is down
                    return
                raise
            now, params = time.monotonic(), self.params
            if params.loss and rng.random() < params.loss:
                self.counts["lost"] += 1
                continue
            if len(self.queue) >= params.limit:
                self.counts["overflow"] += 1
                continue
            sent = now
            if params.rate:
                sent = self.free_at = max(now, self.free_at) + len(frame) * 8 / params.rate
            self.queue.append((sent + params.delay, frame))

    def give(self, now: float) -> None:
        """Write every frame that is due to ``dst``, in order."""
        queue, counts = self.queue, self.counts
        while queue and queue[0][0] <= now:
            frame = queue.popleft()[1]
            try:
                os.write(self.dst, frame)
            except OSError:  # the other TAP is down (EIO) or its queue full: a lost frame
                counts["failed"] += 1
                continue
            counts["frames"] += 1
            counts["bytes"] += len(frame)

    def next_due(self) -> float | None:
        return self.queue[0][0] if self.queue else None


def _fine_timers() -> None:
    """Ask the kernel to wake this process on time (a timer slack of 1 ns instead of 50 us)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0)
    except (OSError, AttributeError):  # not glibc/Linux: the default slack only costs some accuracy
        pass


class _Stop(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def serve(forth: Direction, back: Direction, control: int | None, seed: int | None = None) -> dict[str, dict]:
    """Forward frames both ways until stopped (end of ``control``, SIGTERM); the counters of both."""
    rng = random.Random(seed)
    ways = {"a_to_b": forth, "b_to_a": back}
    by_fd = {forth.src: forth, back.src: back}
    watch = [forth.src, back.src] + ([control] if control is not None else [])
    pending = b""
    late = 0.0  # how late a timed wake-up comes (a running mean): wake that much earlier, then spin
    try:
        while True:
            dues = [d for d in (forth.next_due(), back.next_due()) if d is not None]
            wake = min(dues) - late if dues else None
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            fine = timeout is not None and 0 < timeout <= COARSE
            if timeout is not None and timeout > COARSE:  # a long sleep's slack grows with it: two naps
                timeout -= COARSE / 2
            readable, _, _ = select.select(watch, [], [], timeout)
            if not readable and wake is not None and fine:
                late = min(MAX_EARLY, late + (time.monotonic() - wake - late) / 8)
            for fd in readable:
                if fd == control:
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        break
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        print(_answer(line.decode(errors="replace").strip(), forth, back), flush=True)
                else:
                    by_fd[fd].take(rng)
            else:
                now = time.monotonic()
                forth.give(now)
                back.give(now)
                continue
            break
    except _Stop:
        pass
    return {k: w.counts for k, w in ways.items()}


def _answer(line: str, forth: Direction, back: Direction) -> str:
    if line == "stats":
        return json.dumps({k: {**w.counts, "queued": len(w.queue)}
                           for k, w in (("a_to_b", forth), ("b_to_a", back))})
    try:
        update(forth.params, back.params, line)
    except DelayLineError as e:
        return f"error {e}"
    return f"ok {forth.params} back_{str(back.params).replace(' ', ' back_')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pathdask.netns.delayline", description=(
        "Forward Ethernet frames between two new TAP devices after a delay (see the module). "
        "The --back-* options shape B to A and default to the A to B values."))
    parser.add_argument("--a", required=True, help="the first TAP's name (e.g. a machine's eth0-to-be)")
    parser.add_argument("--b", required=True, help="the second TAP's name (e.g. a bridge port)")
    parser.add_argument("--delay", type=float, default=0.0, help="one-way delay A to B in seconds")
    parser.add_argument("--loss", type=float, default=0.0, help="share of frames A to B dropped (0-1)")
    parser.add_argument("--rate", type=float, default=0.0, help="bit/s A to B (0: as fast as it goes)")
    parser.add_argument("--limit", type=int, default=10000, help="frames queued A to B at most")
    for name in ("delay", "loss", "rate", "limit"):
        parser.add_argument(f"--back-{name}", type=type(parser.get_default(name)), default=None,
                            help=f"{name} B to A (default: as A to B)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the loss draws")
    args = parser.parse_args(argv)
    forth = Params(args.delay, args.loss, args.rate or None, args.limit)

    def back_(name: str) -> Any:
        value = getattr(args, f"back_{name}")
        return getattr(args, name) if value is None else value

    back = Params(back_("delay"), back_("loss"), back_("rate") or None, back_("limit"))
    try:
        forth.check()
        back.check()
        a = open_tap(args.a)
        b = open_tap(args.b)
    except DelayLineError as e:
        print(f"delayline: {e}", file=sys.stderr, flush=True)
        return 2
    _fine_timers()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"ready {args.a} {args.b}", flush=True)
    counts = serve(Direction(a, b, forth), Direction(b, a, back), sys.stdin.fileno(), args.seed)
    print(f"delayline: stopped; {json.dumps(counts)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
