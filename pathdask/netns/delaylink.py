"""A machine's link through a :mod:`~pathdask.netns.delayline` process: start it, shape it, stop it.

The harness gives a machine such a link where its shape needs a delay or loss
and the kernel has no ``netem``. The process creates two TAPs, ``A`` (made the
machine's ``eth0``) and ``B`` (a port of the bridge); it delays and drops
frames on their way out of the machine (A→B) only, as ``netem`` on the
machine's ``eth0`` would, so a round trip between two such machines takes
``2 * delay`` as on netem. Rates stay with ``tbf`` on both TAPs (the kernel
paces more finely than Python), as on a veth pair.

The process reads its commands from a pipe of this one: if this process dies
without stopping it, the pipe's end stops it too, and its TAPs vanish.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from .links import LinkError, Shape

__all__ = ["DelayLink", "tun_unavailable"]

PRIORITY = -10  # the line is the network: it should not wait behind the machines' processes


def tun_unavailable() -> str | None:
    """Why a delay line cannot run here (no ``/dev/net/tun``), or ``None`` if it can."""
    # imported here, not above: ``python -m pathdask.netns.delayline`` imports this package first
    from . import delayline

    tun = Path(delayline.TUN_PATH)
    if not tun.exists():
        return (f"{tun} is missing, so no user-space delay line either: load the tun module "
                "(modprobe tun) or, in a container, pass the device (--device /dev/net/tun)")
    if not os.access(tun, os.R_OK | os.W_OK):
        return f"{tun} cannot be opened for reading and writing: run as root"
    return None


class DelayLink:
    """The delay-line process between TAPs ``a`` and ``b``; :meth:`stop` (by handle) removes both.

    Parameters
    ----------
    a, b : str
        Names of the TAPs to create (at most 15 bytes, not in use).
    shape : Shape
        The delay and loss of frames from ``a`` to ``b`` (its rate is not the line's: see the module).
    timeout : float
        Seconds to wait for the process to answer.
    """

    def __init__(self, a: str, b: str, shape: Shape, *, timeout: float = 10.0) -> None:
        from . import delayline

        self.a, self.b, self.timeout = a, b, timeout
        argv = [sys.executable, "-I", delayline.__file__, "--a", a, "--b", b, "--delay", repr(shape.delay),
                "--loss", repr(shape.loss), "--back-delay", "0", "--back-loss", "0"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        try:
            answer = self._line("to start")
            if answer != f"ready {a} {b}":
                raise LinkError(f"the delay line {a}/{b} answered {answer!r} instead of 'ready'")
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, PRIORITY)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self, what: str) -> str:
        """The process's next line on stdout, within the timeout; a :class:`LinkError` if it died."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        out, line = self.proc.stdout.fileno(), b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise LinkError(f"the delay line {self.a}/{self.b} did not answer {what} in {self.timeout:g}s")
            chunk = os.read(out, 1)
            if not chunk:
                raise LinkError(f"the delay line {self.a}/{self.b} exited ({self.proc.wait()}) {what}: "
                                f"{self._stderr()}")
            line += chunk
        return line.decode().strip()

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace").strip() or "(nothing on stderr)"

    def set(self, shape: Shape) -> None:
        """Delay and drop frames from ``a`` to ``b`` as ``shape`` says, from now on."""
        self.configure(f"delay={shape.delay!r} loss={shape.loss!r}")

    def configure(self, words: str) -> str:
        """Set the line's parameters from ``key=value`` words (``delay``, ``loss``, ``rate``, ``limit``
        and their ``back_`` forms for ``b`` to ``a``; see :mod:`~pathdask.netns.delayline`); its answer."""
        return self._ask(words, "ok ")

    def stats(self) -> str:
        """The line's counters, a JSON line: frames and bytes forwarded and dropped, per direction."""
        return self._ask("stats", "{")

    def _ask(self, line: str, expect: str) -> str:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise LinkError(f"the delay line {self.a}/{self.b} has exited: {self._stderr()}") from None
        answer = self._line(f"to {line!r}")
        if not answer.startswith(expect):
            raise LinkError(f"the delay line {self.a}/{self.b} refused {line!r}: {answer}")
        return answer

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 5 s); its TAPs go with it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
