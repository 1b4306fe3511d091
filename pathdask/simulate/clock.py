"""The virtual clock: a simpy environment, and FIFO processors booked on it.

simpy (a small, well-kept discrete-event library) gives the event queue and
generator processes, which is how clients' call patterns read
(``yield from h.call(...)``). Processors are not simpy resources: a FIFO
processor whose requests come in time order is fully described by when it is
free next, so booking one is one ``max`` and one add, and booking the hosts of a
512-host program is one NumPy expression instead of 512 events.
"""

from __future__ import annotations

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
    """One FIFO processor: work booked at ``ready`` runs when it is free, for ``seconds``."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.free_at = 0.0
        self.busy_s = 0.0

    def book(self, ready: float, seconds: float) -> float:
        """Returns when the work is done."""
        self.free_at = max(ready, self.free_at) + seconds
        self.busy_s += seconds
        return self.free_at


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
