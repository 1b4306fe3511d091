"""``Dispatcher``: a client's call path, from a program's plans to the futures of its outputs.

Parallel dispatch (the default) first sends each host the plans it lacks,
straight from here (a put's plan carries its blocks), then sends the call
itself as one small message on the Dask client's stream (``calls.py``):
calls made close together go as one message, before anything sent after them.
Sequential dispatch (``pathdask.dispatch: sequential``, the paper's baseline)
submits a graph of one task per gang and device instead
(:func:`~.lowering.build_sequential_graph`).

Either way an array that a call reads lives until the call is on its way (or,
for a graph, registered on every host): ``ShardedArray._readers`` counts those
calls, under the client's lock.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import dask
from distributed import Client as DaskClient
from distributed import Future
from distributed.protocol import to_serialize

from ..compat import client_send, embedded_scheduler, new_futures, stream_settled
from ..ops import PLANS_PER_CLIENT, HostPlan
from ..protocol import Calls, Plans, encode
from ..stopwatch import mark, recording
from .calls import build_call
from .hosts import Hosts
from .lowering import build_sequential_graph
from .protocols import Sharded
from .tracing import Program

__all__ = ["Dispatcher", "hold_reads", "unread"]


def hold_reads(lock: threading.Lock, arrays: Sequence[Sharded]) -> None:
    """Something (a call, a checkpoint) will read ``arrays``: they outlive a ``delete()`` until
    :func:`unread`. ``lock`` is their client's."""
    with lock:
        for a in arrays:
            a._readers += 1


def unread(lock: threading.Lock, arrays: Sequence[Sharded]) -> None:
    """What read ``arrays`` is done with them: a deleted array that nothing reads goes now."""
    release = []
    with lock:
        for a in arrays:
            a._readers -= 1
            if a._deleted and a._readers == 0:
                release.append(a)
    for a in release:
        a._release()

#: plan ids a client remembers per host as sent; hosts keep twice as many (worker/plans.py)
PLANS_REMEMBERED = PLANS_PER_CLIENT // 2

#: what a dispatch returns: per program output, per host holding shards of it, the future of its key
Outputs = dict[int, dict[str, Future]]


class Dispatcher:
    """Sends the programs of the client ``client_id`` (its Dask client ``dask_client``).

    ``lock`` is the client's lock, which also guards the arrays' reader counts.
    """

    def __init__(self, dask_client: DaskClient, client_id: str, hosts: Hosts, lock: threading.Lock) -> None:
        self.dask = dask_client
        self.client_id = client_id
        self.hosts = hosts
        self.lock = lock
        #: guarded by ``lock``: sequential programs not registered on every host yet
        self._inflight: dict[str, list[Any]] = {}
        #: guarded by ``lock``: host -> ids of the plans it holds for us, least recently used first
        self._plans_sent: dict[str, OrderedDict[str, None]] = {}
        self._sending_plans = threading.Lock()  # one plan upload at a time; cached calls skip it
        #: guarded by ``lock``: calls not sent yet, with the arrays they read and what to tell once sent
        self._waiting_calls: list[tuple[dict[str, Any], tuple[Sharded, ...], Callable[[], None] | None]] = []
        #: program ids: unique to this client, then counted (cheaper than a uuid per call)
        self._pid_prefix = uuid.uuid4().hex[:16]
        self._pids = itertools.count()
        #: the scheduler plugin, where the scheduler runs on this client's event loop (an
        #: embedded system): a call is handed to it there, when nothing waits on the stream
        scheduler = embedded_scheduler(dask_client)
        plugin = scheduler.plugins.get("pathdask") if scheduler is not None else None
        self._embedded: Any = plugin if hasattr(plugin, "call_now") else None

    def new_pid(self) -> str:
        return f"{self._pid_prefix}{next(self._pids):08x}"

    def dispatch(self, pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...],
                 keepalive: tuple[Sharded, ...], program: Program | None = None,
                 sent: Callable[[], None] | None = None) -> Outputs:
        """Send one program; returns its output futures per output and host.

        ``inputs`` are the keys of the arrays it reads, ``keepalive`` those arrays; ``program``
        (none for a put or a load) is what sequential dispatch makes a task per gang of.
        ``sent`` is called once it is on its way (on the event loop, for a call): at once
        for a graph, and never if this raises.
        """
        mode = dask.config.get("pathdask.dispatch")
        if mode not in ("parallel", "sequential"):
            raise ValueError(f"pathdask.dispatch must be 'parallel' or 'sequential', got {mode!r}")
        if mode == "sequential" and program is not None:
            arg_keys = tuple([f.key for f in a._futures.values()] for a in keepalive)
            graph, keys, out_keys = build_sequential_graph(pid, program, plans, inputs, self.client_id, arg_keys)
            futures = self.dask.get(graph, keys, sync=False)
            self._hold(pid, futures, keepalive)
            if sent is not None:
                sent()
        else:
            self._send_plans(plans)
            call, keys, out_keys = build_call(pid, plans, inputs)
            futures = self._send_call(call, keys, keepalive, sent)
        by_key = dict(zip(keys, futures))
        return {j: {addr: by_key[k] for addr, k in hosts.items()} for j, hosts in out_keys.items()}

    def close(self) -> None:
        with self.lock:
            self._inflight.clear()

    # -- calls -----------------------------------------------------------------------
    def _send_call(self, call: dict[str, Any], keys: list[Any], reads: tuple[Sharded, ...],
                   sent: Callable[[], None] | None) -> list[Future]:
        """Send a call on the Dask client's stream; returns the futures of its keys.

        As ``distributed.Client`` does for a graph, the futures exist before the call
        goes, so that the scheduler's reports on their keys find them. Calls made before
        the event loop sends the first go with it, as one message. The arrays it ``reads``
        are kept until it is sent: a release sent after it reaches the hosts after it.
        """
        mark("call", call["pid"])
        futures = new_futures(self.dask, keys)
        hold_reads(self.lock, reads)  # before the flush can take the call and unread them
        with self.lock:
            self._waiting_calls.append((call, reads, sent))
            first = len(self._waiting_calls) == 1
        if first:
            # Queued as Dask queues each message it sends: before anything this thread sends
            # after this call (a graph, the release of one of these keys), which the flush
            # thus precedes.
            assert self.dask.loop is not None
            self.dask.loop.add_callback(self._flush_calls)
        return futures

    def _flush_calls(self) -> None:
        """Put the calls not sent yet on the Dask client's stream, as one message (event loop).

        Straight onto the stream, as Dask's own queued messages go (``compat.client_send``):
        queuing it again would let it fall behind them. It goes at once, with the releases
        queued before it (``streams.py``).

        A client that shares its scheduler's event loop (an embedded system's) hands a lone
        call to the scheduler plugin instead (``PathwaysScheduler.call_now``), when the
        scheduler has handled everything sent on the stream and the stream holds nothing but
        releases (``compat.stream_settled``): none of those can be something the call needs,
        as an array it reads is kept until it is taken. The releases then go at the stream's
        interval. That spares the call the stream's write, read and handler turns on the
        loop it shares with the scheduler. A burst of calls goes on the stream, as one
        message: the scheduler takes it in slices between which other messages are read.
        """
        with self.lock:
            waiting, self._waiting_calls = self._waiting_calls, []
        if not waiting:
            return
        try:
            if len(waiting) == 1 and self._embedded is not None and stream_settled(self.dask):
                (call, _reads, _sent), = waiting
                mark("sent", call["pid"])
                self._embedded.call_now(self.client_id, Calls([call]))
            else:
                client_send(self.dask, encode(Calls([call for call, _, _ in waiting])))
                if recording():
                    for call, _, _ in waiting:
                        mark("sent", call["pid"])
        finally:  # sent, or never to be: either way no host will count these reads later
            unread(self.lock, [a for _, reads, _ in waiting for a in reads])
            for _, _, sent in waiting:
                if sent is not None:
                    sent()

    def _hold(self, pid: str, futures: list[Any], keepalive: tuple[Sharded, ...]) -> None:
        """Keep a graph's futures and inputs alive until every host has registered it.

        Inputs must outlive the registration that counts their readers, and no
        dispatch task may be cancelled half-way across hosts.
        """
        entry: list[Any] = [len(futures), futures, keepalive]
        hold_reads(self.lock, keepalive)
        with self.lock:
            self._inflight[pid] = entry

        def done(_: Any) -> None:
            with self.lock:
                entry[0] -= 1
                last = entry[0] == 0
                if last:
                    self._inflight.pop(pid, None)
            if last:
                unread(self.lock, keepalive)

        for f in futures:
            f.add_done_callback(done)

    # -- plans -----------------------------------------------------------------------
    def _unsent(self, plans: dict[str, HostPlan]) -> dict[str, HostPlan]:
        """The cached plans (by host) that their host does not hold yet; marks the others used."""
        missing = {}
        with self.lock:
            for addr, plan in plans.items():
                sent = self._plans_sent.get(addr)
                if plan.once or not plan.id:
                    continue
                if sent is not None and plan.id in sent:
                    sent.move_to_end(plan.id)
                else:
                    missing[addr] = plan
        return missing

    def _send_plans(self, plans: dict[str, HostPlan]) -> None:
        """Send each host the plans it lacks, and wait for them to arrive, before any call
        names them; so a registration always finds its plan, whatever order messages and tasks run in.

        A put's plan carries its blocks: each host gets its own, straight from here,
        in parallel, never through the scheduler; it is used once.
        """
        once = {a: p for a, p in plans.items() if p.once}
        if once:
            self._upload(once)
        if not self._unsent(plans):
            return
        with self._sending_plans:
            missing = self._unsent(plans)  # another thread may have sent them meanwhile
            if not missing:
                return
            self._upload(missing)
            with self.lock:
                for addr, plan in missing.items():
                    sent = self._plans_sent.setdefault(addr, OrderedDict())
                    sent[plan.id] = None
                    while len(sent) > PLANS_REMEMBERED:
                        sent.popitem(last=False)

    def _upload(self, plans: dict[str, HostPlan]) -> None:
        async def send() -> None:
            await asyncio.gather(*(
                self.hosts.ask(addr, Plans(self.client_id, to_serialize([plan])), "runs part of this program")
                for addr, plan in plans.items()))

        self.dask.sync(send)
