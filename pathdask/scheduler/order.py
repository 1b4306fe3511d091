"""The island scheduler: one consistent, global order of programs.

Devices are single-threaded and a collective waits for every member of its
gang, so two gangs that share devices must run in the same relative order on
all of them. Every submitted program therefore gets a *slot* in one global
order; each host learns, per device, the programs in slot order and never
runs ahead of it. A policy only decides which waiting program gets the next
slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

POLICIES = ("fifo",)


@dataclass(frozen=True)
class Submission:
    """A program waiting for (or holding) a slot."""

    pid: str
    client: str
    hosts: dict[str, list[int]]  # worker address -> device ids the program uses there


class IslandScheduler:
    """Assigns slots. FIFO is the only policy built so far."""

    def __init__(self, policy: str = "fifo") -> None:
        if policy not in POLICIES:
            raise NotImplementedError(
                f"Scheduling policy {policy!r} is not built yet; the available policies are "
                f"{list(POLICIES)}"
            )
        self.policy = policy
        self.next_slot = 0
        self.slotted = 0

    def submit(self, sub: Submission) -> Iterable[tuple[int, Submission]]:
        """Take a submission; yield the (slot, submission) pairs that are now slotted."""
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        self.slotted += 1
        yield slot, sub

    def info(self) -> dict[str, Any]:
        return {"policy": self.policy, "slotted": self.slotted}
