"""``Diagnosis``: why a system is waiting, device by device (``system.diagnose()``, ``pathdask doctor``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Diagnosis", "describe"]


def describe(state: dict[str, Any]) -> str:
    """One line for a device's state, as ``pathdask doctor`` prints it."""
    head = f"device {state['device']} (island {state['island']} host {state['host']})"
    if state["state"] == "idle":
        return f"{head}: idle"
    what = {
        "run": "running",
        "dispatch": "waiting for this host's dispatch of",
        "release": "waiting for its sequential-dispatch task in",
        "pieces": f"waiting for pieces from devices {state.get('from_devices')} in collective "
                  f"#{state.get('collective')} of",
        "memory": f"waiting for {state.get('bytes')} bytes of HBM to be freed in",
    }[state["state"]]
    gang = f"gang {state['gang']!r} of " if state.get("gang") else ""
    name = f" ({state['program_name']})" if state.get("program_name") else ""
    return (f"{head}: {what} {gang}program {state['program']}{name} of client {state.get('client')} "
            f"for {state['for_s']:.1f}s; {state['queued']} program(s) queued behind")


@dataclass(frozen=True)
class Diagnosis:
    """Per device: its state (running, or what it waits for), its program and gang, its queue;
    per client: programs waiting for a slot, and programs slotted and unfinished."""

    devices: dict[int, dict[str, Any]]
    clients: dict[str, dict[str, Any]]
    unreachable: tuple[str, ...] = ()
    #: hosts whose heartbeats stopped (address -> silent_s, island, host, timeout_s): their
    #: programs wait until ``pathdask.host-timeout`` declares them lost
    silent: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Diagnosis:
        devices: dict[int, dict[str, Any]] = {}
        for host in reply["hosts"].values():
            devices.update({int(d): s for d, s in host["devices"].items()})
        return cls(dict(sorted(devices.items())), reply["clients"], tuple(reply.get("unreachable", ())),
                   dict(reply.get("silent", {})))

    def waiting(self, program: str | None = None) -> list[dict[str, Any]]:
        """The devices that wait (not idle, not running), on ``program`` if given."""
        return [s for s in self.devices.values() if s["state"] not in ("idle", "run")
                and (program is None or s.get("program") == program)]

    def __str__(self) -> str:
        lines = ["devices:"] + [f"  {describe(s)}" for s in self.devices.values()]
        lines.append("clients:")
        for cid, c in self.clients.items():
            lines.append(f"  {c['name']} ({cid}): weight {c['weight']:g}, {c['waiting']} program(s) waiting "
                         f"for a slot, {c['slotted']} slotted and unfinished")
        if self.unreachable:
            lines.append(f"hosts that did not answer: {list(self.unreachable)}")
        for addr, s in self.silent.items():
            lines.append(f"silent host {addr} (island {s['island']} host {s['host']}): no heartbeat for "
                         f"{s['silent_s']:.1f}s; declared lost at {s['timeout_s']:g}s (pathdask.host-timeout)")
        return "\n".join(lines)
