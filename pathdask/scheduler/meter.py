"""``CallMeter``: what the scheduler plugin's own work on calls costs, in CPU seconds, by part.

``pathdask bench dispatch --hosts`` reads it (``client.device_stats()["scheduler"]``)
to show how that work grows with the number of hosts a call uses, and where it goes.

It counts calls always, and times parts only where ``pathdask.scheduler.meter`` is
on (the benchmarks and calibrations that read it set it): reading a thread's CPU
clock is a system call, several per call, on the path of every call.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["METERED", "CallMeter", "PARTS"]

#: the settings under which the meter's figures are per call: the meter on, and each call its
#: own program (no opportunistic batching, ``client/batching.py``)
METERED = {"pathdask.scheduler.meter": True, "pathdask.batch.enabled": False}

#: the parts of the plugin's work on a call, in the order a call meets them
PARTS = {
    "check": "its hosts are live and its output keys new",
    "keys": "its output keys made in memory on their hosts (Dask's task state), one per output",
    "slot": "the scheduler core takes it: parts to forward (a tree's: one Fan, its order in it), slotted",
    "order": "the Order records to its hosts, onto the streams (a tree's goes in its Fan)",
    "forward": "the Dispatch records (each host's part; a tree's: its one Fan) onto the streams",
    "ended": "each host's ProgramDone (a tree's: its first host's, for all)",
    "forgotten": "each output key forgotten: its hosts told to free the buffers (a tree's: one Fan)",
}


class CallMeter:
    """The plugin's own CPU time on calls, by part (:data:`PARTS`), in thread CPU seconds of
    the scheduler's event loop (``time.thread_time``: hosts' threads in the same process do
    not count). Dask's own reading and writing of the messages is not in it."""

    __slots__ = ("calls", "parts", "on")

    def __init__(self, on: bool = True) -> None:
        self.calls = 0
        self.parts = dict.fromkeys(PARTS, 0.0)
        #: whether parts are timed (calls are counted either way)
        self.on = on

    def now(self) -> float:
        """The start of a part: this thread's CPU clock, or 0 when parts are not timed."""
        return time.thread_time() if self.on else 0.0

    def lap(self, part: str, start: float) -> float:
        """Add the CPU time since ``start`` to ``part``; returns now, the next part's start."""
        if not self.on:
            return 0.0
        now = time.thread_time()
        self.parts[part] += now - start
        return now

    def snapshot(self) -> dict[str, Any]:
        return {"calls": self.calls, "metered": self.on, "plugin_cpu_s": sum(self.parts.values()),
                "parts_s": dict(self.parts)}
