"""The lifecycle of programs on one host: slotted, dispatched, dropped, ended.

A program is *slotted* here when the scheduler's order message names it (or,
without ordering, when it is registered): from then on each of its local
devices must pop it from its order exactly once, by running it or by skipping
it. It is *dispatched* when its call (or dispatch task) registered its plan. It is
*dropped* when it can no longer run (a failed dispatch, a lost host, a closed
client). It has *ended* here once every local device has popped it; the host
then tells the scheduler, whatever the outcome. That is the invariant that
keeps devices from waiting forever: a head that is dropped is ready, so a
device never waits on a program that can no longer be dispatched.

A dropped head is ready only once the store failed its buffers
(:meth:`Ledger.buffers_failed`, as the host carries out ``DropBuffers``): the
core drops a program in the ledger as it decides, and its instructions, the
store's part among them, are carried out after. A device that passed it
before would run the programs behind it, which may read its outputs, and find
them pending instead of failed.

Threads: device threads, Dask's event loop and socket receivers all call in.
Every field is guarded by ``lock`` and only methods of this class touch them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from ..ops import BufferKey, HostPlan, Ref
from .bounded import remember


class Aborts(Protocol):
    """Where a program's gangs learn that they were aborted (the host's mailbox)."""

    def check(self, pid: str, gang: int) -> BaseException | None: ...


@dataclass
class HostProgram:
    """A program as registered on one host; ``check`` tells whether a gang was aborted."""

    pid: str
    plan: HostPlan
    inputs: tuple[BufferKey, ...]
    client: str
    mailbox: Aborts
    #: sequential dispatch: gangs whose Dask task has released them (None: all are)
    released: set[int] | None = None
    done: set[tuple[int, int]] = field(default_factory=set)  # (device, gang) finished

    def resolve(self, ref: Ref) -> BufferKey:
        if ref.kind == "in":
            src = self.inputs[ref.index]
            return (src[0], int(src[1]))
        return (self.pid, ref.index)

    def check(self, gang: int) -> BaseException | None:
        return self.mailbox.check(self.pid, gang)


class Ledger:
    """Which programs are slotted, dispatched and dropped on one host. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: guarded by ``lock``: dispatched programs
        self._programs: dict[str, HostProgram] = {}
        #: guarded by ``lock``: slotted programs -> (client, local devices that have not popped them)
        self._slotted: dict[str, tuple[str, set[int]]] = {}
        #: guarded by ``lock``: dropped programs -> why, oldest first out past ``REMEMBER``
        self._dropped: OrderedDict[str, BaseException] = OrderedDict()
        #: guarded by ``lock``: dropped programs whose buffers the store failed (devices may pass them)
        self._failed: OrderedDict[str, None] = OrderedDict()
        #: guarded by ``lock``: clients that closed; their late dispatches are refused
        self._closed_clients: OrderedDict[str, BaseException] = OrderedDict()

    # -- arrivals --------------------------------------------------------------
    def slot(self, pid: str, client: str, devices: list[int]) -> bool:
        """The program takes a place in these devices' order; ``False`` if it was dropped already."""
        with self.lock:
            if self._refusal(pid, client) is not None:
                return False
            self._slotted[pid] = (client, set(devices))
            return True

    def refused(self, pid: str, client: str) -> BaseException | None:
        """Why a dispatch of ``pid`` must not register (it was dropped, its client closed)."""
        with self.lock:
            return self._refusal(pid, client)

    def register(self, prog: HostProgram) -> BaseException | None:
        """Record a dispatched program; returns the cause instead if it was dropped already."""
        with self.lock:
            cause = self._refusal(prog.pid, prog.client)
            if cause is None:
                self._programs[prog.pid] = prog
            return cause

    def _refusal(self, pid: str, client: str) -> BaseException | None:
        """Holds ``lock``: why ``pid`` of ``client`` may no longer take a place here, if it may not."""
        return self._dropped.get(pid) or self._closed_clients.get(client)

    # -- reads -------------------------------------------------------------------
    def get(self, pid: str) -> HostProgram | None:
        with self.lock:
            return self._programs.get(pid)

    def ready(self, pid: str) -> bool:
        """A device may pop ``pid``: it is dispatched here, or it will never run and the store
        failed its buffers."""
        with self.lock:
            if pid in self._dropped:
                return pid in self._failed
            return pid in self._programs

    def slotted(self, pid: str) -> bool:
        """Whether ``pid`` has its place in its devices' orders here (and not all popped it)."""
        with self.lock:
            return pid in self._slotted

    def dropped(self, pid: str) -> BaseException | None:
        with self.lock:
            return self._dropped.get(pid)

    def idle(self) -> bool:
        with self.lock:
            return not self._programs and not self._slotted

    def counts(self) -> tuple[int, int]:
        """(dispatched, slotted) programs here."""
        with self.lock:
            return len(self._programs), len(self._slotted)

    def pids(self) -> list[str]:
        """Every program dispatched or slotted here."""
        with self.lock:
            return sorted(set(self._programs) | set(self._slotted))

    def client_of(self, pid: str) -> str | None:
        with self.lock:
            prog = self._programs.get(pid)
            if prog is not None:
                return prog.client
            entry = self._slotted.get(pid)
            return entry[0] if entry is not None else None

    # -- endings -----------------------------------------------------------------
    def device_done(self, pid: str, device: int) -> bool:
        """``device`` popped ``pid``; ``True`` when that ended the program on this host."""
        with self.lock:
            entry = self._slotted.get(pid)
            if entry is None:
                return False
            entry[1].discard(device)
            if entry[1]:
                return False
            del self._slotted[pid]
            self._programs.pop(pid, None)
            return True

    def drop(self, pid: str, cause: BaseException) -> HostProgram | None:
        """Mark ``pid`` dropped. Returns its registration if no device will pop it (not slotted
        here), which the caller must then undo; devices skip a slotted one themselves."""
        with self.lock:
            remember(self._dropped, pid, cause)
            if pid in self._slotted:
                return None
            return self._programs.pop(pid, None)

    def buffers_failed(self, pid: str) -> None:
        """The store failed the dropped ``pid``'s buffers: its devices may pass it now."""
        with self.lock:
            remember(self._failed, pid, None)

    def close_client(self, client: str, cause: BaseException) -> list[str]:
        """Refuse the client's later programs; returns its programs known here (to drop)."""
        with self.lock:
            remember(self._closed_clients, client, cause)
            return sorted({p for p, prog in self._programs.items() if prog.client == client}
                          | {p for p, (c, _) in self._slotted.items() if c == client})

