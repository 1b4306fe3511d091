"""What a host tells the scheduler's activity record (the dashboard, traces).

The scheduler pulls it (``pathdask_activity``) with a cursor per device, so each
gang crosses the wire once. Times are converted here from the host's
``time.perf_counter()`` to wall-clock ``time.time()``, which is comparable
across machines.
"""

from __future__ import annotations

import time
from typing import Any

from .observe import Observed


def activity(rt: Observed, cursors: dict[str, list[tuple[int, int]]], limit: int) -> dict[str, Any]:
    """New gangs per device since ``cursors[rt.address]`` (device, count) pairs (at most the
    newest ``limit`` of each device), and snapshots of memory and link bytes.

    Returns ``{"devices": {device: {"gangs": [...], "count": n}}, "memory": ..., "links": ...,
    "pairs": ...}``; each gang is ``[start, end, program, gang, client, bytes_in, bytes_out,
    program name]`` with wall-clock times.
    """
    seen = {int(d): int(n) for d, n in cursors.get(rt.address, ())}
    offset = time.time() - time.perf_counter()
    devices = {}
    for d, stream in rt.streams.items():
        records, count = stream.records_after(seen.get(d, 0))
        devices[d] = {"count": count,
                      "gangs": [(r.start + offset, r.end + offset, *r[2:]) for r in records[-limit:]]}
    return {"devices": devices, "memory": rt.store.stats(), "links": rt.links.stats(),
            "pairs": rt.links.pairs()}
