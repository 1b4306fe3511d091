"""Device-to-device exchange: mailboxes, and waiting for modelled arrival times.

Every collective and every resharding is one *exchange*: a device sends
pieces to some devices and receives pieces from others, under a key that all
members of the gang compute the same way ``(program, gang, seq)``. Pieces for
devices of the same host are handed over in memory; pieces for other hosts
travel as one-way messages over a Dask comm between the two workers. The
receiver then holds the data until the modelled arrival time of each piece,
which the link model gives (``links.py``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.bounded import remember
from ..errors import GangAbortedError
from .driver import Driver, Waitable, sleep_until

SlotKey = tuple[str, int, int, int]  # (program, gang, seq, destination device)
Piece = tuple[np.ndarray, float]  # a piece and its modelled arrival (``links.py``)


class Aborted(GangAbortedError):
    """Raised inside a device thread whose gang was aborted; carries the cause."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"gang aborted: {cause!r}")
        self.cause = cause


@dataclass(frozen=True)
class Mismatch:
    """A device finished its gang's body having called ``collectives`` collectives, and
    device ``src`` sent it a piece of a later one: the gang can never complete."""

    key: SlotKey
    src: int
    collectives: int
    name: str
    hosts: tuple[str, ...]

    def error(self) -> GangAbortedError:
        pid, _, seq, dst = self.key
        return GangAbortedError(
            f"Devices of gang {self.name!r} (program {pid}) called different collectives: device "
            f"{dst} returned from the body after {self.collectives} collective(s), while device "
            f"{self.src} called collective #{seq + 1}. Every device of a gang must call the same "
            "collectives in the same order; do not put a collective under a condition on "
            "axis_index or on data"
        )


class Mailbox:
    """Pieces that arrived for local devices, by exchange key.

    Threads: every field is guarded by ``cond`` (device threads, socket receivers
    and the event loop all deliver, wait and abort).
    """

    def __init__(self, timeout: float = 120.0, driver: Driver | None = None) -> None:
        self.timeout = timeout
        self.cond = Waitable(driver)
        #: per exchange key, per source device: (the piece, its modelled arrival; see links.py)
        self.slots: dict[SlotKey, dict[int, Piece]] = {}
        self.aborted: dict[tuple[str, int], BaseException] = {}
        self.dropped: OrderedDict[str, BaseException] = OrderedDict()
        # Programs finished on this host; late pieces for them are discarded.
        self.finished: OrderedDict[str, None] = OrderedDict()
        #: device -> (exchange key, sources, since) while it waits in ``collect``
        self.waits: dict[int, tuple[SlotKey, set[int], float]] = {}
        #: (program, gang, device) -> (collectives the device's body called, gang name, member
        #: hosts) once its body returned; a piece for a later collective is a mismatch
        self.closed: OrderedDict[tuple[str, int, int], tuple[int, str, tuple[str, ...]]] = OrderedDict()

    def deliver(self, pieces: list[tuple[SlotKey, int, np.ndarray, float]]) -> list[Mismatch]:
        """Hand pieces ``(key, source, value, modelled arrival)`` to their devices, waking them
        once; a :class:`Mismatch` for each piece whose device will never collect it."""
        mismatches = []
        with self.cond:
            for key, src, value, arrival in pieces:
                closed = self.closed.get((key[0], key[1], key[3]))
                if closed is not None and key[2] >= closed[0]:
                    mismatches.append(Mismatch(key, src, *closed))
                elif key[0] not in self.finished:  # else its gang was aborted here: nothing waits
                    self.slots.setdefault(key, {})[src] = (value, arrival)
            self.cond.notify_all()
        return mismatches

    def close_gang(self, program: str, gang: int, device: int, collectives: int, name: str,
                   hosts: tuple[str, ...]) -> Mismatch | None:
        """``device``'s body returned after ``collectives`` collectives; a piece that already
        came for a later one (a peer called a collective this device never will) is a mismatch."""
        with self.cond:
            remember(self.closed, (program, gang, device), (collectives, name, hosts))
            for key, got in self.slots.items():
                if key[:2] == (program, gang) and key[3] == device and key[2] >= collectives:
                    return Mismatch(key, min(got), collectives, name, hosts)
            return None

    def check(self, program: str, gang: int) -> BaseException | None:
        """The cause if this gang or its program was aborted, else ``None``."""
        with self.cond:  # an RLock: ``collect`` calls this holding it
            return self.dropped.get(program) or self.aborted.get((program, gang))

    def collect(self, key: SlotKey, sources: set[int]) -> dict[int, Piece]:
        """Wait until a piece from every source arrived (or the gang is aborted)."""
        now = time.monotonic()
        deadline = now + self.timeout
        with self.cond:
            got = self.slots.get(key, {})
            if sources.issubset(got) and self.check(key[0], key[1]) is None:
                return self.slots.pop(key, got)  # everything is here: the common, fast path
            self.waits[key[3]] = (key, sources, now)
            try:
                return self._collect(key, sources, deadline)
            finally:
                self.waits.pop(key[3], None)

    def _collect(self, key: SlotKey, sources: set[int], deadline: float) -> dict[int, Piece]:
        """``collect``'s wait; holds ``cond``."""
        while True:
            cause = self.check(key[0], key[1])
            if cause is not None:
                self.slots.pop(key, None)
                raise Aborted(cause)
            got = self.slots.get(key, {})
            if sources.issubset(got):
                return self.slots.pop(key, got)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(sources - set(got))
                raise GangAbortedError(
                    f"Device {key[3]} waited {self.timeout:g}s in collective #{key[2]} of gang "
                    f"{key[1]} for devices {missing}, which never reached it. Every device of "
                    "a gang must call the same collectives in the same order; raise "
                    "pathdask.collective-timeout if a peer is just slow"
                )
            self.cond.wait(remaining)

    def abort_gang(self, program: str, gang: int, cause: BaseException) -> None:
        with self.cond:
            if program not in self.finished:
                self.aborted.setdefault((program, gang), cause)
            self.cond.notify_all()

    def drop_program(self, program: str, cause: BaseException) -> None:
        with self.cond:
            remember(self.dropped, program, cause)
            self.cond.notify_all()

    def finish_program(self, program: str) -> None:
        with self.cond:
            self.finished[program] = None
            while len(self.finished) > 10_000:
                self.finished.popitem(last=False)
            for slot in [k for k in self.slots if k[0] == program]:
                del self.slots[slot]
            for gang in [k for k in self.aborted if k[0] == program]:
                del self.aborted[gang]
            self.dropped.pop(program, None)

    def pending(self) -> int:
        with self.cond:
            return len(self.slots)

    def waiting(self, device: int) -> dict[str, Any] | None:
        """What ``device`` waits for in a collective: the program, gang and missing devices."""
        with self.cond:
            entry = self.waits.get(device)
            if entry is None:
                return None
            key, sources, since = entry
            missing = sorted(sources - set(self.slots.get(key, {})))
            return {"program": key[0], "gang": key[1], "collective": key[2], "from_devices": missing,
                    "since": since}


def wait_until(deadline: float, is_aborted: Callable[[], BaseException | None] | None = None) -> None:
    """Hold the calling device thread until ``deadline`` (``time.perf_counter`` clock)."""
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        if is_aborted is not None:
            cause = is_aborted()
            if cause is not None:
                raise Aborted(cause)
        sleep_until(min(deadline, time.perf_counter() + 0.1))
