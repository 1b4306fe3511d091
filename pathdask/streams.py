"""Dask's batched streams on the path of a program call.

A ``distributed.batched.BatchedSend`` sends at most one batch per interval: the
client's stream to the scheduler every 10 ms, the scheduler's to each worker
every 5 ms, a worker's to the scheduler every 2 ms. A message sent just after
another waits out the interval. That suits what Dask sends about keys (a
release, an acknowledgement), not a program call that a client waits for.

So pathdask's own messages (calls, orders and dispatches) go at once
(:func:`flush` after them), taking along whatever Dask queued before them, in
order. :func:`flush` writes the batch itself, on the event loop that sent it:
waking the stream's sender instead would write it some loop turns later, behind
whatever those turns run (on an embedded system, the client's and scheduler's
work on the same loop). The scheduler gathers the records of a call message for
each of its hosts and writes them in one batch (``compat.send_ahead``), ahead of
what waits on the stream for its interval: a host reads a call's order and
dispatch first, and wakes its devices before it frees what earlier calls left.
Dask's messages keep batching at Dask's intervals, and mostly ride with the next
call. A client that waits for each result thus sends one message per call, the
scheduler one per host, and each host one back:

- the release of the previous result goes with the next call;
- the scheduler's ``free-keys`` for it (and pathdask's release of its buffers)
  goes with that call's dispatch, after it;
- a host's acknowledgement of that free (``release-worker-data``) goes with
  program endings, because a host's stream batches at
  ``pathdask.stream-interval`` (:func:`pace`), longer than a call.

A client embedded with its scheduler (on the same event loop, through Dask's
in-process comm) does not even send that one message: it hands a lone call to the
scheduler plugin (``PathwaysScheduler.call_now``) when the scheduler handled
everything sent on its stream and the stream holds nothing but releases
(``compat.stream_settled``); the releases then go at the stream's interval. A
write of pathdask's own goes only while the stream's sender has no batch taken
and not yet written (``compat.whole_writes``), so it never overtakes one.

A program's ending (``ProgramDone``) goes at once, but for a program that ran
on one host alone (``HostPlan.alone``) under a policy that slots every program
as it comes (``fifo``): nothing waits for that ending (a waiting client has its
result from the devices already), so it batches on the host's stream. The
scheduler then reads a few in one message, instead of reading each one just as
the client's next call comes in (both run on the client's process for an
embedded system). A policy that holds programs back until slotted ones end
(``proportional``'s window) waits for every ending. And a program that spans
hosts must end at once: a host lost before its ending arrived fails the program
on every host, and with it the outputs that survived there (which elastic
recovery reads); a program that ran on the lost host alone loses its outputs
with it anyway. "At once" is per wake of the host's loop: the endings it takes
up together go in one write (``HostRuntime._take_endings``).
"""

from __future__ import annotations

from typing import Any

import dask
from dask.utils import parse_timedelta

from .compat import flush, set_interval, whole_writes

__all__ = ["flush", "pace", "whole_writes"]


def pace(stream: Any) -> None:
    """Set a host's stream to the scheduler to batch at ``pathdask.stream-interval``, with
    writes that need no size check (``compat.whole_writes``)."""
    set_interval(stream, parse_timedelta(dask.config.get("pathdask.stream-interval")))
    whole_writes(stream)
