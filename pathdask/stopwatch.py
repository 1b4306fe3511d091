"""Where a call's time goes: timestamps at the stations of its path, in every process.

A call passes these stations, in this order when nothing else is running:

===============  ============  ==============================================================
station          where         what has happened
===============  ============  ==============================================================
``call``         client        the call is built: its futures are about to be made
``sent``         client        the client's event loop put the call on its Dask stream
``asked``        client        ``result()`` wrote its fetch requests to the hosts
``taken``        scheduler     the plugin's handler took the call (keys made, slotted)
``forwarded``    scheduler     its ``Order`` and ``Dispatch`` are on the streams to the hosts
``ordered``      host          the host's handler took the ``Order``
``dispatched``   host          the host's handler took the ``Dispatch`` (it registers the call,
                               wakes the devices and lets them run, then puts the handles)
``run``          host          a device began the gang
``ran``          host          the device ended the gang's work: its outputs are about to be stored
``served``       host          the fetch's answer is about to be written (by the device, as it
                               stores the value)
``result``       client        ``result()`` returned
===============  ============  ==============================================================

It is off unless :func:`enable` was called in a process: a station is then one
attribute check. When on, each mark is ``(time.time(), station, program id)`` in
memory; :func:`marks` returns them. Wall-clock times are comparable across the
processes of one machine. ``pathdask bench roundtrip`` turns them into a table
of where the round trip of a waiting call goes.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

__all__ = ["STATIONS", "enable", "disable", "recording", "mark", "marks"]

STATIONS = ("call", "sent", "asked", "taken", "forwarded", "ordered", "dispatched", "run", "ran",
            "served", "result")

#: marks kept per process when on, newest last
KEEP = 100_000

_marks: deque[tuple[float, str, str]] | None = None


def enable() -> None:
    """Start recording marks in this process (clearing earlier ones)."""
    global _marks
    _marks = deque(maxlen=KEEP)


def disable() -> None:
    """Stop recording marks in this process and forget them."""
    global _marks
    _marks = None


def recording() -> bool:
    """Whether marks are recorded in this process: a station that marks many programs at once
    asks first, so that it does no work when the stopwatch is off."""
    return _marks is not None


def mark(station: str, pid: Any) -> None:
    """Record that program ``pid`` passed ``station`` now (a no-op unless enabled)."""
    if _marks is not None:
        _marks.append((time.time(), station, str(pid)))


def marks() -> list[tuple[float, str, str]]:
    """This process's marks, oldest first."""
    return list(_marks or ())
