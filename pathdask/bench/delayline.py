"""``pathdask bench delayline``: what a link's delay really adds, between two namespaces.

Two machines of a :class:`~pathdask.netns.network.Network`, each with a one-way
``delay`` on its link, so that a round trip between them should take
``2 * delay`` more than on an undelayed pair. For each delay: the median (and
10th/90th percentile) of one-byte TCP round trips, one TCP transfer's
throughput, and what the round trip adds over ``2 * delay`` when compared with
the plain veth pair. Links with a delay are built on the user-space delay line
where the kernel has no ``netem`` (``delay_line=True`` forces it, so its cost
at delay 0 shows too).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from ..netns import echo, links
from ..netns.links import LinkError, Shape
from ..netns.network import Machine, Network
from .report import table, write_json

__all__ = ["echo_server", "in_namespace", "measure_pair", "run"]

PORT = 7007
DELAYS = (0.0, 1e-4, 1e-3, 5e-2)


@contextlib.contextmanager
def echo_server(machine: Machine, port: int = PORT) -> Iterator[None]:
    """:mod:`~pathdask.netns.echo` serving on ``machine``'s address while the block runs."""
    proc = subprocess.Popen(["ip", "netns", "exec", machine.namespace, sys.executable, "-I", echo.__file__,
                             "serve", machine.ip, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            proc.kill()
            raise LinkError(f"the echo server in {machine.namespace} did not start: "
                            f"{proc.communicate(timeout=10)[1].decode(errors='replace')}")
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=10)


def in_namespace(machine: Machine, command: str, target: Machine, count: int, port: int = PORT,
                 timeout: float = 120) -> Any:
    """Run ``echo.py COMMAND target.ip PORT COUNT`` inside ``machine``'s namespace; its JSON answer."""
    argv = ["ip", "netns", "exec", machine.namespace, sys.executable, "-I", echo.__file__, command,
            target.ip, str(port), str(count)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode:
        raise LinkError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def measure_pair(delay: float, *, delay_line: bool | None = None, round_trips: int = 200,
                 nbytes: int = 64 * 2**20) -> dict[str, Any]:
    """Round trips and throughput between two machines each delayed ``delay`` one way."""
    with Network(delay_line=delay_line) as net:
        a = net.add("a", 10, Shape(delay=delay))
        b = net.add("b", 11, Shape(delay=delay))
        with echo_server(b):
            times = sorted(in_namespace(a, "rtt", b, round_trips))
            rate = in_namespace(a, "send", b, nbytes) if nbytes else None
        link = "delay line" if a.line else "veth" + (" + netem" if delay else "")
    deciles = statistics.quantiles(times, n=10)
    return {"delay_ms": delay * 1e3, "link": link, "rtt_ms": statistics.median(times) * 1e3,
            "rtt_p10_ms": deciles[0] * 1e3, "rtt_p90_ms": deciles[-1] * 1e3,
            "throughput_mbit_s": rate * 8 / 1e6 if rate else None}


def run(out: str = "bench-results", echo_: Any = print, delays: tuple[float, ...] = DELAYS,
        round_trips: int = 200, nbytes: int = 64 * 2**20) -> dict[str, Any]:
    """The plain veth pair, then each delay (on the delay line at 0 too); print, write ``delayline.json``."""
    rows = [measure_pair(0.0, delay_line=False, round_trips=round_trips, nbytes=nbytes)]
    for delay in delays:
        rows.append(measure_pair(delay, delay_line=True if delay == 0 else None,
                                 round_trips=round_trips if delay <= 1e-3 else min(round_trips, 50),
                                 nbytes=nbytes if delay <= 1e-3 else 0))
    base = rows[0]["rtt_ms"]
    for r in rows:
        r["added_ms"] = r["rtt_ms"] - base
        r["beyond_2x_delay_ms"] = r["added_ms"] - 2 * r["delay_ms"]
    echo_(f"pathdask bench delayline: one-byte TCP round trips ({round_trips}; 50 at most past 1 ms) and "
          f"one {nbytes >> 20} MiB transfer (up to 1 ms) between two namespaces, each link delayed as given "
          "(so 2x per round trip); "
          f"kernel netem: {links.kernel_has_netem()}")
    echo_(table(["link", "one-way delay (ms)", "median RTT (ms)", "p10-p90 (ms)", "added (ms)",
                 "beyond 2x delay (ms)", "Mbit/s"],
                [[r["link"], r["delay_ms"], r["rtt_ms"], f"{r['rtt_p10_ms']:.3f}-{r['rtt_p90_ms']:.3f}",
                  r["added_ms"], r["beyond_2x_delay_ms"], r["throughput_mbit_s"]] for r in rows]))
    result = {"netem": links.kernel_has_netem(), "rows": rows}
    write_json(f"{out}/delayline.json", result)
    echo_(f"wrote {out}/delayline.json")
    return result
