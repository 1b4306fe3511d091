"""Which CPUs the threads of this process run on (Linux: ``os.sched_setaffinity`` per thread).

The measurements pin threads: the simulation's calibration runs every thread on one
CPU (``simulate/measure.one_cpu``), and ``bench dispatch --hosts`` gives the
scheduler's thread a CPU of its own (``bench/apart.cpu_of_its_own``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

__all__ = ["can_pin", "pin"]


def can_pin() -> bool:
    """Whether this platform lets each thread of this process be pinned to CPUs."""
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def pin(cpus_of: Callable[[int], set[int]]) -> None:
    """Run each thread of this process (by native id) on the CPUs ``cpus_of(tid)`` names; a
    thread inherits its starter's CPUs, so threads started afterwards follow their starters."""
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # it ended meanwhile
            os.sched_setaffinity(tid, cpus_of(tid))
