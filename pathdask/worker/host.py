"""What a device stream needs from its host: the protocol that keeps ``worker/`` acyclic.

:class:`~pathdask.worker.runtime.HostRuntime` implements it; device streams and
op execution (``device.py``, ``execute.py``) see only this, as a kernel body
sees only :class:`~pathdask.collectives.GangContext`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..core.ledger import HostProgram, Ledger
from ..ops import GangSpec
from ..topology import DeviceInfo
from .store import BufferStore


class Host(Protocol):
    ledger: Ledger
    store: BufferStore

    def exchange(self, pid: str, gang: int, seq: int, me: DeviceInfo,
                 sends: dict[DeviceInfo, np.ndarray], sources: set[int]) -> dict[int, np.ndarray]:
        """Send pieces to devices and return the pieces from ``sources`` (device thread)."""

    def move(self, pid: str, gang: int, seq: int, me: DeviceInfo, sends: dict[DeviceInfo, np.ndarray],
             sources: set[int], *, start: float | None = None,
             scale: float = 1.0) -> tuple[dict[int, np.ndarray], float]:
        """``exchange`` for a move: pieces leave at ``start``, timed as ``scale`` times their
        bytes; returns the pieces from ``sources`` and when they arrived (modelled)."""

    def abort_gang(self, prog: HostProgram, gang: GangSpec, cause: BaseException) -> None:
        """A member of ``gang`` failed: wake every member, here and on other hosts."""

    def close_gang(self, pid: str, gang: GangSpec, device: int, collectives: int) -> None:
        """``device``'s body returned after ``collectives`` collectives; raises on a mismatch."""

    def account(self, device: int, seconds: float) -> None:
        """A gang ended on ``device`` after ``seconds`` of modelled busy time (0: it failed).
        Counted before its values are stored: storing the last one answers a waiting fetch."""

    def gang_done(self, prog: HostProgram, device: int, gang: int) -> None:
        """Sequential dispatch: a gated gang ran on ``device``."""

    def device_done(self, pid: str, device: int) -> None:
        """``device`` popped ``pid`` from its order, having run or skipped it."""
