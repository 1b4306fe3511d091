"""How calibration and validation measure the real embedded system: on one CPU, each run
from a settled heap.

The embedded model (:meth:`~.model.CostModel.embedded`) is one processor: one
process, one GIL. On a machine with several CPUs the real process is not quite
that: the operating system moves its threads between CPUs, and CPUs of a
virtual machine need not run at one speed (two of them can differ by 1.8x,
each shared with other guests in its own way). A run's rate then depends on
where its threads happened to be. :func:`one_cpu` runs the measurements on one
CPU, the fastest of those the process may use, so that the real system is
the system the model describes and its numbers repeat from run to run.

A process that has run many configurations holds more objects (Dask's bounded
logs and caches fill up), and a full garbage collection of them pauses every
thread for a tenth of a second or more, more often the longer it ran. The model
has no such pauses, and a later row would pay for the earlier ones:
:func:`settled` runs each measurement after a full collection, with what lived
before it left out of the collections during it (``gc.freeze``).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["one_cpu", "settled"]

Echo = Callable[[str], Any]
T = TypeVar("T")


def settled(run: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``run(*args, **kwargs)`` after a full collection, with the objects that lived before it frozen."""
    gc.collect()
    gc.freeze()
    try:
        return run(*args, **kwargs)
    finally:
        gc.unfreeze()


def _probe() -> float:
    """Seconds of a fixed piece of interpreter work (dict updates, as the control plane does)."""
    t = time.perf_counter()
    d: dict[int, int] = {}
    for i in range(20000):
        d[i % 1000] = d.get(i % 1000, 0) + i
    return time.perf_counter() - t


def _threads() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _set(tids: list[int], cpus: set[int]) -> None:
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            pass


def fastest(cpus: set[int], tries: int = 5) -> int:
    """The CPU among ``cpus`` on which :func:`_probe` runs fastest (best of ``tries``)."""
    mine = os.sched_getaffinity(0)
    speed = {}
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            speed[cpu] = min(_probe() for _ in range(tries))
    finally:
        os.sched_setaffinity(0, mine)
    return min(speed, key=lambda c: speed[c])


@contextmanager
def one_cpu(cpu: int | None = None, echo: Echo = print) -> Iterator[int | None]:
    """Run every thread of this process, and every thread started meanwhile, on one CPU.

    ``cpu``: which one (default: the fastest, :func:`fastest`); ``-1``: leave the
    threads where they are. Yields the CPU, or ``None`` where the platform cannot
    pin threads (then nothing changes). On exit every thread may use the CPUs the
    process had.
    """
    if cpu == -1 or not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        if cpu != -1:
            echo("  this platform cannot pin threads to a CPU: measuring on all of them")
        yield None
        return
    allowed = os.sched_getaffinity(0)
    if cpu is None:
        cpu = fastest(allowed)
    elif cpu not in allowed:
        raise ValueError(f"CPU {cpu} is not one this process may use ({sorted(allowed)}); "
                         f"pass one of them, or -1 to measure on all")
    echo(f"  measuring on CPU {cpu} of {sorted(allowed)} (one processor, as the embedded model)")
    _set(_threads(), {cpu})
    try:
        yield cpu
    finally:
        _set(_threads(), allowed)
