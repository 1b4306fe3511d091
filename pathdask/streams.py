"""Dask's batched streams on the path of a program call, at ``pathdask.stream-interval``.

A ``distributed.batched.BatchedSend`` sends at most one batch per interval: the
client's stream to the scheduler every 10 ms, the scheduler's to each worker
every 5 ms, a worker's to the scheduler every 2 ms. A message sent just after
another therefore waits out the interval, and a call waits behind the release
of the previous call's arguments: a client that waits for each result would
take at least 10 ms per call. pathdask sets the streams that carry calls,
orders and program endings to a shorter interval; messages sent in one
event-loop tick still go as one batch.
"""

from __future__ import annotations

from typing import Any

import dask
from dask.utils import parse_timedelta

__all__ = ["tighten"]


def tighten(stream: Any) -> None:
    """Set a ``BatchedSend``'s interval to ``pathdask.stream-interval`` if that is shorter."""
    interval = parse_timedelta(dask.config.get("pathdask.stream-interval"))
    if stream is not None and isinstance(getattr(stream, "interval", None), float | int) \
            and interval < stream.interval:
        stream.interval = interval
