"""The machines' links: what the kernel offers (``tc``), and how one link is shaped or cut.

Each machine of :class:`~pathdask.netns.harness.NetnsSystem` is a network
namespace joined to a bridge (the switch) by a veth pair: ``eth0`` inside the
namespace, its peer on the switch. A link is shaped on both ends' egress:

- ``rate``: ``tbf`` on both ends, so the link carries at most that many bits
  per second in each direction;
- ``delay`` and ``loss``: ``netem`` on the machine's ``eth0`` (one-way latency
  ``delay`` from the machine to any other; a round trip between two shaped
  machines takes ``2 * delay``), where the kernel has ``sch_netem``. Without
  it, the network (``network.py``) builds such a machine's link on a
  user-space delay line instead of a veth pair (``delaylink.py``), with the
  same meaning; here, a veth link that needs a delay raises :class:`LinkError`;
- a partition drops every packet in both directions, with no FIN or RST: a
  ``tbf`` whose bucket is smaller than any packet (or ``netem loss 100%``).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["LinkError", "Shape", "cut", "kernel_has_netem", "require", "run", "shape", "unavailable"]


class LinkError(RuntimeError):
    """A link cannot be set up as asked on this machine (a missing qdisc, a failed ``ip``/``tc``)."""


@dataclass(frozen=True)
class Shape:
    """How one machine's link behaves: one-way ``delay`` (seconds), ``rate`` (bit/s), ``loss`` (0-1)."""

    delay: float = 0.0
    rate: float | None = None
    loss: float = 0.0

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay or self.loss)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip``/``tc``; a failure raises :class:`LinkError` with the command and its error."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode:
        raise LinkError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or ``None`` if they can."""
    if not os.uname().sysname == "Linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or in a container with CAP_NET_ADMIN)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found: install iproute2 (apt-get install iproute2)"
    probe = f"pathdask-probe-{secrets.token_hex(3)}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


@functools.cache
def kernel_has_netem() -> bool:
    """Whether ``tc qdisc ... netem`` works here (``sch_netem`` built in or loadable)."""
    probe = f"pdn{secrets.token_hex(3)}"
    if run("ip", "link", "add", probe, "type", "dummy", check=False).returncode:
        return False
    try:
        return run("tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms",
                   check=False).returncode == 0
    finally:
        run("ip", "link", "del", probe, check=False)


def require(shape: Shape, hint: str = "") -> None:
    """Raise :class:`LinkError` if this kernel cannot give a veth link ``shape`` (``hint`` ends it)."""
    if shape.needs_netem and not kernel_has_netem():
        raise LinkError(
            f"a veth link with delay {shape.delay * 1e3:g} ms and loss {shape.loss:.0%} needs tc netem, "
            "which this kernel lacks (no sch_netem: `tc qdisc add ... netem` says 'Specified qdisc kind "
            "is unknown'); on a veth only rates (tbf) and partitions can be set." + hint)


def _rate(bits: float) -> str:
    return f"{int(bits)}bit"


def _burst(bits: float) -> int:
    """A bucket of about 1 ms of traffic, at least a few full-size packets."""
    return max(32 * 1024, int(bits / 8 / 1000))


def shape(dev: str, shape: Shape, *, netns: str | None = None, netem: bool = True) -> None:
    """Set ``dev``'s egress to ``shape`` (replacing what was there). ``netem=False``: the end of
    the link where no delay is added (the switch's side), rate only."""
    ns = ["ip", "netns", "exec", netns] if netns else []
    run(*ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    if netem and shape.needs_netem:
        require(shape)
        args = ["netem", "delay", f"{shape.delay * 1e6:.0f}us"]
        if shape.loss:
            args += ["loss", f"{shape.loss * 100:g}%"]
        if shape.rate:
            args += ["rate", _rate(shape.rate)]
        run(*ns, "tc", "qdisc", "add", "dev", dev, "root", *args)
    elif shape.rate:
        run(*ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", _rate(shape.rate),
            "burst", str(_burst(shape.rate)), "latency", "100ms")


def cut(dev: str, *, netns: str | None = None) -> None:
    """Drop every packet leaving ``dev``: a bucket of one byte passes no packet, and says nothing."""
    ns = ["ip", "netns", "exec", netns] if netns else []
    run(*ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    run(*ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "8kbit", "burst", "1", "limit", "1")
