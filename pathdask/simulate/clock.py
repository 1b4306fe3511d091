"""The virtual clock: a simpy environment, and FIFO processors booked on it.

simpy (a small, well-kept discrete-event library) gives the event queue and
generator processes, which is how clients' call patterns read
(``yield from h.call(...)``). Processors are not simpy resources: a processor
whose requests come in time order is fully described by when it is free next,
so booking one is one ``max`` and one add, and booking the hosts of a 512-host
program is one NumPy expression instead of 512 events. The one shared processor
of the embedded model also takes work booked out of time order
(:class:`Processor`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

__all__ = ["Clock", "Processor", "Hosts"]


class Clock(simpy.Environment):
    """A simpy environment that counts the events it processed (``events``)."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.events = 0

    def step(self) -> None:
        self.events += 1
        super().step()

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at virtual time ``when`` (now, if ``when`` has passed)."""
        ev = self.timeout(max(0.0, when - self.now))
        ev.callbacks.append(lambda _ev: fn(*args))

    def sleep_until(self, when: float) -> simpy.Timeout:
        return self.timeout(max(0.0, when - self.now))


class Processor:
    """One processor: work booked at ``ready`` runs in its earliest free time from then on,
    for ``seconds`` in all.

    Work is not always booked in time order: a device thread's gangs are booked when
    its program starts, ahead of their time. Work ready earlier than such a booking
    runs in the free time before it and around it, as a thread that holds no GIL
    lets the others run. ``now`` (the clock's time) lets it forget what has passed:
    the time up to the end of the last span forgotten counts as busy, so that work
    booked late (ready before now, as a program's devices whose other hosts had it
    later) runs after what held the processor meanwhile, not in the past over it.
    """

    def __init__(self, name: str = "", now: Callable[[], float] | None = None) -> None:
        self.name = name
        self.now = now
        self.busy_s = 0.0
        self._horizon = 0.0  # the end of the last span forgotten
        #: disjoint busy spans in time order (only those not passed yet)
        self._starts: list[float] = []
        self._ends: list[float] = []

    @property
    def free_at(self) -> float:
        """When everything booked so far is done."""
        return self._ends[-1] if self._ends else 0.0

    def book(self, ready: float, seconds: float) -> float:
        """Returns when the work is done."""
        self.busy_s += seconds
        starts, ends = self._starts, self._ends
        if self.now is not None and ends:  # forget the spans that have passed
            passed = bisect.bisect_right(ends, self.now())
            if passed:
                self._horizon = max(self._horizon, ends[passed - 1])
                del starts[:passed], ends[:passed]
        ready = max(ready, self._horizon)
        if not ends or ready >= ends[-1]:  # in time order: after everything booked
            if ends and ready == ends[-1]:
                ends[-1] = ready + seconds
            else:
                starts.append(ready)
                ends.append(ready + seconds)
            return ready + seconds
        # in the gaps from ``ready`` on, around the spans booked ahead
        i = bisect.bisect_right(ends, ready)  # the first span that ends after ``ready``
        t, left = ready, seconds
        if i < len(starts) and starts[i] <= t:  # busy at ``ready``: from the end of that span
            t = ends[i]
            i += 1
        while left > 0:
            run = min(left, (starts[i] if i < len(starts) else math.inf) - t)
            starts.insert(i, t)
            ends.insert(i, t + run)
            i += 1
            left -= run
            t += run
            if left > 0:  # the gap ended where span ``i`` begins
                t = ends[i]
                i += 1
        self._merge()
        return t

    def _merge(self) -> None:
        starts, ends = self._starts, self._ends
        j = 0
        for k in range(1, len(starts)):
            if starts[k] <= ends[j]:
                ends[j] = max(ends[j], ends[k])
            else:
                j += 1
                starts[j], ends[j] = starts[k], ends[k]
        del starts[j + 1:], ends[j + 1:]


class Hosts:
    """The hosts' processors: one each, or all on one shared :class:`Processor`."""

    def __init__(self, n: int, shared: Processor | None = None) -> None:
        self.free_at = np.zeros(n)
        self.shared = shared

    def book(self, hosts: np.ndarray, ready: np.ndarray | float, seconds: np.ndarray) -> np.ndarray:
        """Book ``seconds[i]`` on host ``hosts[i]`` from ``ready``; returns when each is done."""
        ready = np.broadcast_to(np.asarray(ready, dtype=float), hosts.shape)
        if self.shared is not None:  # one processor: in order of readiness
            done = np.empty(len(hosts))
            for i in np.argsort(ready, kind="stable"):
                done[i] = self.shared.book(float(ready[i]), float(seconds[i]))
            return done
        done = np.maximum(ready, self.free_at[hosts]) + seconds
        self.free_at[hosts] = done
        return done
