"""``HostRuntime``: the worker plugin that is one Pathways host (an adapter).

It turns Dask's messages into events for the host's pure core
(:class:`~pathdask.core.host.HostCore`) and carries out the instructions that
come back: devices to enqueue or wake, buffers to declare and release, records
to send the scheduler. The core decides; this class does I/O. It also owns the
host's device streams, buffer store, mailbox, link model and peer comms; the
data plane (:class:`~pathdask.worker.dataplane.DataPlane`) and the answers to
requests (:class:`~pathdask.worker.answers.HostAnswers`) are its two halves in
modules of their own. It is installed by the scheduler plugin under the name
``"pathdask"``.

Threads and ownership:

- the worker's event loop runs handlers, stream handlers (calls arrive as one)
  and the dispatch tasks of sequential dispatch; it alone calls the core, except
  :meth:`HostCore.device_done <pathdask.core.host.HostCore.device_done>`, which
  touches only the ledger (it locks itself);
- device streams run gangs (``device.py``), all on one driver thread or one thread
  each (``driver.py``); socket receivers deliver pieces;
- state they share lives in objects that lock it themselves: the
  :class:`~pathdask.core.ledger.Ledger`, the
  :class:`~pathdask.worker.store.BufferStore` and the
  :class:`~pathdask.worker.transfer.Mailbox`. ``_gates`` (sequential
  dispatch) is guarded by ``_gates_lock``, the endings the event loop has not
  taken up yet (``_endings``) by ``_endings_lock``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import dask
from dask.utils import parse_bytes, parse_timedelta
from distributed import WorkerPlugin
from distributed.core import error_message
from distributed.protocol import to_serialize

from .. import tuning
from ..compat import flush, put_data, send_to_scheduler, worker_stream
from ..core.host import (
    Declare,
    DropBuffers,
    Ended,
    Enqueue,
    HandOverLater,
    HostCore,
    Instruction,
    MarkJoined,
    MarkLost,
    PutHandles,
    Raise,
    Register,
    Relay,
    Release,
    Tell,
    Wake,
)
from ..core.ledger import HostProgram
from ..errors import GangAbortedError, ProtocolError
from ..ops import BufferKey, HostPlan
from ..protocol import (
    ABORT,
    CHUNK,
    HOST,
    PEER_OPS,
    PEER_STREAM_OP,
    PROTOCOL_ERROR_TOPIC,
    RECORD,
    STREAM_OP,
    XFER,
    Dispatch,
    DropClient,
    DropPrograms,
    Fan,
    Fetch,
    HostActivity,
    HostDiagnose,
    HostFailed,
    HostJoined,
    HostLeaving,
    HostLost,
    HostResetObservations,
    HostStats,
    HostTransfers,
    HostWaitIdle,
    Message,
    Order,
    Plans,
    ProgramDone,
    RegisterHost,
    ReleaseOutputs,
    Save,
    Status,
    StreamByRpc,
    SubtreeDone,
    ask,
    decode,
    encode,
    serve,
    stream_handler,
)
from ..stopwatch import mark, recording
from ..streams import pace
from ..topology import DeviceInfo, Topology
from .answers import HostAnswers
from .chunks import Reassembly
from .dataplane import DataPlane, picklable
from .device import DeviceStream
from .driver import DRIVERS, Driver
from .futures import resolve
from .links import LinkModel
from .observe import StallWatch
from .peers import Peers
from .storage import save
from .store import BufferStore
from .transfer import Mailbox

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("pathdask.worker")


class HostRuntime(DataPlane, HostAnswers, WorkerPlugin):
    """One host: Dask's messages in, the core's instructions carried out. See the module docstring."""

    name = "pathdask"
    idempotent = True

    def __init__(self) -> None:
        self.worker: Worker | None = None

    # -- lifecycle -------------------------------------------------------------
    async def setup(self, worker: Worker, **kwargs: Any) -> None:
        try:
            await self._setup(worker)
        except Exception as e:
            # Dask only logs a failing plugin; tell the scheduler so that start-up fails loudly.
            await ask(worker.scheduler, HostFailed(worker.address, error_message(e)))
            raise

    async def _setup(self, worker: Worker) -> None:
        self.worker = worker
        self.address = worker.address
        self.loop = asyncio.get_running_loop()
        # before registering: a bad transport setting must not take a host
        self.reassembly = Reassembly()
        self.peers = Peers(worker, self.loop, dask.config.get("pathdask.transport"), self._on_message,
                           self.reassembly.target, self.serve)
        self.chunk = parse_bytes(dask.config.get("pathdask.transfer-chunk"))
        if self.chunk <= 0:
            raise ValueError(f"pathdask.transfer-chunk must be a positive size such as '8 MiB', got "
                             f"{dask.config.get('pathdask.transfer-chunk')!r}")
        driven = dask.config.get("pathdask.driver")
        if driven not in DRIVERS:
            raise ValueError(f"pathdask.driver must be one of {', '.join(map(repr, DRIVERS))}, got {driven!r}")
        self.peers.start()  # it listens now: the registration tells every other host where
        # before registering: the scheduler may announce other hosts as soon as this one is known,
        # so peers learn of them here until the core exists and takes these records too
        #: the handlers of stream records, by type (tests may wrap one)
        self.handlers: dict[type[Message], Callable[[Any], None]] = {
            HostLost: lambda m: self.peers.mark_lost(m.host),
            HostJoined: lambda m: self.peers.mark_joined(m.host, m.transport),
        }
        worker.stream_handlers[STREAM_OP] = stream_handler(HOST, self.handlers, self._protocol_error)
        requested = dask.config.get("pathdask.worker.host", None)
        if requested is None and isinstance(worker.name, int):
            requested = worker.name
        reply = await ask(worker.scheduler, RegisterHost(worker.address, requested, self.peers.address))
        self.peers.admit(reply["transport_token"], reply["transports"])
        #: Dask's own interval for this stream, for benchmarks of plain Dask on these workers
        self.dask_stream_interval = worker_stream(worker).interval
        pace(worker_stream(worker))  # Dask's acknowledgements wait for the next program ending
        self.topology = Topology.from_dict(reply["topology"])
        self.island, self.host = reply["island"], reply["host"]
        self.ordering: bool = reply["ordering"]
        self.jitter: float = reply["dispatch_jitter"]
        #: every program's ending goes at once; else those of programs run here alone go with the
        #: stream's next batch (``streams.py``)
        self.prompt_endings: bool = reply.get("prompt_endings", True)
        self.devices: dict[int, DeviceInfo] = {
            d.id: DeviceInfo(d.id, d.island, d.host, d.index, worker.address)
            for d in self.topology.devices_of_host(self.island, self.host)
        }
        # one driver thread for this host's devices, or (``device``) a thread each
        driver = Driver(f"pathdask-host-i{self.island}h{self.host}", self._flush_deferred) \
            if driven == "host" else None
        self.store = BufferStore({d: self.topology.hbm for d in self.devices}, self.loop,
                                 parse_timedelta(dask.config.get("pathdask.allocation-timeout")), driver)
        self.mailbox = Mailbox(parse_timedelta(dask.config.get("pathdask.collective-timeout")), driver)
        self.links = LinkModel(self.topology)
        self.core = HostCore(worker.address, self.devices, self.mailbox, ordering=self.ordering,
                             jitter=bool(self.jitter))
        self.ledger, self.plans = self.core.ledger, self.core.plans
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._program_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._gates_lock = threading.Lock()
        self._gates: dict[tuple[str, int, int], threading.Event] = {}  # sequential dispatch
        #: programs that ended here, for the event loop to take up (``_end_soon``), and those of
        #: them whose endings may wait for the stream's next batch (``_batched``)
        self._endings_lock = threading.Lock()
        self._endings: list[str] = []
        self._batched_endings: set[str] = set()
        #: endings taken together are told (event loop): those due at once wait for one write,
        #: which ``_due`` says is owed
        self._holding = False
        self._due = False
        self.streams = {d: DeviceStream(self, info, driver) for d, info in self.devices.items()}
        if driver is not None:
            self.threads = [driver.drive([s.run for s in self.streams.values()])]
        else:
            self.threads = [threading.Thread(target=s.run, name=f"pathdask-device-{d}", daemon=True)
                            for d, s in self.streams.items()]
        serve(worker.handlers, HOST, {
            Plans: lambda m: self.core.add_plans(m.client, m.plans),
            Fetch: lambda m: self.fetch(m.buffers),
            Status: lambda m: self.status(m.buffers),
            Save: lambda m: save(self, m.path, m.writes),
            StreamByRpc: self.on_message_rpc,
            HostStats: lambda m: self.stats(),
            HostDiagnose: lambda m: self.diagnose(),
            HostWaitIdle: lambda m: self.wait_idle(),
            HostActivity: lambda m: self.activity(m.cursors, m.limit),
            HostTransfers: lambda m: self.transfers(),
            HostResetObservations: lambda m: self.reset_observations(),
        })
        worker.handlers[PEER_STREAM_OP] = self.peers.handle_stream
        for kind in (Order, Dispatch, Fan, DropPrograms, DropClient, ReleaseOutputs, HostLost, HostJoined):
            self.handlers[kind] = self.on_record
        #: relays a fan-out tree's records to other hosts, one at a time, in order
        self.relays = ThreadPoolExecutor(1, thread_name_prefix=f"pathdask-relay-{self.host}")
        worker.stream_handlers.update({
            PEER_OPS[RECORD]: self.on_peer_record,
            PEER_OPS[XFER]: self.on_xfer,
            PEER_OPS[CHUNK]: self.peers.on_chunk,
            PEER_OPS[ABORT]: self.on_abort,
        })
        for t in self.threads:
            t.start()
        self.watch = StallWatch(self, parse_timedelta(dask.config.get("pathdask.stall-warning")))
        self.watch.start()
        self.tuning = tuning.tune("pathdask.worker.switch-interval")  # released in teardown
        logger.info("pathdask host i%d h%d up with devices %s", self.island, self.host, list(self.devices))

    async def teardown(self, worker: Worker, **kwargs: Any) -> None:
        if hasattr(self, "tuning"):
            self.tuning.release()
        if not hasattr(self, "streams"):  # setup failed before the devices started
            if hasattr(self, "peers"):
                await self.peers.close()
            return
        self.watch.stop()
        await self._let_clients_suspend(worker)
        self.apply(self.core.close(GangAbortedError(f"host {worker.address} is shutting down")))
        for s in self.streams.values():
            s.close()
        for t in self.threads:
            await asyncio.to_thread(t.join, 5)
        self.relays.shutdown(wait=False, cancel_futures=True)
        await self.peers.close()

    async def _let_clients_suspend(self, worker: Worker) -> None:
        """A planned departure: clients that opted in save this host's shards before they go.

        The scheduler plugin answers once they have (``scheduler/interruptions.py``), or
        at once when no one opted in; a scheduler that is gone does not hold us up.
        """
        timeout = parse_timedelta(dask.config.get("pathdask.suspend-timeout")) + 5
        try:
            await asyncio.wait_for(ask(worker.scheduler, HostLeaving(worker.address)), timeout)
        except Exception as e:  # noqa: BLE001 - leaving must go on
            logger.info("pathdask: no suspend before host %s left (%s: %s)", worker.address, type(e).__name__, e)

    # -- messages in: the core decides --------------------------------------------
    def on_record(self, msg: Message) -> None:
        """A record from the scheduler (its stream): the core's instructions are carried out.

        Its stations are marked as it comes: the devices it wakes may run, and answer a
        fetch, before the rest of its handling (``tuning.hand_over``)."""
        if recording() and isinstance(msg, (Order, Dispatch, Fan)):
            _mark_taken(msg)
        self.apply(self.core.handle(msg))

    def on_peer_record(self, fields: dict[str, Any]) -> None:
        """A control record from another host (a fan-out tree's), on the event loop."""
        fields = dict(fields)
        fields.pop("op", None)  # encode's stream op: the record came on the peers' channel instead
        try:
            msg = decode(fields, "a peer host", HOST)
            if not isinstance(msg, (Fan, SubtreeDone)):
                raise ProtocolError(f"pathdask message {msg.kind!r} does not travel between hosts")
        except ProtocolError as e:
            self._protocol_error(e)
            return
        self.on_record(msg)

    def _relay(self, addr: str, msg: Message) -> None:
        """Send a record to another host (relay thread); one that is gone is the scheduler's to
        notice (its programs fail with ``DeviceLostError``)."""
        try:
            self.peers.send(addr, RECORD, encode(msg))
        except Exception as e:  # noqa: BLE001 - logged; liveness removes the host
            logger.warning("pathdask: could not relay %s to host %s (%s: %s)", msg.kind, addr, type(e).__name__, e)

    def on_message_rpc(self, rpc: StreamByRpc) -> None:
        """A stream record sent by RPC: the scheduler's stream to a retiring host is closed
        before the host leaves (``PathwaysScheduler.tell``)."""
        fields = dict(rpc.msg)
        fields.pop("op", None)
        msg = decode(fields, "the scheduler", HOST)
        self.handlers[type(msg)](msg)

    def _protocol_error(self, error: ProtocolError) -> None:
        logger.error("pathdask: %s", error)
        assert self.worker is not None
        self.worker.log_event(PROTOCOL_ERROR_TOPIC, {"error": str(error), "host": self.address})

    def dispatch(self, pid: str, plan: HostPlan | str, inputs: tuple[BufferKey, ...], client: str,
                 gated: bool = False) -> str:
        """A dispatch task (sequential dispatch) registers this host's part; raises if it fails."""
        self.apply(self.core.dispatch(pid, plan, inputs, client, gated=gated))
        return pid

    def register(self, pid: str, plan: HostPlan, inputs: tuple[BufferKey, ...], client: str) -> None:
        """A multi-controller host registers a program of its own: no scheduler, no order."""
        self.apply(self.core.run_alone(pid, plan, inputs, client))

    def release_output(self, pid: str, index: int) -> None:
        """Drop the ownership of output ``index`` of ``pid`` on this host."""
        self.apply(self.core.release_outputs([(pid, index)]))

    def device_done(self, pid: str, device: int) -> None:
        """A device popped ``pid`` (device thread); the last one ends it on this host."""
        prog = None if self.prompt_endings else self.ledger.get(pid)
        instructions = self.core.device_done(pid, device)
        if instructions and prog is not None and prog.plan.alone:
            with self._endings_lock:
                self._batched_endings.add(pid)
        self.apply(instructions)

    # -- instructions out ------------------------------------------------------------
    def apply(self, instructions: list[Instruction]) -> None:
        """Carry out the core's instructions, in order.

        Devices woken for a program they can run now (``runs``) take the GIL before the
        instructions after their wake (``tuning.hand_over``): the keys' handles, say, go in
        Dask's data while the gang runs, not before. A device woken for a program that is not
        both ordered and dispatched here would only look and wait again: no hand-over.
        """
        woke = False  # a device was woken for a program it can run
        for ins in instructions:
            if woke and not isinstance(ins, (Enqueue, Wake)):
                tuning.hand_over()
                woke = False
            if isinstance(ins, Enqueue):
                self.streams[ins.device].enqueue(ins.pid)
                woke = woke or ins.runs
            elif isinstance(ins, Wake):
                for d in ins.devices:
                    self.streams[d].wake()
                woke = woke or ins.runs
            elif isinstance(ins, Declare):
                self.store.declare(ins.key, ins.device, owned=ins.owned, consumers=ins.consumers,
                                   client=ins.client)
            elif isinstance(ins, Release):
                self.store.release(ins.key, ins.device, consumers=ins.consumers)
            elif isinstance(ins, PutHandles):
                assert self.worker is not None
                put_data(self.worker, ins.data, ins.stimulus)
            elif isinstance(ins, DropBuffers):
                self._drop_buffers(ins.pid, ins.cause)
            elif isinstance(ins, Ended):
                self.mailbox.finish_program(ins.pid)
                self.reassembly.drop(ins.pid)
                self._end_soon(ins.pid)
            elif isinstance(ins, Tell):
                self.tell(ins.msg, now=not (isinstance(ins.msg, ProgramDone) and self._batched(ins.msg.pid)))
            elif isinstance(ins, Relay):
                try:
                    self.relays.submit(self._relay, ins.host, ins.msg)
                except RuntimeError:  # shut down: this host is closing, its programs were dropped
                    logger.info("pathdask: host %s is closing; not relaying %s", self.address, ins.msg.kind)
            elif isinstance(ins, MarkLost):
                self.peers.mark_lost(ins.host)
            elif isinstance(ins, MarkJoined):
                self.peers.mark_joined(ins.host, ins.transport)
            elif isinstance(ins, Register):
                self.apply(self.core.register(ins.prog, ins.enqueue))
            elif isinstance(ins, HandOverLater):
                self.loop.call_later(random.uniform(0, self.jitter), self._hand_over, ins.pid)
            elif isinstance(ins, Raise):
                raise ins.error
            else:  # pragma: no cover - a new instruction without its executor
                raise TypeError(f"HostRuntime cannot carry out {ins!r}")
        if woke:
            tuning.hand_over()

    def _hand_over(self, pid: str) -> None:
        self.apply(self.core.hand_over(pid))

    def _drop_buffers(self, pid: str, cause: BaseException) -> None:
        with self._gates_lock:
            gates = [self._gates.pop(k) for k in [k for k in self._gates if k[0] == pid]]
        for done in gates:
            done.set()
        self.mailbox.drop_program(pid, cause)
        self.store.drop_program(pid, cause)
        self.ledger.buffers_failed(pid)  # then its devices may pass it (the core's Wake follows)
        self._wake_idle()

    def _end_soon(self, pid: str) -> None:
        """``pid`` has ended on this host (any thread): the event loop takes it up. Endings that
        come before the loop took the last ones go with them, for one wake of the loop."""
        with self._endings_lock:
            self._endings.append(pid)
            first = len(self._endings) == 1
        if first:
            self.loop.call_soon_threadsafe(self._take_endings)

    def _batched(self, pid: str) -> bool:
        """Whether ``pid``'s ending may wait for the stream's next batch (``streams.py``): this
        host ran it alone, and the island's policy does not wait for endings."""
        with self._endings_lock:
            if pid in self._batched_endings:
                self._batched_endings.discard(pid)
                return True
            return False

    def _take_endings(self) -> None:
        """The endings since the loop last took them; those due at once go in one write."""
        with self._endings_lock:
            pids, self._endings = self._endings, []
        self._holding, self._due = True, False
        try:
            for pid in pids:
                self._ended(pid)
        finally:
            self._holding = False
            if self._due:
                assert self.worker is not None
                flush(worker_stream(self.worker))

    def _ended(self, pid: str) -> None:
        """``pid`` has ended on this host (event loop): the scheduler learns it, waiters wake."""
        self.apply(self.core.ended(pid))
        for fut in self._program_waiters.pop(pid, ()):
            resolve(fut)
        self._wake_idle()

    def tell(self, msg: Message, now: bool = True) -> None:
        """A record to the scheduler on the worker's stream, sent at once unless ``now`` is
        false (``streams.py``); an exception it carries travels serialized (and picklable)."""
        assert self.worker is not None
        fields = encode(msg)
        if isinstance(fields.get("cause"), BaseException):
            fields["cause"] = to_serialize(picklable(fields["cause"]))
        if now and self._holding:  # with the other endings taken (``_take_endings``)
            self._due = send_to_scheduler(self.worker, fields, False) or self._due
            return
        send_to_scheduler(self.worker, fields, now)

    # -- sequential dispatch: gates ------------------------------------------------------
    def release_gang(self, pid: str, gang: int, device: int) -> threading.Event:
        """Sequential dispatch: let one gang run on one device; the event is set once it ran."""
        done = threading.Event()
        prog = self.ledger.get(pid)
        if prog is None or prog.released is None:
            done.set()  # dropped, or already finished
            return done
        with self._gates_lock:
            self._gates[(pid, device, gang)] = done
        with self.streams[device].cond:
            prog.released.add(gang)
            self.streams[device].cond.notify_all()
            finished = (device, gang) in prog.done or prog.check(gang) is not None
        if finished:
            self._open_gate(pid, device, gang)
        return done

    def gang_done(self, prog: HostProgram, device: int, gang: int) -> None:
        """Called by a device stream after each op of a gated program."""
        with self.streams[device].cond:
            prog.done.add((device, gang))
        self._open_gate(prog.pid, device, gang)

    def _open_gate(self, pid: str, device: int, gang: int) -> None:
        with self._gates_lock:
            done = self._gates.pop((pid, device, gang), None)
        if done is not None:
            done.set()

    async def wait_program(self, pid: str) -> None:
        """Wait until this host's devices have all popped ``pid`` (run or skipped it)."""
        fut = self.loop.create_future()
        self._program_waiters.setdefault(pid, []).append(fut)
        if self.ledger.client_of(pid) is None:  # neither slotted nor dispatched here
            self._program_waiters.pop(pid, None)
            return
        await fut

    def account(self, device: int, seconds: float) -> None:
        stream = self.streams[device]
        stream.busy_s += seconds
        stream.gangs_run += 1


def _mark_taken(msg: Order | Dispatch | Fan) -> None:
    """The stopwatch's ``ordered`` and ``dispatched`` stations of the programs ``msg`` orders and calls."""
    if isinstance(msg, Fan):
        for station, part in (("ordered", msg.order), ("dispatched", msg.call)):
            if part is not None:
                mark(station, part[1] if part is msg.call else part[0])
        return
    station = "ordered" if isinstance(msg, Order) else "dispatched"
    for entry in msg.programs if isinstance(msg, Order) else msg.calls:
        mark(station, entry[0])


def runtime() -> HostRuntime:
    """The host runtime of the worker running the current task."""
    from distributed import get_worker

    rt = get_worker().plugins.get("pathdask")
    if not isinstance(rt, HostRuntime):
        raise RuntimeError(
            "This Dask worker has no pathdask host runtime; start the cluster with "
            "pathdask.LocalSystem or the dask CLI with --preload pathdask.preload"
        )
    return rt
