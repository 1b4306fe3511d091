"""``HostRuntime``: the worker plugin that is one Pathways host.

It owns the host's device streams, its buffer store, its mailbox and link
model, its plan cache and program ledger, and the one-way comms to its peer
hosts. It is installed by the scheduler plugin under the name ``"pathdask"``.

Threads and ownership:

- the worker's event loop runs handlers, stream handlers (calls arrive as one)
  and the dispatch tasks of programs submitted as graphs;
  it alone owns ``plans``, ``owned``, ``released_early`` and the waiter lists;
- device streams run gangs (``device.py``), all on one driver thread or one thread
  each (``driver.py``); socket receivers deliver pieces;
- state they share lives in objects that lock it themselves: the
  :class:`~pathdask.worker.ledger.Ledger`, the
  :class:`~pathdask.worker.store.BufferStore` and the
  :class:`~pathdask.worker.transfer.Mailbox`. ``_gates`` (sequential
  dispatch) is guarded by ``_gates_lock``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
from dask.utils import parse_bytes, parse_timedelta
from distributed import WorkerPlugin
from distributed.core import error_message
from distributed.protocol import to_serialize

from ..chunking import split
from ..errors import DeviceLostError, DispatchError, GangAbortedError
from ..gather import encode_block
from ..ops import BufferKey, GangSpec, HostPlan, KernelOp, ReshardOp, as_key
from ..sharding import contiguous
from ..streams import flush, pace
from ..topology import DeviceInfo, Topology
from .activity import activity
from .bounded import remember
from .chunks import Reassembly
from .device import DeviceStream
from .driver import DRIVERS, Driver
from .driver import current as current_driver
from .futures import resolve
from .ledger import HostProgram, Ledger
from .links import LinkModel
from .observe import StallWatch, diagnose, host_stats
from .peers import Peers
from .plans import PlanCache
from .storage import save
from .store import BufferStore
from .transfer import Mailbox, wait_until

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("pathdask.worker")

#: a piece on its way: (exchange key, source device, value, (modelled ready time, scale))
Piece = tuple[tuple[str, int, int, int], int, np.ndarray, tuple[float, float]]


class HostRuntime(WorkerPlugin):
    """The data plane of one host. See the module docstring."""

    name = "pathdask"
    idempotent = True

    def __init__(self) -> None:
        self.worker: Worker | None = None

    # -- lifecycle -------------------------------------------------------------
    async def setup(self, worker: Worker) -> None:
        try:
            await self._setup(worker)
        except Exception as e:
            # Dask only logs a failing plugin; tell the scheduler so that start-up fails loudly.
            await worker.scheduler.pathdask_host_failed(address=worker.address, error=error_message(e))
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
        # before registering: the scheduler may announce other hosts as soon as this one is known
        worker.stream_handlers.update({
            "pathdask-host-lost": self.peers.mark_lost,
            "pathdask-host-joined": self.peers.mark_joined,
        })
        requested = dask.config.get("pathdask.worker.host", None)
        if requested is None and isinstance(worker.name, int):
            requested = worker.name
        reply = await worker.scheduler.pathdask_register_host(
            address=worker.address, requested=requested, transport=self.peers.address
        )
        self.peers.admit(reply["transport_token"], reply["transports"])
        #: Dask's own interval for this stream, for benchmarks of plain Dask on these workers
        self.dask_stream_interval = worker.batched_stream.interval
        pace(worker.batched_stream)  # Dask's acknowledgements wait for the next program ending
        self.topology = Topology.from_dict(reply["topology"])
        self.island, self.host = reply["island"], reply["host"]
        self.ordering: bool = reply["ordering"]
        self.jitter: float = reply["dispatch_jitter"]
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
        self.ledger = Ledger()
        self.plans = PlanCache(worker.address)
        #: (program, output index) -> (value id, device) pairs its Dask key owns here
        self.owned: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        #: output keys the scheduler forgot before their program registered here
        self.released_early: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._program_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._gates_lock = threading.Lock()
        self._gates: dict[tuple[str, int, int], threading.Event] = {}  # sequential dispatch
        self.streams = {d: DeviceStream(self, info, driver) for d, info in self.devices.items()}
        if driver is not None:
            self.threads = [driver.drive([s.run for s in self.streams.values()])]
        else:
            self.threads = [threading.Thread(target=s.run, name=f"pathdask-device-{d}", daemon=True)
                            for d, s in self.streams.items()]
        worker.handlers.update(
            pathdask_stream=self.peers.handle_stream,
            pathdask_plans=self.add_plans,
            pathdask_fetch=self.fetch,
            pathdask_save=lambda path, writes: save(self, path, writes),
            pathdask_message=self.on_message_rpc,
            pathdask_status=self.status,
            pathdask_stats=self.stats,
            pathdask_diagnose=self.diagnose,
            pathdask_wait_idle=self.wait_idle,
            pathdask_timeline=self.timeline,
            pathdask_activity=self.activity,
            pathdask_transfers=self.transfers,
            pathdask_reset_observations=self.reset_observations,
        )
        worker.stream_handlers.update({
            "pathdask-order": self.on_order,
            "pathdask-dispatch": self.on_dispatch,
            "pathdask-xfer": self.on_xfer,
            "pathdask-chunk": self.peers.on_chunk,
            "pathdask-abort": self.on_abort,
            "pathdask-drop-client": self.drop_client,
            "pathdask-release-outputs": self.on_release_outputs,
            "pathdask-drop-programs": self.on_drop_programs,
        })
        for t in self.threads:
            t.start()
        self.watch = StallWatch(self, parse_timedelta(dask.config.get("pathdask.stall-warning")))
        self.watch.start()
        logger.info("pathdask host i%d h%d up with devices %s", self.island, self.host, list(self.devices))

    async def teardown(self, worker: Worker) -> None:
        if not hasattr(self, "streams"):  # setup failed before the devices started
            if hasattr(self, "peers"):
                await self.peers.close()
            return
        self.watch.stop()
        await self._let_clients_suspend(worker)
        cause = GangAbortedError(f"host {worker.address} is shutting down")
        for pid in self.ledger.pids():
            self.drop_program(pid, cause)
        for s in self.streams.values():
            s.close()
        for t in self.threads:
            await asyncio.to_thread(t.join, 5)
        await self.peers.close()

    def on_message_rpc(self, msg: dict[str, Any]) -> None:
        """A stream message sent by RPC: the scheduler's stream to a retiring host is closed
        before the host leaves (``PathwaysScheduler._tell``)."""
        op = msg.pop("op")
        assert self.worker is not None
        self.worker.stream_handlers[op](**msg)

    async def _let_clients_suspend(self, worker: Worker) -> None:
        """A planned departure: clients that opted in save this host's shards before they go.

        The scheduler plugin answers once they have (``scheduler/interruptions.py``), or
        at once when no one opted in; a scheduler that is gone does not hold us up.
        """
        timeout = parse_timedelta(dask.config.get("pathdask.suspend-timeout")) + 5
        try:
            await asyncio.wait_for(worker.scheduler.pathdask_host_leaving(address=worker.address), timeout)
        except Exception as e:  # noqa: BLE001 - leaving must go on
            logger.info("pathdask: no suspend before host %s left (%s: %s)", worker.address, type(e).__name__, e)

    def on_release_outputs(self, outputs: list[tuple[str, int]]) -> None:
        """The scheduler forgot these output keys: no client holds them any more."""
        for pid, index in outputs:
            self.release_output(pid, index)

    def release_output(self, pid: str, index: int) -> None:
        """Drop the ownership of output ``index`` of ``pid`` on this host.

        The scheduler may forget an output key before the program's dispatch
        registered here (its client closed meanwhile): then the registration
        must not take the ownership, so it is remembered until it comes.
        """
        pairs = self.owned.pop((pid, index), None)
        if pairs is None:
            remember(self.released_early, (pid, index), None)
            return
        for vid, dev in pairs:
            self.store.release((pid, vid), dev)

    # -- control: plans, order and dispatch --------------------------------------
    def add_plans(self, client: str, plans: list[HostPlan]) -> int:
        """The ``pathdask_plans`` handler: a client's new plans, sent before the calls that name them."""
        self.plans.add(client, plans)
        return len(plans)

    def on_order(self, programs: list[tuple[str, str, list[int]]]) -> None:
        """Order message from the scheduler: these programs, in slot order, use these devices."""
        for pid, client, devices in programs:
            if not self.ledger.slot(pid, client, devices):
                self._ended(pid)  # dropped before its slot came: it has nothing to run here
                continue
            for d in devices:
                self.streams[d].enqueue(pid)

    def on_dispatch(self, client: str, calls: list[tuple[str, str, list[Any], list[tuple[Any, int]]]]) -> None:
        """Calls reached this host (``scheduler/calls.py``), each ``(program id, plan id,
        argument keys, output keys owned here)``, in call order: the handles of their output
        keys go in the worker's data (all at once: one Dask state-machine event), and each
        call's part is registered.

        A call that fails is dropped here at once and the scheduler drops it on its other
        hosts; its results raise the error.
        """
        assert self.worker is not None
        data: dict[Any, object] = {as_key(k): (pid, j) for pid, _, _, outputs in calls for k, j in outputs}
        if data:
            self.worker.update_data(data=data, stimulus_id=f"pathdask-call-{calls[0][0]}")
        for pid, plan, inputs, _ in calls:
            try:
                self.dispatch(pid, plan, tuple((str(p), int(v)) for p, v in inputs), client)
            except Exception as e:  # noqa: BLE001 - the program's end carries it
                self._send_scheduler({"op": "pathdask-dispatch-failed", "pid": pid, "error": f"{type(e).__name__}: {e}",
                                      "cause": to_serialize(_picklable(e))})

    def dispatch(self, pid: str, plan: HostPlan | str, inputs: tuple[BufferKey, ...], client: str,
                 gated: bool = False) -> str:
        """Register this host's part of a program; returns at once, before execution.

        ``plan`` is the host's plan, or the id of one its client sent ahead. If it
        fails, the program is dropped here at once, and on its other hosts by the scheduler.
        """
        if self.ledger.refused(pid, client) is not None:
            self.plans.discard(pid)
            return pid  # dropped (or its client closed) before it came: it ended here already
        try:
            if isinstance(plan, str):
                plan = self.plans.get(client, pid, plan)
            if self.address not in {d.address for g in plan.gangs.values() for d in g.members}:
                # Dask recomputes lost keys on a replacement worker; a program cannot follow its host.
                raise DeviceLostError(
                    f"Program {pid} was planned for a host that left the cluster; {self.address} "
                    "replaced it. Call the program again on a new mesh"
                )
            self.register(pid, plan, inputs, client, gated=gated, enqueue=not self.ordering,
                          delay=random.uniform(0, self.jitter) if self.jitter else 0.0)
        except Exception as e:
            self.drop_program(pid, e)
            raise
        return pid

    def register(self, pid: str, plan: HostPlan, inputs: tuple[BufferKey, ...], client: str, *,
                 gated: bool = False, enqueue: bool = False, delay: float = 0.0) -> None:
        """Count the program's readers and owners in the store, then hand it to the devices.

        ``gated``: each gang waits for its sequential-dispatch task to release it.
        ``enqueue``: the devices take it in arrival order (multi-controller runs and
        the test-only unordered mode) instead of waiting for the scheduler's order.
        ``delay``: test-only: hand it over this many seconds later, as an independent
        controller's message might come (its reads are counted now all the same).
        """
        prog = HostProgram(pid, plan, tuple(inputs), client, self.mailbox, released=set() if gated else None)
        if self.ledger.refused(pid, client) is not None:
            return  # dropped, or its client closed, before its dispatch came
        self._count_reads(prog, +1)
        for k, pairs in plan.owned.items():
            if self.released_early.pop((pid, k), "kept") is None:
                continue  # its key is gone already: nothing owns these buffers
            for vid, dev in pairs:
                self.store.declare((pid, vid), dev, owned=True, client=client)
            self.owned[(pid, k)] = pairs
        if delay:
            self.loop.call_later(delay, self._hand_over, prog, enqueue)
        else:
            self._hand_over(prog, enqueue)

    def _hand_over(self, prog: HostProgram, enqueue: bool) -> None:
        """Give a registered program to its devices (event loop)."""
        if self.ledger.refused(prog.pid, prog.client) is not None:
            self._count_reads(prog, -1)  # dropped while it was held back: it never reads
            return
        # Drops run on the event loop, as this does, so nothing was dropped since the check.
        slotted = not enqueue or self.ledger.slot(prog.pid, prog.client, list(prog.plan.ops))
        refused = self.ledger.register(prog)
        assert slotted and refused is None, (prog.pid, refused)
        for dev in prog.plan.ops:
            if enqueue:
                self.streams[dev].enqueue(prog.pid)
            else:
                self.streams[dev].wake()

    def _count_reads(self, prog: HostProgram, sign: int) -> None:
        """Declare (+1) or withdraw (-1) the reads the program's ops will make of their inputs."""
        for dev, ops in prog.plan.ops.items():
            for op in ops:
                refs = op.inputs if isinstance(op, KernelOp) else (
                    (op.input,) if isinstance(op, ReshardOp) and op.input is not None else ()
                )
                for ref in refs:
                    if sign > 0:
                        self.store.declare(prog.resolve(ref), dev, consumers=1, client=prog.client)
                    else:
                        self.store.release(prog.resolve(ref), dev, consumers=1)

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

    def device_done(self, pid: str, device: int) -> None:
        """A device popped ``pid`` (device thread); the last one ends it on this host."""
        if self.ledger.device_done(pid, device):
            self.mailbox.finish_program(pid)
            self.reassembly.drop(pid)
            self.loop.call_soon_threadsafe(self._ended, pid)

    def _ended(self, pid: str) -> None:
        """``pid`` has ended on this host (event loop): the scheduler learns it, waiters wake."""
        self._send_scheduler({"op": "pathdask-program-done", "pid": pid})
        for fut in self._program_waiters.pop(pid, ()):
            resolve(fut)
        self._wake_idle()

    def _send_scheduler(self, msg: dict[str, Any]) -> None:
        """A one-way message on the worker's stream to the scheduler, sent at once
        (``streams.py``).

        ``batched_stream.comm`` is Dask's private state: it tells whether the
        stream is up, which ``BatchedSend.send`` does not.
        """
        assert self.worker is not None
        comm = self.worker.batched_stream.comm
        if comm is not None and not comm.closed():
            self.worker.batched_stream.send(msg)
            flush(self.worker.batched_stream)

    # -- data plane: exchange ----------------------------------------------------
    def exchange(
        self, pid: str, gang: int, seq: int, me: DeviceInfo,
        sends: dict[DeviceInfo, np.ndarray], sources: set[int],
    ) -> dict[int, np.ndarray]:
        """A collective's exchange: send pieces now, wait for those from ``sources`` (device thread)."""
        return self.move(pid, gang, seq, me, sends, sources)[0]

    def move(
        self, pid: str, gang: int, seq: int, me: DeviceInfo,
        sends: dict[DeviceInfo, np.ndarray], sources: set[int], *,
        start: float | None = None, scale: float = 1.0,
    ) -> tuple[dict[int, np.ndarray], float]:
        """Send pieces to devices and wait for the pieces from ``sources`` (device thread).

        ``start`` is when the pieces are modelled to leave (default: now); each is stamped
        with the time its sender's port lets it go and ``scale``, the modelled bytes per real
        byte (``links.py``); the receiver books its port as the piece comes. Returns the
        pieces and when the last one is modelled to have arrived. If the pieces really
        came later (this machine's overhead, not the modelled system's), the next gang
        still starts from the modelled time, as back-to-back gangs do (``execute.run_op``).
        """
        now = time.perf_counter()
        start = now if start is None else start
        stream = self.streams[me.id]
        remote: dict[str, list[Piece]] = defaultdict(list)
        local: list[Piece] = []
        for dst, value in sends.items():
            key = (pid, gang, seq, dst.id)
            if dst.id != me.id:
                stream.bytes_out += value.nbytes
            stamp = (self.links.depart(me, dst, value.nbytes, start, scale), scale)
            (local if dst.address == self.address else remote[dst.address]).append((key, me.id, value, stamp))
        if local:
            self._deliver(local)
        driver = current_driver()
        if driver is None:
            self._flush(remote)
        elif remote:  # with the host's other devices' pieces for the same peers, once they ran
            driver.defer(remote)
            driver.pause()
        if not sources:
            return {}, start
        sent = time.perf_counter()
        got = self.mailbox.collect((pid, gang, seq, me.id), sources)
        stream.exchanges += 1
        stream.exchange_wait_s += time.perf_counter() - sent
        deadline = start
        values = {}
        for src, (value, arrival) in got.items():
            values[src] = value
            if src != me.id:
                stream.bytes_in += value.nbytes
            deadline = max(deadline, arrival)
        wait_until(deadline, lambda: self.mailbox.check(pid, gang))
        return values, deadline

    def _send_pieces(self, addr: str, pieces: list[Piece]) -> None:
        """Small pieces go in one message; each large one streams in chunks (``chunks.py``)."""
        small = [(k, s, contiguous(v), r) for k, s, v, r in pieces if v.nbytes <= self.chunk]
        if small:
            self.peers.send(addr, "xfer", small)
        for key, src, value, stamp in pieces:
            if value.nbytes > self.chunk:
                for offset, data in split(value, self.chunk):
                    self.peers.send_chunk(addr, (key, src, value.shape, value.dtype.str, offset, stamp), data)

    def _flush(self, outbox: dict[str, list[Piece]]) -> None:
        """Send pieces by peer address (device thread: a failure fails the sender's gang)."""
        for addr, pieces in outbox.items():
            self._send_pieces(addr, pieces)

    def _flush_deferred(self, outbox: dict[str, list[Piece]]) -> None:
        """The driver sends what its devices deferred. A peer that cannot be reached fails the
        gangs whose pieces were for it, as it would have failed their senders' gangs."""
        for addr, pieces in outbox.items():
            try:
                self._send_pieces(addr, pieces)
            except Exception as e:  # noqa: BLE001 - contained to those gangs
                for pid, gang in dict.fromkeys((key[0], key[1]) for key, *_ in pieces):
                    prog = self.ledger.get(pid)
                    if prog is not None:
                        self.abort_gang(prog, prog.plan.gangs[gang], e)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "xfer":
            self.on_xfer(message[1])
        elif message[0] == "chunk":
            meta = message[1]
            piece = self.reassembly.landed(meta, message[2])
            if piece is not None:
                self._deliver([(meta[0], meta[1], piece, meta[5])])
        elif message[0] == "abort":
            self.on_abort(*message[1:])

    def on_xfer(self, pieces: list[Any]) -> None:
        self._deliver([(tuple(key), src, value, stamp) for key, src, value, stamp in pieces])

    def _deliver(self, pieces: list[Piece]) -> None:
        """Pieces are here: their receiving ports are booked now, in the order they came, and
        the mailbox holds them with their modelled arrivals."""
        arrived = [(key, src, value, self.links.arrival(src, self.devices[key[3]], value.nbytes, *stamp))
                   for key, src, value, stamp in pieces]
        for mismatch in self.mailbox.deliver(arrived):  # a destination returned without this collective
            self.abort(mismatch.key[0], mismatch.key[1], mismatch.hosts, mismatch.error())

    def close_gang(self, pid: str, gang: GangSpec, device: int, collectives: int) -> None:
        """``device``'s body of ``gang`` returned after ``collectives`` collectives (device thread)."""
        mismatch = self.mailbox.close_gang(pid, gang.index, device, collectives, gang.name, gang.hosts)
        if mismatch is not None:
            raise mismatch.error()

    # -- failures and cancellation ----------------------------------------------
    def abort_gang(self, prog: HostProgram, gang: GangSpec, cause: BaseException) -> None:
        """A member of ``gang`` failed: wake every member, here and on other hosts."""
        self.abort(prog.pid, gang.index, gang.hosts, cause)

    def abort(self, pid: str, gang: int, hosts: Iterable[str], cause: BaseException) -> None:
        self.mailbox.abort_gang(pid, gang, cause)
        for addr in set(hosts) - {self.address}:  # ``peers.send`` skips hosts known to be lost
            try:
                self.peers.send(addr, "abort", pid, gang, _picklable(cause))
            except Exception:  # the peer is gone: it has nothing to wake
                logger.warning("pathdask: could not tell host %s that gang %d of %s failed", addr, gang, pid)

    def on_abort(self, pid: str, gang: int, cause: BaseException) -> None:
        self.mailbox.abort_gang(pid, gang, cause)

    def drop_program(self, pid: str, cause: BaseException) -> None:
        """Drop a program (event loop): its gangs abort, its buffers are freed, its devices move on.

        A slotted program stays in its devices' order and each device pops it,
        so it still ends here; one that is not slotted here is undone at once.
        """
        unslotted = self.ledger.drop(pid, cause)
        self.plans.discard(pid)  # a put dropped before its dispatch: its blocks go now
        with self._gates_lock:
            gates = [self._gates.pop(k) for k in [k for k in self._gates if k[0] == pid]]
        for done in gates:
            done.set()
        self.mailbox.drop_program(pid, cause)
        self.store.drop_program(pid, cause)
        if unslotted is not None:
            self._count_reads(unslotted, -1)
        for s in self.streams.values():
            s.wake()
        self._wake_idle()

    def on_drop_programs(self, pids: list[str], reason: str, host: str | None = None,
                         cause: BaseException | None = None) -> None:
        """Programs that can no longer run everywhere (a lost host, a failed dispatch) end here too."""
        if host is not None:
            self.peers.mark_lost(host)
        if not isinstance(cause, BaseException):
            cause = DeviceLostError(reason) if host is not None else DispatchError(reason)
        for pid in pids:
            self.drop_program(pid, cause)

    def drop_client(self, client: str, cause: BaseException | None = None) -> None:
        """Drop every program of a client that has gone away, and refuse its late ones."""
        cause = cause or GangAbortedError(f"client {client} closed or was lost; its programs were dropped")
        for pid in self.ledger.close_client(client, cause):
            self.drop_program(pid, cause)
        self.plans.drop_client(client)

    # -- observation -------------------------------------------------------------
    def account(self, device: int, seconds: float) -> None:
        self.streams[device].busy_s += seconds

    async def fetch(self, buffers: list[tuple[str, int, int]]) -> dict[str, Any]:
        """The values of program buffers on this host, once computed (client ``.result()``).

        A failed program is an answer, not a handler error: ``{"error": ...}`` carries the
        exception (``error_message``) for the client to raise, and nothing is logged here.
        """
        try:
            out = []
            for pid, vid, dev in buffers:
                self._raise_if_dropped(pid)
                out.append(encode_block(await self.store.wait_value((pid, vid), dev)))
            return {"values": out}
        except Exception as e:
            return {"error": error_message(e)}

    def serve(self, request: tuple[str, Any], gone: Callable[[], bool]) -> tuple[str, Any]:
        """A client's request on the socket transport (its receiver thread; ``client/fetch.py``):
        ``("fetch", buffers)`` is answered ``("values", arrays)`` once they are computed, or
        ``("error", exception)`` with the error that ended their program."""
        kind, buffers = request
        if kind != "fetch":
            return ("error", ValueError(f"unknown request {kind!r}; expected 'fetch'"))
        try:
            out = []
            for pid, vid, dev in buffers:
                self._raise_if_dropped(pid)
                out.append(self.store.value((pid, vid), dev, gone))
            return ("values", out)
        except Exception as e:  # noqa: BLE001 - the client raises it
            return ("error", _picklable(e))

    def _raise_if_dropped(self, pid: str) -> None:
        cause = self.ledger.dropped(pid)
        if cause is not None:
            raise cause

    def status(self, buffers: list[tuple[str, int, int]]) -> list[str]:
        """Per buffer ``pending``, ``ready`` or ``error``, without waiting."""
        return ["error" if self.ledger.dropped(pid) is not None else self.store.state((pid, vid), dev)
                for pid, vid, dev in buffers]

    def stats(self) -> dict[str, Any]:
        return host_stats(self)

    def diagnose(self) -> dict[str, Any]:
        return diagnose(self)

    def timeline(self, since: float = 0.0) -> dict[int, list[tuple[float, float, str, str, str]]]:
        """Per device, (start, end, program, gang, client) of recent gangs started after ``since``."""
        return {d: s.timeline_since(since) for d, s in self.streams.items()}

    def activity(self, cursors: dict[str, list[tuple[int, int]]], limit: int) -> dict[str, Any]:
        """New gangs since the scheduler's cursors, with memory and link bytes (the dashboard)."""
        return activity(self, cursors, limit)

    def transfers(self) -> list[tuple[float, float, int, int, str, int]]:
        """The modelled transfers that arrived here (start, end, src, dst, link, bytes), wall-clock."""
        offset = time.time() - time.perf_counter()
        return [(t.start + offset, t.end + offset, *t[2:]) for t in self.links.recent()]

    def reset_observations(self) -> None:
        """Forget recorded gaps, timelines and transfers (benchmarks call this between runs)."""
        for s in self.streams.values():
            s.reset_observations()
        self.links.reset()

    def _is_idle(self) -> bool:
        return self.ledger.idle() and not any(s.pending or s.head for s in self.streams.values())

    async def wait_idle(self) -> dict[str, Any]:
        """Wait until this host holds no buffers and runs no program; return its stats."""
        while True:
            await self.store.wait_empty()
            if self._is_idle():
                return self.stats()
            fut = self.loop.create_future()
            self._idle_waiters.append(fut)
            await fut

    def _wake_idle(self) -> None:
        """Let ``wait_idle`` look again (event loop)."""
        waiters, self._idle_waiters = self._idle_waiters, []
        for fut in waiters:
            resolve(fut)


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


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
