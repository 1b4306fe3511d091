"""The interpreter, tuned for the control plane: its garbage collector and thread switches.

**The cyclic collector.** Python collects its youngest generation after every 700
net allocations of container objects, and an older one every 10 of those. A
scheduler or host that takes in thousands of calls allocates many short-lived
records per call, while Dask's task state and pathdask's ledgers make the older
generations large: the frequent collections then walk large heaps, at times
landing in the middle of a call's handling. Measured with ``pathdask bench
dispatch --hosts`` (the scheduler plugin's CPU per call,
:mod:`pathdask.scheduler.meter`), 16 hosts in one process, three runs each:
578-1201 us per call with Python's thresholds, 433-534 us with ``(50000, 20,
20)``; at 4 hosts the two are alike. ``pathdask.gc-threshold`` sets them.

**Thread switches.** A thread that waits for the GIL takes it when the holder
blocks, or when it has waited the switch interval (5 ms by default). In a
host, the event loop wakes a device thread, then goes on with the rest of the
batch it read (the keys' handles, Dask's releases): the device waits for all of
it. In an embedded system's process, a client thread woken by a host's answer
waits for the event loop, busy with the scheduler's work. Both are on the path
of every call a client waits for. ``pathdask.switch-interval`` (50 us) bounds
those waits; measured with ``pathdask bench roundtrip`` (one device, worker
processes), in alternating runs: 1.16-1.27 ms with Python's interval in the
client's process, 1.05-1.07 ms with 50 us there too. A process that runs hosts
but no scheduler (a worker process) takes ``pathdask.worker.switch-interval``
instead, Python's own by default: since the hosts hand the GIL over to the
devices they wake (below), a short interval there only cut into the gangs'
runs. In alternating rounds on one system (worker processes, Figure 5's
all-reduce, 512 calls a round, 24 rounds, two runs), hosts at Python's 5 ms
against 50 us: pathdask's OpByOp 1,007 / 1,012 against 997 / 941 calls/s, its
Chained 2,293 / 2,406 against 2,179 / 2,188, the waiting round trip 0.95 /
0.95 against 0.97 / 0.93 ms; and the multi-controller, which runs on the same
hosts, 2,168 / 2,246 against 1,646 / 1,437 calls/s on OpByOp.

**Handing the GIL over.** A waiting thread that is woken does not, in practice,
take the GIL while the thread that woke it keeps running Python: on this
machine a thread woken by a ``Condition.notify`` started 154 us later (median)
when the notifier went on computing for 100 us, at a 50 us switch interval;
28 us when the notifier slept for zero seconds right after the notify. A
host's event loop wakes the devices a call's records made runnable, and then
has more to do for the same records (the keys' handles go in Dask's data: a
trip through Dask's worker state machine, 60 us of CPU there). So it hands the
GIL over first (:func:`hand_over`): the devices run the gang and answer the
client's fetch before the loop goes on. Measured with ``pathdask bench
roundtrip`` (one device, worker processes, two rounds): 1.12 and 1.09 ms
without, 0.90 and 0.95 ms with it.

:func:`tune` applies both where a scheduler plugin or host runtime starts (a
``null`` setting leaves the interpreter's); the last of them to release its
:class:`Tuning` when it closes puts back what it replaced: an embedded system
leaves its caller's process as it found it. Nothing is frozen and no collection
is turned off: cycles are still collected, in fewer, larger collections.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any

import dask.config
from dask.utils import parse_timedelta

__all__ = ["Tuning", "hand_over", "tune"]

_lock = threading.Lock()
_users = 0
#: what :func:`tune` replaced, put back by the last user's release
_saved: dict[str, Any] = {}


class Tuning:
    """One user's hold on the tuned interpreter (see :func:`tune`); :meth:`release` is idempotent."""

    __slots__ = ("_held",)

    def __init__(self, held: bool) -> None:
        self._held = held

    def release(self) -> None:
        """This user is done; the last one puts back what :func:`tune` replaced."""
        global _users
        with _lock:
            if not self._held:
                return
            self._held = False
            _users -= 1
            if _users == 0:
                if "gc" in _saved:
                    gc.set_threshold(*_saved["gc"])
                if "switch" in _saved:
                    sys.setswitchinterval(_saved["switch"])
                _saved.clear()


def _wanted(switch_setting: str) -> tuple[tuple[int, ...] | None, float | None]:
    """``pathdask.gc-threshold`` and the switch interval ``switch_setting`` names, checked
    (``None``: leave it)."""
    gc_wanted = dask.config.get("pathdask.gc-threshold", None)
    threshold = None
    if gc_wanted is not None:
        threshold = tuple(int(v) for v in gc_wanted)
        if len(threshold) != 3 or min(threshold) < 1:
            raise ValueError(f"pathdask.gc-threshold must be three positive integers (gc.set_threshold's), "
                             f"or null to leave the interpreter's; got {gc_wanted!r}")
    switch_wanted = dask.config.get(switch_setting, None)
    switch = None
    if switch_wanted is not None:
        switch = parse_timedelta(switch_wanted, default="s")
        if not switch or switch <= 0:
            raise ValueError(f"{switch_setting} must be a positive duration (such as '50us'), "
                             f"or null to leave the interpreter's; got {switch_wanted!r}")
    return threshold, switch


def tune(switch_setting: str = "pathdask.switch-interval") -> Tuning:
    """Apply ``pathdask.gc-threshold`` and the switch interval ``switch_setting`` names in this
    process for one more user, each unless ``null``: a scheduler plugin (the default
    setting), or a host runtime (``pathdask.worker.switch-interval``). The first user of a
    process sets them, so hosts sharing the scheduler's process run at its interval. The
    user releases them when it closes."""
    global _users
    threshold, switch = _wanted(switch_setting)
    if threshold is None and switch is None:
        return Tuning(held=False)
    with _lock:
        if _users == 0:
            if threshold is not None:
                _saved["gc"] = gc.get_threshold()
                gc.set_threshold(*threshold)
            if switch is not None:
                _saved["switch"] = sys.getswitchinterval()
                sys.setswitchinterval(switch)
        _users += 1
    return Tuning(held=True)


def hand_over() -> None:
    """Let the threads this one has just woken take the GIL now, if they wait for it, before
    this thread goes on (see the module docstring). It returns at once when none waits."""
    time.sleep(0)
