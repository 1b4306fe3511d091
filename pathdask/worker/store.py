"""HBM-modelled buffer stores with ownership, reference counts and back-pressure.

One :class:`BufferStore` per host holds the buffers of all its devices. A
buffer lives while an output key owns it or a registered consumer still has
to read it; when both are gone it is freed and its bytes return to the device.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.utils import format_bytes

from ..core.bounded import remember
from ..errors import DeviceOutOfMemoryError
from ..ops import BufferKey
from .driver import Driver, Waitable
from .futures import fail, resolve

logger = logging.getLogger("pathdask.worker")

StoreKey = tuple[str, int, int]  # (program id, value id, device id)

#: what a watch is told once its buffer settled: ``(value, None)`` or ``(None, error)``
Settled = Callable[[np.ndarray | None, BaseException | None], None]


class BufferFreedError(RuntimeError):
    """A buffer was read after it had been freed (a bug in reference counting)."""


@dataclass
class Buffer:
    key: StoreKey
    program: str
    client: str = ""  # the client that owns it (its program's)
    state: str = "pending"  # pending -> ready | error
    value: np.ndarray | None = None
    error: BaseException | None = None
    nbytes: int = 0  # bytes counted against HBM (0 until allocated)
    refs: int = 0  # registered consumers that have not read it yet
    owners: int = 0  # output keys that hold it
    waiters: list[asyncio.Future[Any]] = field(default_factory=list)


class Watch:
    """One plain thread's interest in a buffer (a client's fetch, ``when_settled``): ``seen``
    once the buffer was declared (so that its absence later means it was freed)."""

    __slots__ = ("key", "device", "then", "seen")

    def __init__(self, key: BufferKey, device: int, then: Settled) -> None:
        self.key, self.device, self.then, self.seen = key, device, then, False


@dataclass
class DeviceMemory:
    capacity: int
    used: int = 0
    peak: int = 0
    #: (bytes, since) while the device waits for frees to allocate
    waiting: tuple[int, float] | None = None


class BufferStore:
    """Buffers of one host's devices.

    Threads: device threads and the event loop use it; ``memory``, ``buffers``
    and the waiter lists are guarded by ``cond``.
    """

    def __init__(self, capacities: dict[int, int], loop: asyncio.AbstractEventLoop,
                 allocation_timeout: float = 60.0, driver: Driver | None = None) -> None:
        self.allocation_timeout = allocation_timeout
        self.memory = {d: DeviceMemory(c) for d, c in capacities.items()}
        self.buffers: dict[StoreKey, Buffer] = {}
        self.cond = Waitable(driver)
        self.loop = loop
        self._empty_waiters: list[asyncio.Future[Any]] = []
        self._declared_waiters: dict[StoreKey, list[asyncio.Future[Any]]] = {}
        #: dropped programs -> why: a buffer of one that a later reader declares is born failed
        self._dropped: OrderedDict[str, BaseException] = OrderedDict()
        #: the watches of :meth:`when_settled` by the buffer they wait for, and those to look at
        #: again once the change that woke them is complete (both guarded by ``cond``)
        self._watches: dict[StoreKey, list[Watch]] = {}
        self._woken: list[Watch] = []

    # -- registration (dispatch time) --------------------------------------
    def declare(self, key: BufferKey, device: int, *, owned: bool = False, consumers: int = 0,
                client: str = "") -> None:
        skey = (key[0], key[1], device)
        with self.cond:
            buf = self.buffers.get(skey)
            if buf is None:
                buf = self.buffers[skey] = Buffer(skey, key[0], client)
                cause = self._dropped.get(key[0])
                if cause is not None:  # its producer was dropped: it will never be computed
                    buf.state, buf.error = "error", cause
                for fut in self._declared_waiters.pop(skey, ()):
                    self.loop.call_soon_threadsafe(resolve, fut)
                self._wake_watches(skey)
            buf.owners += int(owned)
            buf.refs += consumers
        self._settle_watches()

    # -- allocation (device time) ------------------------------------------
    def allocate(self, device: int, nbytes: int, is_aborted: Callable[[], BaseException | None]) -> None:
        """Reserve ``nbytes`` on ``device``, waiting for frees while it does not fit."""
        mem = self.memory[device]
        if nbytes > mem.capacity:
            raise DeviceOutOfMemoryError(
                f"Device {device} cannot hold an allocation of {format_bytes(nbytes)}: its HBM "
                f"capacity is {format_bytes(mem.capacity)} with {format_bytes(mem.used)} in use. "
                "Shard the array over more devices or use a topology with more hbm."
            )
        now = time.monotonic()
        deadline = now + self.allocation_timeout
        with self.cond:
            try:
                while mem.used + nbytes > mem.capacity:
                    mem.waiting = mem.waiting or (nbytes, now)
                    exc = is_aborted()
                    if exc is not None:
                        raise exc
                    if time.monotonic() > deadline:
                        raise DeviceOutOfMemoryError(
                            f"Device {device} waited {self.allocation_timeout:g}s for "
                            f"{format_bytes(nbytes)} of HBM: its capacity is {format_bytes(mem.capacity)} "
                            f"with {format_bytes(mem.used)} in use, and nothing was freed. Delete arrays "
                            "you no longer need, or raise pathdask.allocation-timeout"
                        )
                    self.cond.wait(0.05)  # back-pressure: a free or an abort wakes us
            finally:
                mem.waiting = None
            mem.used += nbytes
            mem.peak = max(mem.peak, mem.used)

    def unallocate(self, device: int, nbytes: int) -> None:
        with self.cond:
            self.memory[device].used -= nbytes
            self._memory_freed()

    # -- values ---------------------------------------------------------------
    def put(self, key: BufferKey, device: int, value: np.ndarray, nbytes: int) -> None:
        """Store a computed value whose ``nbytes`` were allocated already."""
        value.flags.writeable = False  # buffers are immutable, as on a real device
        with self.cond:
            buf = self.buffers.get((key[0], key[1], device))
            if buf is None:  # dropped while it was being computed
                self.memory[device].used -= nbytes
                self._memory_freed()
                return
            buf.value, buf.state, buf.nbytes = value, "ready", nbytes
            self._wake(buf)
            self._maybe_free(buf)
        self._settle_watches()  # a fetch waiting for it is answered from here, at once

    def fail(self, key: BufferKey, device: int, error: BaseException) -> None:
        with self.cond:
            buf = self.buffers.get((key[0], key[1], device))
            if buf is None or buf.state != "pending":
                return
            buf.error, buf.state = error, "error"
            self._wake(buf)
            self._maybe_free(buf)
        self._settle_watches()

    def read(self, key: BufferKey, device: int, *, consume: bool = True) -> np.ndarray:
        """The value of a ready buffer; ``consume`` counts one registered read done."""
        try:
            return self._read(key, device, consume)
        finally:
            self._settle_watches()

    def _read(self, key: BufferKey, device: int, consume: bool) -> np.ndarray:
        with self.cond:
            buf = self.buffers.get((key[0], key[1], device))
            if buf is None:
                raise BufferFreedError(
                    f"Buffer {key} on device {device} is not in the store: it was freed or "
                    "never produced on this device"
                )
            if consume:
                buf.refs -= 1
            try:
                if buf.state == "error":
                    assert buf.error is not None
                    raise buf.error
                if buf.state != "ready":
                    raise BufferFreedError(f"Buffer {key} on device {device} is not computed yet")
                assert buf.value is not None
                return buf.value
            finally:
                self._maybe_free(buf)

    def release(self, key: BufferKey, device: int, consumers: int = 0) -> None:
        """Drop ownership (output key released) and/or ``consumers`` pending reads."""
        with self.cond:
            buf = self.buffers.get((key[0], key[1], device))
            if buf is None:
                return
            if consumers:
                buf.refs -= consumers
            else:
                buf.owners -= 1
            self._maybe_free(buf)
        self._settle_watches()

    def drop_program(self, program: str, error: BaseException) -> None:
        """Fail a dropped program's uncomputed buffers with ``error``, and free what nothing holds.

        Buffers an output key still owns stay (as errors, if they were never
        computed), so that their readers learn why, until the key is released.
        """
        with self.cond:
            remember(self._dropped, program, error)
            for skey in [k for k in self._watches if k[0] == program]:
                self._wake_watches(skey)
            for skey in [k for k in self._declared_waiters if k[0] == program]:
                for fut in self._declared_waiters.pop(skey):
                    self.loop.call_soon_threadsafe(fail, fut, error)
            for buf in [b for b in self.buffers.values() if b.program == program]:
                if buf.state == "pending":
                    buf.error, buf.state = error, "error"
                    self._wake(buf)
                self._maybe_free(buf)
        self._settle_watches()

    # -- watching from a plain thread (a client's fetch on the socket transport) ------
    def when_settled(self, key: BufferKey, device: int, then: Settled) -> Callable[[], None]:
        """Call ``then(value, None)`` once the buffer is computed, or ``then(None, error)`` once it
        failed, was freed, or its program was dropped; it waits for the buffer's program to be
        dispatched here too. ``then`` runs once, on the thread that settled the buffer (a
        device's, as it stores the value), after that thread let go of the store; or at once,
        on this thread, if it has settled. Returns a function that stops the watch."""
        watch = Watch(key, device, then)
        skey = (key[0], key[1], device)
        with self.cond:
            outcome = self._look(watch)
            if outcome is None:
                self._watches.setdefault(skey, []).append(watch)
        if outcome is not None:
            then(*outcome)

        def stop() -> None:
            self._unwait(self._watches, skey, watch)

        return stop

    def fetches_waiting(self) -> int:
        """Clients' fetches waiting for buffers here now (:meth:`when_settled`)."""
        with self.cond:
            return sum(len(w) for w in self._watches.values())

    def _look(self, watch: Watch) -> tuple[np.ndarray | None, BaseException | None] | None:
        """What ``watch`` is told now, or ``None`` while its buffer is not settled (under ``cond``)."""
        key, device = watch.key, watch.device
        buf = self.buffers.get((key[0], key[1], device))
        if buf is None:
            if watch.seen:
                return None, BufferFreedError(f"Buffer {key} on device {device} was freed before it was read")
            cause = self._dropped.get(key[0])
            return None if cause is None else (None, cause)
        if buf.state == "pending":
            watch.seen = True
            return None
        if buf.state == "error":
            return None, buf.error
        if buf.value is None:
            return None, BufferFreedError(f"Buffer {key} on device {device} was freed before it was read")
        return buf.value, None

    def _wake_watches(self, skey: StoreKey) -> None:
        """The watches of ``skey`` look again once the change under way is complete (under ``cond``)."""
        watches = self._watches.pop(skey, None)
        if watches:
            self._woken.extend(watches)

    def _settle_watches(self) -> None:
        """Tell the woken watches whose buffers settled; the others wait on. Each public method
        that changes buffers calls it once its change is complete, outside ``cond``."""
        if not self._woken:  # read without the lock: only a change under ``cond`` adds to it
            return
        told = []
        with self.cond:
            woken, self._woken = self._woken, []
            for watch in woken:
                outcome = self._look(watch)
                if outcome is None:
                    self._watches.setdefault((watch.key[0], watch.key[1], watch.device), []).append(watch)
                else:
                    told.append((watch, outcome))
        for watch, outcome in told:
            try:
                watch.then(*outcome)
            except Exception:  # the thread that settled it (a device's, say) must go on
                logger.exception("pathdask: telling a fetch that its buffer settled failed")

    # -- waiting from the event loop ---------------------------------------
    async def wait_value(self, key: BufferKey, device: int) -> np.ndarray:
        """The buffer's value once computed; waits for its program to be dispatched here too."""
        skey = (key[0], key[1], device)
        with self.cond:
            buf = self.buffers.get(skey)
            if buf is None:
                declared = self.loop.create_future()
                self._declared_waiters.setdefault(skey, []).append(declared)
        if buf is None:
            try:
                await declared
            finally:
                self._unwait(self._declared_waiters, skey, declared)
            with self.cond:
                buf = self.buffers.get(skey)
            if buf is None:
                raise BufferFreedError(f"Buffer {key} on device {device} was freed before it was read")
        with self.cond:
            if buf.state == "pending":
                fut = self.loop.create_future()
                buf.waiters.append(fut)
            else:
                fut = None
        if fut is not None:
            await fut
        return self._outcome(buf, key, device)

    def _outcome(self, buf: Buffer, key: BufferKey, device: int) -> np.ndarray:
        """A settled buffer's value; its error raised if it failed, or if it was freed meanwhile."""
        with self.cond:
            state, value, error = buf.state, buf.value, buf.error
        if state == "error":
            assert error is not None
            raise error
        if value is None:
            raise BufferFreedError(f"Buffer {key} on device {device} was freed before it was read")
        return value

    def state(self, key: BufferKey, device: int) -> str:
        """``pending`` (not computed, or not dispatched here yet), ``ready`` or ``error``."""
        with self.cond:
            buf = self.buffers.get((key[0], key[1], device))
            return "pending" if buf is None else buf.state

    def memory_wait(self, device: int) -> tuple[int, float] | None:
        """(bytes, since) if ``device`` waits for frees to allocate, else ``None``."""
        with self.cond:
            return self.memory[device].waiting

    async def wait_empty(self) -> None:
        with self.cond:
            if not self.buffers:
                return
            fut = self.loop.create_future()
            self._empty_waiters.append(fut)
        await fut

    def _unwait(self, table: dict[StoreKey, list[Any]], skey: StoreKey, waiter: Any) -> None:
        """Take ``waiter`` off ``table[skey]`` unless a wake took it already."""
        with self.cond:
            waiting = table.get(skey, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                table.pop(skey, None)

    # -- internals (hold self.cond) ----------------------------------------
    def _wake(self, buf: Buffer) -> None:
        waiters, buf.waiters = buf.waiters, []
        for fut in waiters:
            self.loop.call_soon_threadsafe(resolve, fut)
        self._wake_watches(buf.key)

    def _maybe_free(self, buf: Buffer) -> None:
        """Free a buffer nothing wants any more: no reader to come and no key that owns it.

        A pending one goes too: it was declared by readers of a program that never
        came here (its client closed first), or its producer will find it gone on
        ``put`` and give the bytes back.
        """
        if buf.refs <= 0 and buf.owners <= 0:
            self._wake(buf)  # a waiting fetch learns that it is gone
            self._free(buf)

    def _free(self, buf: Buffer) -> None:
        if self.buffers.pop(buf.key, None) is None:
            return
        if buf.nbytes:
            self.memory[buf.key[2]].used -= buf.nbytes
        buf.value = None
        self._memory_freed()
        if not self.buffers:
            waiters, self._empty_waiters = self._empty_waiters, []
            for fut in waiters:
                self.loop.call_soon_threadsafe(resolve, fut)

    def _memory_freed(self) -> None:
        """Bytes went back to a device: wake the allocations waiting for frees, if any (a wake
        is a thread hand-off; most frees have nobody to wake)."""
        if any(m.waiting is not None for m in self.memory.values()):
            self.cond.notify_all()

    def stats(self) -> dict[int, dict[str, Any]]:
        """Per device: bytes in use, capacity, peak, buffers, and the stored bytes of each client.

        ``bytes_in_use`` less the sum of ``by_client`` is what running gangs have
        allocated for outputs they have not stored yet.
        """
        with self.cond:
            count: dict[int, int] = {d: 0 for d in self.memory}
            by_client: dict[int, dict[str, int]] = {d: {} for d in self.memory}
            for buf in self.buffers.values():
                d = buf.key[2]
                count[d] += 1
                if buf.nbytes:
                    by_client[d][buf.client] = by_client[d].get(buf.client, 0) + buf.nbytes
            return {
                d: {"bytes_in_use": m.used, "capacity": m.capacity, "peak": m.peak, "buffers": count[d],
                    "by_client": by_client[d]}
                for d, m in self.memory.items()
            }
