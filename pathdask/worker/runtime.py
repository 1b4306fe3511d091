"""``HostRuntime``: the worker plugin that is one Pathways host.

It owns the host's device streams, its buffer store, its mailbox and link
model, and the one-way comms to its peer hosts. It is installed by the
scheduler plugin under the name ``"pathdask"``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
from dask.utils import parse_timedelta
from distributed import WorkerPlugin
from distributed.protocol import to_serialize

from ..errors import DeviceLostError, GangAbortedError
from ..ops import BufferKey, GangSpec, HostPlan, KernelOp, Ref, ReshardOp
from ..topology import DeviceInfo, Topology
from .device import DeviceStream
from .futures import resolve
from .peers import Peers
from .store import BufferStore
from .transfer import LinkModel, Mailbox, wait_until

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("pathdask.worker")

PLAN_CACHE = 4096  # plans a host keeps, least recently used first out


@dataclass
class HostProgram:
    """A program as registered on one host; ``check`` tells whether a gang was aborted."""

    pid: str
    plan: HostPlan
    inputs: tuple[BufferKey, ...]
    client: str
    mailbox: Mailbox
    remaining: set[int] = field(default_factory=set)
    #: sequential dispatch: gangs whose Dask task has released them (None: all are)
    released: set[int] | None = None
    done: set[tuple[int, int]] = field(default_factory=set)  # (device, gang) finished

    def resolve(self, ref: Ref) -> BufferKey:
        if ref.kind == "in":
            src = self.inputs[ref.index]
            return (src[0], int(src[1]))
        return (self.pid, ref.index)

    def check(self, gang: int) -> BaseException | None:
        return self.mailbox.check(self.pid, gang)


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
            await worker.scheduler.pathdask_host_failed(address=worker.address, error=f"{type(e).__name__}: {e}")
            raise

    async def _setup(self, worker: Worker) -> None:
        self.worker = worker
        self.address = worker.address
        self.loop = asyncio.get_running_loop()
        # before registering: a bad transport setting must not take a host
        self.peers = Peers(worker, self.loop, dask.config.get("pathdask.transport"), self._on_message)
        requested = dask.config.get("pathdask.worker.host", None)
        if requested is None and isinstance(worker.name, int):
            requested = worker.name
        reply = await worker.scheduler.pathdask_register_host(
            address=worker.address, requested=requested
        )
        self.topology = Topology.from_dict(reply["topology"])
        self.island, self.host = reply["island"], reply["host"]
        self.ordering: bool = reply["ordering"]
        self.jitter: float = reply["dispatch_jitter"]
        self.devices: dict[int, DeviceInfo] = {
            d.id: DeviceInfo(d.id, d.island, d.host, d.index, worker.address)
            for d in self.topology.devices_of_host(self.island, self.host)
        }
        self.store = BufferStore({d: self.topology.hbm for d in self.devices}, self.loop,
                                 parse_timedelta(dask.config.get("pathdask.allocation-timeout")))
        self.mailbox = Mailbox(parse_timedelta(dask.config.get("pathdask.collective-timeout")))
        self.links = LinkModel(self.topology)
        self.programs: dict[str, HostProgram] = {}
        self.dropped: dict[str, BaseException] = {}
        self.order_clients: dict[str, str] = {}
        #: (program, output index) -> (value id, device) pairs its Dask key owns here
        self.owned: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        self.lock = threading.Lock()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._op_waiters: dict[tuple[str, int, int], threading.Event] = {}
        self.plans: OrderedDict[str, HostPlan] = OrderedDict()  # plan id -> plan, LRU
        self._plan_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._program_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self.streams = {d: DeviceStream(self, info) for d, info in self.devices.items()}
        worker.handlers.update(
            pathdask_stream=self.peers.handle_stream,
            pathdask_fetch=self.fetch,
            pathdask_stats=self.stats,
            pathdask_wait_idle=self.wait_idle,
            pathdask_timeline=self.timeline,
            pathdask_reset_observations=self.reset_observations,
            pathdask_transport=lambda: self.peers.address,
        )
        worker.stream_handlers.update({
            "pathdask-order": self.on_order,
            "pathdask-xfer": self.on_xfer,
            "pathdask-abort": self.on_abort,
            "pathdask-drop-client": self.drop_client,
            "pathdask-release-outputs": self.on_release_outputs,
            "pathdask-drop-programs": self.on_drop_programs,
        })
        for s in self.streams.values():
            s.start()
        logger.info("pathdask host i%d h%d up with devices %s", self.island, self.host, list(self.devices))

    async def teardown(self, worker: Worker) -> None:
        if not hasattr(self, "streams"):  # setup failed before the devices started
            if hasattr(self, "peers"):
                await self.peers.close()
            return
        cause = GangAbortedError(f"host {worker.address} is shutting down")
        for pid in list(self.programs):
            self.drop_program(pid, cause)
        for s in self.streams.values():
            s.close()
        for s in self.streams.values():
            await asyncio.to_thread(s.thread.join, 5)
        await self.peers.close()

    def on_release_outputs(self, outputs: list[tuple[str, int]]) -> None:
        """The scheduler forgot these output keys: no client holds them any more."""
        for pid, index in outputs:
            self.release_output(pid, index)

    def release_output(self, pid: str, index: int) -> None:
        """Drop the ownership of output ``index`` of ``pid`` on this host."""
        for vid, dev in self.owned.pop((pid, index), ()):
            self.store.release((pid, vid), dev)

    # -- control: order and dispatch ---------------------------------------
    def on_order(self, programs: list[tuple[str, str, list[int]]]) -> None:
        """Order message from the scheduler: these programs, in slot order, use these devices."""
        for pid, client, devices in programs:
            self.order_clients[pid] = client
            if not self.ordering:
                continue
            for d in devices:
                if pid in self.dropped:
                    break
                self.streams[d].enqueue(pid)

    async def plan(self, plan: HostPlan | str) -> HostPlan:
        """Cache a plan that came with a dispatch, or find the cached plan of an id."""
        if isinstance(plan, HostPlan):
            if not plan.id:
                return plan
            self.plans[plan.id] = plan
            self.plans.move_to_end(plan.id)
            while len(self.plans) > PLAN_CACHE:
                self.plans.popitem(last=False)
            for fut in self._plan_waiters.pop(plan.id, ()):
                resolve(fut)
            return plan
        found = self.plans.get(plan)
        if found is None:
            # The call that brings the plan may still be on its way (tasks can overtake).
            fut = self.loop.create_future()
            self._plan_waiters.setdefault(plan, []).append(fut)
            try:
                await asyncio.wait_for(fut, 30)
            except TimeoutError:
                raise RuntimeError(
                    f"Host {self.address} has no cached plan {plan}: it was evicted (more than "
                    f"{PLAN_CACHE} programs) or this worker restarted. Create a new client"
                ) from None
            found = self.plans[plan]
        self.plans.move_to_end(plan)
        return found

    async def dispatch(self, pid: str, plan: HostPlan, inputs: tuple[BufferKey, ...], client: str,
                       gated: bool = False) -> str:
        """Register this host's part of a program; returns at once, before execution."""
        if self.jitter:
            await asyncio.sleep(random.uniform(0, self.jitter))  # test-only: reorder arrivals
        self.register(pid, plan, inputs, client, gated=gated, enqueue=not self.ordering)
        return pid

    def register(self, pid: str, plan: HostPlan, inputs: tuple[BufferKey, ...], client: str, *,
                 gated: bool = False, enqueue: bool = False) -> None:
        """Count the program's readers and owners in the store, then hand it to the devices.

        ``gated``: each gang waits for its sequential-dispatch task to release it.
        ``enqueue``: the devices take it in arrival order (multi-controller runs and
        the test-only unordered mode) instead of waiting for the scheduler's order.
        """
        if pid in self.dropped:
            return
        prog = HostProgram(pid, plan, tuple(inputs), client, self.mailbox, set(plan.ops),
                           released=set() if gated else None)
        store = self.store
        for dev, ops in plan.ops.items():
            for op in ops:
                refs = op.inputs if isinstance(op, KernelOp) else (
                    (op.input,) if isinstance(op, ReshardOp) and op.input is not None else ()
                )
                for ref in refs:
                    store.declare(prog.resolve(ref), dev, consumers=1)
        for k, pairs in plan.owned.items():
            for vid, dev in pairs:
                store.declare((pid, vid), dev, owned=True)
            self.owned[(pid, k)] = pairs
        with self.lock:
            self.programs[pid] = prog
        for dev in plan.ops:
            if enqueue:
                self.streams[dev].enqueue(pid)
            else:
                self.streams[dev].wake()

    def release_gang(self, pid: str, gang: int, device: int) -> threading.Event:
        """Sequential dispatch: let one gang run on one device; the event is set once it ran."""
        done = threading.Event()
        prog = self.programs.get(pid)
        if prog is None or prog.released is None:
            done.set()  # dropped, or already finished
            return done
        with self.streams[device].cond:
            self._op_waiters[(pid, device, gang)] = done
            prog.released.add(gang)
            self.streams[device].cond.notify_all()
            if (device, gang) in prog.done or prog.check(gang) is not None:
                done.set()
        return done

    def gang_done(self, prog: HostProgram, device: int, gang: int) -> None:
        """Called by a device stream after each op of a gated program."""
        with self.streams[device].cond:
            prog.done.add((device, gang))
            done = self._op_waiters.pop((prog.pid, device, gang), None)
        if done is not None:
            done.set()

    async def wait_program(self, pid: str) -> None:
        """Wait until this host's devices have run every op of ``pid``."""
        if pid not in self.programs:
            return
        fut = self.loop.create_future()
        self._program_waiters.setdefault(pid, []).append(fut)
        if pid not in self.programs:
            fut.set_result(None)
        await fut

    def is_dispatched(self, pid: str, device: int) -> bool:
        return pid in self.programs or pid in self.dropped

    def device_done(self, pid: str, device: int) -> None:
        with self.lock:
            prog = self.programs.get(pid)
            finished = prog is not None and not (prog.remaining - {device})
            if prog is not None:
                prog.remaining.discard(device)
            if finished:
                del self.programs[pid]
                self.order_clients.pop(pid, None)
        if finished:
            self.loop.call_soon_threadsafe(self._report_done, pid)
            self.mailbox.finish_program(pid)
            for fut in self._program_waiters.pop(pid, ()):
                self.loop.call_soon_threadsafe(resolve, fut)
        if self._idle_waiters and self._is_idle():
            self.loop.call_soon_threadsafe(self._wake_idle)

    def _report_done(self, pid: str) -> None:
        assert self.worker is not None
        if self.worker.batched_stream.comm is not None and not self.worker.batched_stream.comm.closed():
            self.worker.batched_stream.send({"op": "pathdask-program-done", "pid": pid})

    def _is_idle(self) -> bool:
        return not self.programs and not any(s.order or s.running for s in self.streams.values())

    # -- data plane: exchange ----------------------------------------------------
    def exchange(
        self, pid: str, gang: int, seq: int, me: DeviceInfo,
        sends: dict[DeviceInfo, np.ndarray], sources: set[int],
    ) -> dict[int, np.ndarray]:
        """Send pieces to devices and wait for the pieces from ``sources`` (device thread)."""
        start = time.perf_counter()
        remote: dict[str, list[tuple[tuple[str, int, int, int], int, Any]]] = defaultdict(list)
        for dst, value in sends.items():
            key = (pid, gang, seq, dst.id)
            if dst.address == self.address:
                self.mailbox.deliver(key, me.id, value)
            else:
                remote[dst.address].append((key, me.id, value))
        for addr, pieces in remote.items():
            self.peers.send(addr, "xfer", pieces)
        sent = time.perf_counter()
        got = self.mailbox.collect((pid, gang, seq, me.id), sources)
        stream = self.streams[me.id]
        stream.exchanges += 1
        stream.exchange_wait_s += time.perf_counter() - sent
        deadline = start
        for src, value in got.items():
            arrival = self.links.arrival(src, me, value.nbytes, start)
            deadline = max(deadline, arrival)
        wait_until(deadline, lambda: self.mailbox.check(pid, gang))
        return got

    def _on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "xfer":
            self.on_xfer(message[1])
        elif message[0] == "abort":
            self.on_abort(*message[1:])

    def on_xfer(self, pieces: list[Any]) -> None:
        for key, src, value in pieces:
            self.mailbox.deliver(tuple(key), src, value)  # type: ignore[arg-type]

    # -- failures and cancellation ----------------------------------------------
    def abort_gang(self, prog: HostProgram, gang: GangSpec, cause: BaseException) -> None:
        """A member of ``gang`` failed: wake every member, here and on other hosts."""
        self.mailbox.abort_gang(prog.pid, gang.index, cause)
        for addr in {m.address for m in gang.members} - {self.address} - self.peers.lost:
            try:
                self.peers.send(addr, "abort", prog.pid, gang.index, _picklable(cause))
            except Exception:  # the peer is gone: it has nothing to wake
                logger.warning("pathdask: could not tell host %s that gang %s failed", addr, gang.name)

    def on_abort(self, pid: str, gang: int, cause: BaseException) -> None:
        self.mailbox.abort_gang(pid, gang, cause)

    def drop_program(self, pid: str, cause: BaseException) -> None:
        """Drop a program: its gangs abort, its buffers are freed, its devices move on."""
        self.dropped[pid] = cause
        for key in [k for k in self._op_waiters if k[0] == pid]:
            self._op_waiters.pop(key).set()
        self.mailbox.drop_program(pid, cause)
        self.store.drop_program(pid, cause)
        for s in self.streams.values():
            s.wake()

    def on_drop_programs(self, pids: list[str], reason: str, host: str | None = None) -> None:
        """Programs that used a lost host fail here too, so that nothing waits for it."""
        if host is not None:
            self.peers.lost.add(host)
        for pid in pids:
            self.drop_program(pid, DeviceLostError(reason))

    def drop_client(self, client: str) -> None:
        """Drop every pending program of a client that has gone away."""
        cause = GangAbortedError(f"client {client} closed or was lost; its programs were dropped")
        with self.lock:
            pids = {p for p, prog in self.programs.items() if prog.client == client}
        pids |= {p for p, c in self.order_clients.items() if c == client}
        for pid in pids:
            self.drop_program(pid, cause)

    # -- observation -------------------------------------------------------------
    def account(self, device: int, seconds: float) -> None:
        self.streams[device].busy_s += seconds

    async def fetch(self, buffers: list[tuple[str, int, int]]) -> list[Any]:
        """The values of program buffers on this host, once computed (client ``.result()``)."""
        out = []
        for pid, vid, dev in buffers:
            if pid in self.dropped:
                raise self.dropped[pid]
            out.append(to_serialize(await self.store.wait_value((pid, vid), dev)))
        return out

    def stats(self) -> dict[str, Any]:
        mem = self.store.stats()
        devices = {}
        for d, s in self.streams.items():
            devices[d] = {
                **mem[d],
                "island": self.island,
                "host": self.host,
                "index": self.devices[d].index,
                "address": self.address,
                "busy_s": s.busy_s,
                "gangs_run": s.gangs_run,
                "exchanges": s.exchanges,
                "exchange_wait_s": s.exchange_wait_s,
                "pending_programs": s.pending,
                "idle_gaps": len(s.gaps),
                "idle_gap_median_s": float(np.median(s.gaps)) if s.gaps else None,
            }
        return {
            "devices": devices,
            "links": self.links.stats(),
            "programs": len(self.programs),
            "mailbox": self.mailbox.pending(),
        }

    def timeline(self, since: float = 0.0) -> dict[int, list[tuple[float, float, str, str, str]]]:
        """Per device, (start, end, program, gang, client) of recent gangs started after ``since``."""
        return {d: [t for t in s.timeline if t[0] >= since] for d, s in self.streams.items()}

    def reset_observations(self) -> None:
        """Forget recorded gaps and timelines (benchmarks call this between runs)."""
        for s in self.streams.values():
            s.gaps.clear()
            s.timeline.clear()

    async def wait_idle(self) -> dict[str, Any]:
        """Wait until this host holds no buffers and runs no program; return its stats."""
        while True:
            await self.store.wait_empty()
            if self._is_idle():
                return self.stats()
            fut = self.loop.create_future()
            self._idle_waiters.append(fut)
            if self._is_idle():
                fut.set_result(None)
            await fut

    def _wake_idle(self) -> None:
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
