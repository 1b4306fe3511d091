"""``CallMeter``: what the scheduler plugin's own work on calls costs, in CPU seconds.

``pathdask bench dispatch --hosts`` reads it (``client.device_stats()["scheduler"]``)
to show how that work grows with the number of hosts a call uses.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["CallMeter"]


class CallMeter:
    """The plugin's own CPU time on calls: taking them in (keys made, slotted), forwarding
    them, their hosts' endings and their keys' forgetting, in thread CPU seconds of the
    scheduler's event loop (``time.thread_time``: the hosts' threads in the same process do not
    count). Dask's own reading and writing of the messages is not in it."""

    __slots__ = ("calls", "seconds")

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def since(self, start: float) -> None:
        self.seconds += time.thread_time() - start

    def snapshot(self) -> dict[str, Any]:
        return {"calls": self.calls, "plugin_cpu_s": self.seconds}

