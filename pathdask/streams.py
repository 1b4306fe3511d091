"""Dask's batched streams on the path of a program call.

A ``distributed.batched.BatchedSend`` sends at most one batch per interval: the
client's stream to the scheduler every 10 ms, the scheduler's to each worker
every 5 ms, a worker's to the scheduler every 2 ms. A message sent just after
another waits out the interval. That suits what Dask sends about keys (a
release, an acknowledgement), not a program call that a client waits for.

So pathdask's own messages (calls, orders and dispatches, program endings)
go at once (:func:`flush` after them), taking along whatever Dask queued before
them, in order. Dask's messages keep batching at Dask's intervals, and mostly
ride with the next call. A client that waits for each result thus sends one
message per call, the scheduler one per host, and each host one back:

- the release of the previous result goes with the next call;
- the scheduler's ``free-keys`` for it goes with that call's dispatch;
- a host's acknowledgement of that free (``release-worker-data``) goes with
  the program's ending, because a host's stream batches at
  ``pathdask.stream-interval`` (:func:`pace`), longer than a call.
"""

from __future__ import annotations

from typing import Any

import dask
from dask.utils import parse_timedelta

__all__ = ["flush", "pace"]


def flush(stream: Any) -> None:
    """Send what a ``BatchedSend`` holds now, without waiting out its interval.

    ``next_deadline`` and ``waker`` are the stream's own pacing: its background sender
    waits on ``waker`` until ``next_deadline``, and sends at once when woken with none.
    A stream that is not started or already closed is left alone.
    """
    if stream is not None and stream.buffer and stream.next_deadline is not None:
        stream.next_deadline = None
        stream.waker.set()


def pace(stream: Any) -> None:
    """Set a host's stream to the scheduler to batch at ``pathdask.stream-interval``."""
    stream.interval = parse_timedelta(dask.config.get("pathdask.stream-interval"))
