"""``PathwaysScheduler``: the scheduler plugin, registered under the name ``"pathdask"`` (an adapter).

It turns Dask's messages, hooks and handlers into events for the scheduler's
pure core (:class:`~pathdask.core.island.SchedulerCore`: intake, slotting,
policies, program ends, lost hosts, closed clients) and carries out the
instructions that come back: records to hosts on the scheduler's streams, a
call's parts forwarded, keys made or failed. It also holds the resource manager
and installs the :class:`~pathdask.worker.runtime.HostRuntime` worker plugin on
every worker. Its observation half is :class:`~pathdask.scheduler.answers.SchedulerAnswers`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import dask
from distributed import SchedulerPlugin
from distributed.core import error_message
from distributed.protocol import to_serialize
from distributed.protocol.pickle import dumps

from .. import tuning
from ..compat import (
    create_keys,
    keys_exist,
    on_client_releases_keys,
    release_keys,
    report_erred,
    send_ahead,
    send_to_worker,
)
from ..core.island import FailKeys, Forward, Instruction, Progress, SchedulerCore, Send, SendAll
from ..core.order import make_policy
from ..dashboard import install
from ..dashboard.collect import Collector
from ..errors import DeviceLostError, ProtocolError
from ..ops import as_key, dispatched_program
from ..protocol import (
    PROTOCOL_ERROR_TOPIC,
    SCHEDULER,
    STREAM_OP,
    AllocateMesh,
    Calls,
    Diagnose,
    Dispatch,
    DispatchFailed,
    HostFailed,
    HostLeaving,
    HostsGone,
    Info,
    Message,
    Order,
    ProgramDone,
    RegisterClient,
    RegisterHost,
    Released,
    ReleaseSlice,
    ResetObservations,
    Stats,
    StreamByRpc,
    Suspended,
    SuspendOnInterruption,
    Trace,
    Transfers,
    TransportOf,
    WaitHostGone,
    WaitHosts,
    WaitIdle,
    ask,
    encode,
    serve,
    stream_handler,
)
from ..stopwatch import mark, recording
from ..topology import Topology
from ..worker.peers import TOKEN_BYTES
from ..worker.runtime import HostRuntime
from .answers import SchedulerAnswers
from .interruptions import Interruptions
from .liveness import HostLiveness, host_timeout
from .membership import HostMembership
from .meter import CallMeter
from .resources import ResourceManager

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.scheduler")

#: seconds of taking in calls of one message after which the calls taken in go to their hosts
CALL_SLICE = 1e-3

#: the modelled size of an output key's value (a handle; the data stays on the devices)
HANDLE_NBYTES = 64


class PathwaysScheduler(HostMembership, SchedulerAnswers, SchedulerPlugin):
    """The control plane of pathdask. See the module docstring.

    Parameters
    ----------
    topology : Topology
        The cluster's shape; workers are mapped onto its hosts as they join.
    ordering : bool
        Test-only switch. ``False`` sends no order messages, so devices run
        programs in the order their dispatch happens to arrive.
    dispatch_jitter : float
        Test-only: each host delays each dispatch by up to this many seconds,
        as independent controllers' messages would be.
    """

    name = "pathdask"

    def __init__(self, topology: Topology, *, ordering: bool = True, dispatch_jitter: float = 0.0,
                 policy: str | None = None) -> None:
        self.topology = topology
        self.ordering = ordering
        self.dispatch_jitter = dispatch_jitter
        self.policy = policy or dask.config.get("pathdask.policy", "fifo")
        make_policy(self.policy)  # an unknown name fails here, where the system is configured

    async def start(self, scheduler: Scheduler, **kwargs: Any) -> None:
        self.tuning = tuning.tune()  # released in before_close
        self.scheduler = scheduler
        fanout = dask.config.get("pathdask.fanout")
        self.core = SchedulerCore(self.policy, ordering=self.ordering, degree=int(fanout["degree"]),
                                  threshold=int(fanout["threshold"]))
        self.meter = CallMeter(on=bool(dask.config.get("pathdask.scheduler.meter", False)))
        self.resources = ResourceManager(self.topology)
        self.interruptions = Interruptions(scheduler, self.resources)
        #: address -> the suspend its retirement started (``log_event``)
        self.leaving: dict[str, asyncio.Future[list[str]]] = {}
        self._leaving_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Future[Any]] = set()  # background work, held until done
        self.clients: dict[str, dict[str, Any]] = {}
        self.hosts_changed = asyncio.Condition()
        self.host_failures: dict[str, dict[str, Any]] = {}  # address -> error_message
        #: the secret hosts present to each other on the socket transport (sent over Dask comms)
        self.transport_token = secrets.token_bytes(TOKEN_BYTES)
        #: host address -> where its socket transport listens, as the host reported it (hosts
        #: in the cluster only: a host that leaves or fails to start is taken out)
        self.transports: dict[str, str] = {}
        self.progress = asyncio.Event()  # set whenever the order changed (programs slotted or ended)
        #: the record of device activity that the dashboard and traces read
        self.activity = Collector(self.ask_hosts)
        serve(scheduler.handlers, SCHEDULER, {
            RegisterHost: lambda m: self.register_host(m.address, m.requested, m.transport),
            TransportOf: lambda m: self.transport_of(m.host),
            HostsGone: lambda m: self.hosts_gone(m.hosts),
            HostFailed: lambda m: self.host_failed(m.address, m.error),
            RegisterClient: lambda m: self.register_client(m.client, m.name, m.weight),
            Info: lambda m: self.info(),
            AllocateMesh: lambda m: self.mesh(m.client, m.shape, m.island, m.hints),
            ReleaseSlice: lambda m: self.resources.release(m.slice_id),
            Stats: lambda m: self.stats(),
            Diagnose: lambda m: self.diagnose(),
            WaitHosts: lambda m: self.wait_hosts(m.n, m.timeout),
            HostLeaving: lambda m: self.host_leaving(m.address),
            SuspendOnInterruption: lambda m: self.suspend_on_interruption(m.client),
            Suspended: lambda m: self.interruptions.suspended(m.client, m.host, m.error),
            WaitHostGone: lambda m: self.wait_host_gone(m.address),
            WaitIdle: lambda m: self.wait_idle(m.timeout),
            ResetObservations: lambda m: self.reset_observations(),
            Trace: lambda m: self.trace(m.timeout),
            Transfers: lambda m: self.transfers(),
        })
        #: the handlers of stream records, by type (tests may wrap one)
        self.handlers: dict[type[Message], Any] = {
            Calls: self.call,
            ProgramDone: self.program_done,
            Released: lambda worker, m: self.core.released_on_tree(m.id),
            DispatchFailed: lambda worker, m: self.apply(self.core.dispatch_failed(worker, m.pid, m.error,
                                                                                   m.cause)),
        }
        scheduler.stream_handlers[STREAM_OP] = stream_handler(SCHEDULER, self.handlers, self._protocol_error)
        on_client_releases_keys(scheduler, lambda client, keys: self.apply(self.core.keys_released(keys)))
        await scheduler.register_worker_plugin(None, dumps(HostRuntime()), name="pathdask", idempotent=False)
        self.activity.start()
        install(scheduler)
        self.liveness = HostLiveness(scheduler, lambda a: a in self.resources.hosts, host_timeout())
        self.liveness.start()

    async def before_close(self, **kwargs: Any) -> None:
        if hasattr(self, "tuning"):
            self.tuning.release()
        if hasattr(self, "activity"):
            self.activity.stop()
        if hasattr(self, "liveness"):
            self.liveness.stop()

    close = before_close

    def _protocol_error(self, error: ProtocolError) -> None:
        logger.error("pathdask: %s", error)
        self.scheduler.log_event(PROTOCOL_ERROR_TOPIC, {"error": str(error)})

    # -- clients -------------------------------------------------------------
    def register_client(self, client: str, name: str, weight: float = 1.0) -> dict[str, Any]:
        self.clients[client] = {"name": name, "weight": weight}
        self.core.client_joined(client, weight)
        self.activity.record.name_client(client, name)
        # the hosts' transports and their token: the client fetches results there (client/fetch.py)
        return {**self.info(), "transport_token": self.transport_token, "transports": dict(self.transports)}

    def remove_client(self, scheduler: Scheduler, client: str, **kwargs: Any) -> None:
        if client not in self.clients:
            return
        del self.clients[client]
        self._background(self.interruptions.forget(client))
        self.resources.release_client(client)
        self.apply(self.core.client_closed(client))

    def info(self) -> dict[str, Any]:
        return {
            "topology": self.topology.to_dict(),
            "devices": self.resources.describe_devices(),
            "hosts": {a: (h.island, h.host) for a, h in self.resources.hosts.items()},
            "clients": dict(self.clients),
            "order": self.order.info(),
        }

    def mesh(self, client: str, shape: dict[str, int], island: int | None = None,
             hints: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            sl, devices = self.resources.allocate(client, shape, island, **(hints or {}))
        except (ValueError, TypeError) as e:  # the user's mistake: answer it typed, no traceback logged
            return {"error": error_message(e)}
        return {"slice": sl.id, "devices": [(d.id, d.island, d.host, d.index, d.address) for d in devices]}

    # -- programs --------------------------------------------------------------
    def update_graph(self, scheduler: Scheduler, *, client: str, annotations: dict[str, dict[Any, Any]],
                     **kwargs: Any) -> None:
        """Slot each pathdask program of a graph (sequential dispatch), before any of its tasks
        is sent out, from the graph's ``pathdask`` annotation."""
        for info in {a["pid"]: a for a in annotations.get("pathdask", {}).values()}.values():
            self.apply(self.core.submit(client, info))

    def program_done(self, worker: str, msg: ProgramDone) -> None:
        start = self.meter.now()
        self.apply(self.core.program_done(worker, msg.pid))
        self.meter.lap("ended", start)

    async def call(self, client: str, msg: Calls) -> None:
        """Program calls on the client's stream (``client/calls.py``), in the order they were
        made (a call never takes a slot before the calls it reads).

        Each call's output keys are created in memory on their hosts, and the call is
        slotted; each host is sent its calls as one message per :data:`CALL_SLICE` of this
        handler's work, the first call's at once, before any later message (say, the release
        of an argument): Dask's stream awaits this handler before the client's next message.
        So the devices start on a burst of calls while the rest are still taken in. A call
        that cannot be made fails alone: the client's futures of its keys err, and the
        program is dropped on its hosts, so that its results raise. Calls of a client that
        left meanwhile are not made.
        """
        batch: dict[str, list[Any]] = defaultdict(list)  # per host, in call order
        until = None
        for call in msg.calls:
            if until is not None and time.perf_counter() >= until:
                self._forward(client, batch)
                await asyncio.sleep(0)  # the dispatches go; the hosts and other streams get a turn
                if client not in self.clients:
                    return
                until = time.perf_counter() + CALL_SLICE
            self._take(client, call, batch)
            until = until if until is not None else time.perf_counter()  # the first call goes alone
        self._forward(client, batch)

    def call_now(self, client: str, msg: Calls) -> None:
        """Calls handed over on the event loop this plugin runs on, by a client that shares it
        and whose stream holds nothing they could overtake (``client/dispatcher.py``): taken
        and forwarded at once, as :meth:`call` takes a message's calls, in one slice."""
        batch: dict[str, list[Any]] = defaultdict(list)
        for call in msg.calls:
            self._take(client, call, batch)
        self._forward(client, batch)

    def _take(self, client: str, call: dict[str, Any], batch: dict[str, list[Any]]) -> None:
        """Take one call into ``batch``; one that cannot be made fails alone, after the calls
        before it reach their hosts."""
        try:
            self._call(client, call, batch)
        except Exception as e:  # noqa: BLE001 - answered to the client below
            self._forward(client, batch)  # the calls before it reach their hosts before its drop
            if isinstance(e, DeviceLostError):
                logger.info("pathdask: program %s could not be called: %s", call["pid"], e)
            else:
                logger.exception("pathdask: program %s could not be called", call["pid"])
            self.apply(self.core.call_failed(client, call, e))

    def _call(self, client: str, call: dict[str, Any], batch: dict[str, list[Any]]) -> None:
        """One call: its hosts are live, its output keys are made in memory on them (they must
        not exist yet), then the core takes it: its parts join ``batch``, it is slotted."""
        meter = self.meter
        meter.calls += 1
        start = meter.now()
        mesh = self.core.check_call(call, self.scheduler.workers)
        keys: dict[str, list[Any]] = {}
        for k, _j, owner in call["outputs"]:
            keys.setdefault(owner, []).append(as_key(k))
        exist = keys_exist(self.scheduler, (k for made in keys.values() for k in made))
        if exist:
            raise ValueError(f"output key {exist[0]!r} of program {call['pid']} exists already")
        start = meter.lap("check", start)
        create_keys(self.scheduler, client, keys, HANDLE_NBYTES)
        start = meter.lap("keys", start)
        instructions = self.core.take_call(client, call, mesh)
        start = meter.lap("slot", start)
        self.apply(instructions, batch)
        meter.lap("order", start)
        mark("taken", call["pid"])

    def _forward(self, client: str, batch: dict[str, list[Any]]) -> None:
        """Send each host its calls of one message as one message (the host puts all their
        output keys' handles in its data at once), in one write with the records queued for
        it while the calls were taken (their orders)."""
        start = self.meter.now()
        for addr, items in batch.items():
            records = [m for m in items if isinstance(m, Message)]
            calls = [entry for entry in items if not isinstance(entry, Message)]
            if calls:
                records.append(Dispatch(client, calls))
            self.tell_ahead(addr, records)
        self.meter.lap("forward", start)
        if recording():
            for pid in {entry[0] for items in batch.values() for entry in items if not isinstance(entry, Message)}:
                mark("forwarded", pid)
        batch.clear()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Two endings the scheduler sees first.

        - A program's dispatch task (sequential dispatch) failed on one host: the program
          is dropped on every host it uses, with the dispatch's own error, so that no
          device waits for a part that will never come.
        - The scheduler forgot an output key: its host frees the buffers it owned.
          Decided here rather than on the worker, because workers also see
          replicas of a key come and go (dependencies, the active memory manager).
        """
        if finish == "erred":
            pid = dispatched_program(key)
            if pid is None or kwargs.get("cause") not in (None, key):
                return  # erred because a dependency did; only the failing task itself ends the program
            text = kwargs.get("exception_text") or "unknown error"
            self.apply(self.core.end_program(
                pid, f"the dispatch of program {pid} failed on host {kwargs.get('worker')}: {text}",
                kwargs.get("exception")))
        elif finish == "forgotten":
            began = self.meter.now()
            owner = self.core.output_owners.get(key)
            self.apply(self.core.key_forgotten(key, owner_left=owner is not None
                                               and owner.owner not in self.scheduler.workers))
            self.meter.lap("forgotten", began)

    # -- instructions out --------------------------------------------------------------
    def apply(self, instructions: list[Instruction],
              batch: dict[str, list[Any]] | None = None) -> None:
        """Carry out the core's instructions, in order; ``batch`` gathers forwarded calls, and
        the records to their hosts that go at once, which then go with them (``_forward``)."""
        for ins in instructions:
            if isinstance(ins, Send):
                if batch is not None and ins.now:  # goes with the batch's dispatches (``_forward``)
                    batch[ins.host].append(ins.msg)
                else:
                    self.tell(ins.host, ins.msg, ins.now)
            elif isinstance(ins, SendAll):
                for addr in list(self.resources.hosts):
                    if addr != ins.but:
                        self.tell(addr, ins.msg)
            elif isinstance(ins, Forward):
                assert batch is not None, ins
                batch[ins.host].append(ins.entry)
            elif isinstance(ins, FailKeys):
                release_keys(self.scheduler, ins.client, ins.keys, f"pathdask-call-failed-{ins.pid}")
                report_erred(self.scheduler, ins.client, ins.keys, error_message(ins.error))
            elif isinstance(ins, Progress):
                self.progress.set()
            else:  # pragma: no cover - a new instruction without its executor
                raise TypeError(f"PathwaysScheduler cannot carry out {ins!r}")

    def tell(self, addr: str, msg: Message, now: bool = True) -> bool:
        """Send a record on the scheduler's stream to host ``addr``; ``False`` if the host is gone.

        It goes at once (``streams.py``), unless ``now`` is false: then it waits, as
        Dask's own messages do, for the next that goes at once or the stream's interval.
        """
        fields = self._fields(msg)
        return send_to_worker(self.scheduler, addr, fields, now) or self._gone(addr, [fields])

    def tell_ahead(self, addr: str, msgs: list[Message]) -> bool:
        """Send records to host ``addr`` at once, in one write, ahead of what waits on its
        stream for the stream's interval (``compat.flush``); ``False`` if the host is gone."""
        fields = [self._fields(m) for m in msgs]
        return send_ahead(self.scheduler, addr, fields) or self._gone(addr, fields)

    @staticmethod
    def _fields(msg: Message) -> dict[str, Any]:
        """A record as it goes on a stream; an exception it carries travels serialized."""
        fields = encode(msg)
        if isinstance(fields.get("cause"), BaseException):
            fields["cause"] = to_serialize(fields["cause"])
        return fields

    def _gone(self, addr: str, records: list[dict[str, Any]]) -> bool:
        """Records for a host with no stream: whether they still reach it. A retiring host
        (Dask closed its stream, but it runs until its clients suspended) gets them by RPC,
        one at a time, in order."""
        if addr in self.leaving and addr in self.resources.hosts:
            for fields in records:
                self._background(self._tell_leaving(addr, fields))
            return True
        if any(r.get("kind") == Order.kind for r in records):
            logger.error("pathdask: programs %s use host %s, which is gone",
                         [p for r in records if r.get("kind") == Order.kind for p, *_ in r["programs"]], addr)
        return False

    def _background(self, coro: Any) -> None:
        """Run ``coro`` on the event loop, holding a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell_leaving(self, addr: str, fields: dict[str, Any]) -> None:
        async with self._leaving_locks.setdefault(addr, asyncio.Lock()):
            try:
                await ask(self.scheduler.rpc(addr), StreamByRpc(fields))
            except Exception as e:  # noqa: BLE001 - it left after all: its removal fails what it held
                logger.info("pathdask: could not tell leaving host %s %s (%s)", addr, fields.get("kind"), e)
