"""``Network``: a bridge (the switch) and machines on it, each a network namespace with its ``eth0``.

A machine's link is a veth pair, shaped with ``tc`` (``tbf`` for a rate,
``netem`` for a delay or loss), or, where its shape needs a delay or loss and
the kernel has no ``netem``, a user-space delay line
(:class:`~pathdask.netns.delaylink.DelayLink`: two TAPs and a process between
them) with ``tbf`` on the TAPs for a rate. Either way ``eth0`` is in the
machine's namespace and the switch-side end (its *port*) is on the bridge, the
machine's one-way delay applies to what it sends, and a round trip between two
delayed machines takes the sum of their delays.

Every name carries a random suffix. :meth:`Network.close` stops the delay lines
and deletes the namespaces, links and bridge it made, each step on its own.

Examples
--------
>>> with Network() as net:  # doctest: +SKIP
...     a = net.add("a", 10, Shape(delay=1e-3))
...     b = net.add("b", 11)
...     # ip netns exec {a.namespace} ... reaches b.ip
"""

from __future__ import annotations

import contextlib
import random
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from . import links
from .delaylink import DelayLink, tun_unavailable
from .links import LinkError, Shape

__all__ = ["DELAY_LINE_MTU", "Machine", "Network", "delay_unavailable"]

DELAY_LINE_MTU = 9000  # jumbo frames: a sixth of the frames a 1500-byte MTU needs, for the line to copy


def _free_subnet() -> int:
    """A /24 of 198.18.0.0/15 (its third byte) that no interface here uses yet."""
    used = links.run("ip", "-4", "-o", "addr", "show").stdout
    for _ in range(64):
        third = random.randrange(0, 256)
        if f"198.18.{third}." not in used:
            return third
    raise LinkError("no free /24 left in 198.18.0.0/24-198.18.255.0/24 for a namespace bridge")


def delay_unavailable() -> str | None:
    """Why no link here can be given a delay or loss (neither netem nor ``/dev/net/tun``), or ``None``."""
    if links.kernel_has_netem():
        return None
    reason = tun_unavailable()
    return f"this kernel has no tc netem, and {reason}" if reason else None


@dataclass
class Machine:
    """One namespace on the switch: its ``eth0`` has ``ip``; ``port`` is its link's switch-side end."""

    name: str
    namespace: str
    port: str
    ip: str
    line: DelayLink | None = None  # the user-space delay line, where the link is one


class Network:
    """A bridge with an address (``.1``) of a free /24 of 198.18.0.0/15, and machines (see the module).

    Parameters
    ----------
    suffix : str, optional
        Part of every name (default: random).
    delay_line : bool, optional
        Build every machine's link on a user-space delay line, even where the kernel has ``netem``
        or the machine has no delay (``True``); never (``False``: a delayed machine then raises
        :class:`LinkError` without netem); or only a delayed or lossy machine's, where ``netem`` is
        missing (``None``, the default).
    """

    def __init__(self, suffix: str | None = None, *, delay_line: bool | None = None) -> None:
        reason = links.unavailable()
        if reason:
            raise LinkError(reason)
        self.suffix = suffix or secrets.token_hex(3)
        self.delay_line = delay_line
        self.bridge = f"pdbr{self.suffix}"
        self.machines: dict[str, Machine] = {}
        self.shapes: dict[str, Shape] = {}
        self.namespaces: list[str] = []
        self.devices: list[str] = []
        self.subnet = _free_subnet()
        try:
            links.run("ip", "link", "add", self.bridge, "type", "bridge")
            self.devices.append(self.bridge)
            links.run("ip", "addr", "add", f"{self.ip(1)}/24", "dev", self.bridge)
            links.run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def ip(self, n: int) -> str:
        return f"198.18.{self.subnet}.{n}"

    def wants_line(self, shape: Shape) -> bool:
        """Whether a machine of ``shape`` gets a delay line rather than a veth pair."""
        if self.delay_line is not None:
            return self.delay_line
        return shape.needs_netem and not links.kernel_has_netem()

    def add(self, name: str, n: int, shape: Shape | None = None) -> Machine:
        """Machine ``name`` with address ``.n``, its link shaped ``shape``."""
        shape = shape or Shape()
        ns, port = f"pathdask-{self.suffix}-{name}", f"pd{self.suffix}{n}"
        links.run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        machine = Machine(name, ns, port, self.ip(n))
        self.machines[name] = machine
        if self.wants_line(shape):
            reason = tun_unavailable()
            if reason:
                why = "" if links.kernel_has_netem() else "; this kernel has no tc netem"
                raise LinkError(f"machine {name!r} needs a delay line (delay {shape.delay * 1e3:g} ms, loss "
                                f"{shape.loss:.0%}){why}, and {reason}")
            machine.line = DelayLink(f"{port}x", port, shape)
            for dev in (port, f"{port}x"):
                links.run("ip", "link", "set", dev, "mtu", str(DELAY_LINE_MTU))
        else:
            links.run("ip", "link", "add", port, "type", "veth", "peer", "name", f"{port}x")
            self.devices.append(port)
        links.run("ip", "link", "set", f"{port}x", "netns", ns)
        links.run("ip", "-n", ns, "link", "set", f"{port}x", "name", "eth0")
        links.run("ip", "-n", ns, "addr", "add", f"{machine.ip}/24", "dev", "eth0")
        links.run("ip", "-n", ns, "link", "set", "eth0", "up")
        links.run("ip", "-n", ns, "link", "set", "lo", "up")
        links.run("ip", "link", "set", port, "master", self.bridge)
        links.run("ip", "link", "set", port, "up")
        self.set_shape(name, shape)
        return machine

    def machine(self, name: str) -> Machine:
        if name not in self.machines:
            raise KeyError(f"no machine {name!r}; the machines are {sorted(self.machines)}")
        return self.machines[name]

    def set_shape(self, name: str, shape: Shape) -> None:
        """Shape machine ``name``'s link: its rate both ways, its delay and loss on what it sends."""
        m = self.machine(name)
        if m.line is None:
            if shape.needs_netem:
                links.require(shape, hint=f" Give machine {name!r} a delay when it is made (a NetnsSystem's "
                              "shape or shapes) to have it built on a user-space delay line.")
            links.shape("eth0", shape, netns=m.namespace)
        else:
            links.shape("eth0", Shape(rate=shape.rate), netns=m.namespace)
            m.line.set(shape)
        links.shape(m.port, shape, netem=False)
        self.shapes[name] = shape

    def partition(self, name: str) -> None:
        """Machine ``name``'s link drops every packet, both ways, silently (no FIN, no RST)."""
        m = self.machine(name)
        links.cut("eth0", netns=m.namespace)
        links.cut(m.port)

    def heal(self, name: str) -> None:
        """Machine ``name``'s link carries packets again, shaped as before."""
        self.set_shape(name, self.shapes[name])

    def link_bytes(self, name: str) -> dict[str, int]:
        """Bytes the kernel counted on machine ``name``'s link: ``recv`` (into it) and ``sent``."""
        stats = Path("/sys/class/net") / self.machine(name).port / "statistics"
        # the switch-side end sends what the machine receives
        return {"recv": int((stats / "tx_bytes").read_text()), "sent": int((stats / "rx_bytes").read_text())}

    def close(self) -> None:
        """Stop the delay lines, delete the namespaces, links and bridge; one failure does not stop the rest."""
        for m in self.machines.values():
            if m.line is not None:
                with contextlib.suppress(Exception):
                    m.line.stop()  # its TAPs go with it
        for ns in self.namespaces:  # takes each namespace's eth0, and so its veth pair, with it
            links.run("ip", "netns", "del", ns, check=False)
        for dev in self.devices:
            if Path("/sys/class/net", dev).exists():
                links.run("ip", "link", "del", dev, check=False)
        self.namespaces.clear()
        self.devices.clear()
        self.machines.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
