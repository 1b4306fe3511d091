"""The interpreter's cyclic garbage collector, tuned for the control plane.

Python collects its youngest generation after every 700 net allocations of
container objects, and an older one every 10 of those. A scheduler or host that
takes in thousands of calls allocates many short-lived records per call, while
Dask's task state and pathdask's ledgers make the older generations large: the
frequent collections then walk large heaps, at times landing in the middle of a
call's handling. Measured with ``pathdask bench dispatch --hosts`` (the scheduler
plugin's CPU per call, :mod:`pathdask.scheduler.meter`), 16 hosts in one process,
three runs each: 578-1201 us per call with Python's thresholds, 433-534 us with
``(50000, 20, 20)``; at 4 hosts the two are alike.

:func:`tune` applies ``pathdask.gc-threshold`` (``gc.set_threshold``'s three
numbers; ``null`` leaves the interpreter's) where a scheduler plugin or host
runtime starts; the last of them to release its :class:`Tuning` when it closes
puts back what it replaced: an embedded system leaves its caller's process as it
found it.
Nothing is frozen and no collection is turned off: cycles are still collected,
in fewer, larger collections.
"""

from __future__ import annotations

import gc
import threading

import dask.config

__all__ = ["Tuning", "tune"]

_lock = threading.Lock()
_users = 0
_saved: tuple[int, ...] | None = None


class Tuning:
    """One user's hold on the tuned thresholds (see :func:`tune`); :meth:`release` is idempotent."""

    __slots__ = ("_held",)

    def __init__(self, held: bool) -> None:
        self._held = held

    def release(self) -> None:
        """This user is done; the last one puts back the thresholds that :func:`tune` replaced."""
        global _users, _saved
        with _lock:
            if not self._held:
                return
            self._held = False
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None


def tune() -> Tuning:
    """Apply ``pathdask.gc-threshold`` in this process for one more user (a scheduler plugin or
    host runtime), unless it is ``null``; the user releases it when it closes."""
    global _users, _saved
    wanted = dask.config.get("pathdask.gc-threshold", None)
    if wanted is None:
        return Tuning(held=False)
    threshold = tuple(int(v) for v in wanted)
    if len(threshold) != 3 or min(threshold) < 1:
        raise ValueError(f"pathdask.gc-threshold must be three positive integers (gc.set_threshold's), "
                         f"or null to leave the interpreter's; got {wanted!r}")
    with _lock:
        if _users == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*threshold)
        _users += 1
    return Tuning(held=True)
