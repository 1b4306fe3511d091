"""``PathwaysScheduler``: the scheduler plugin, registered under the name ``"pathdask"``.

It holds the resource manager and the island scheduler, installs the
:class:`~pathdask.worker.runtime.HostRuntime` worker plugin on every worker,
and serves the ``pathdask_*`` handlers. Programs are slotted in its
``update_graph`` hook, from the ``pathdask`` annotation of their graph.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import dask
from dask.utils import parse_timedelta
from distributed import SchedulerPlugin
from distributed.core import clean_exception, error_message
from distributed.protocol import Serialized, deserialize, to_serialize
from distributed.protocol.pickle import dumps

from ..errors import DeviceLostError, DispatchError
from ..ops import as_key, dispatched_program
from ..streams import flush
from ..topology import Topology
from ..worker.links import add_stats
from ..worker.peers import TOKEN_BYTES
from .calls import CALL_SLICE, call_keys, create_outputs, supported
from .interruptions import TOPIC, Interruptions
from .order import IslandScheduler, Submission, make_policy
from .resources import ResourceManager

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("pathdask.scheduler")

HANDLERS = (
    "pathdask_register_host",
    "pathdask_transport_of",
    "pathdask_hosts_gone",
    "pathdask_host_failed",
    "pathdask_register_client",
    "pathdask_info",
    "pathdask_mesh",
    "pathdask_release_slice",
    "pathdask_stats",
    "pathdask_diagnose",
    "pathdask_wait_hosts",
    "pathdask_host_leaving",
    "pathdask_suspend_on_interruption",
    "pathdask_suspended",
    "pathdask_wait_host_gone",
    "pathdask_wait_idle",
    "pathdask_timeline",
    "pathdask_reset_observations",
    "pathdask_trace",
    "pathdask_transfers",
)


class PathwaysScheduler(SchedulerPlugin):
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

    async def start(self, scheduler: Scheduler) -> None:
        from ..dashboard import Collector, install
        from ..worker.runtime import HostRuntime

        self.scheduler = scheduler
        self.resources = ResourceManager(self.topology)
        self.interruptions = Interruptions(scheduler, self.resources)
        #: address -> the suspend its retirement started (``log_event``)
        self.leaving: dict[str, asyncio.Future[list[str]]] = {}
        self._leaving_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Future[Any]] = set()  # background work, held until done
        self.order = IslandScheduler(self.policy)
        self.clients: dict[str, dict[str, Any]] = {}
        self.hosts_changed = asyncio.Condition()
        self.host_failures: dict[str, dict[str, Any]] = {}  # address -> error_message
        #: output key -> (address of the host it owns buffers on, program, output index)
        self.output_owners: dict[Any, tuple[str, str, int]] = {}
        #: the secret hosts present to each other on the socket transport (sent over Dask comms)
        self.transport_token = secrets.token_bytes(TOKEN_BYTES)
        #: host address -> where its socket transport listens, as the host reported it (hosts
        #: in the cluster only: a host that leaves or fails to start is taken out)
        self.transports: dict[str, str] = {}
        self.progress = asyncio.Event()  # set whenever the order changed (programs slotted or ended)
        #: the record of device activity that the dashboard and traces read
        self.activity = Collector(self._ask_quietly)
        for name in HANDLERS:
            scheduler.handlers[name] = getattr(self, name[len("pathdask_"):])
        scheduler.stream_handlers["pathdask-program-done"] = self.program_done
        scheduler.stream_handlers["pathdask-call"] = self.call
        scheduler.stream_handlers["pathdask-dispatch-failed"] = self.dispatch_failed
        await scheduler.register_worker_plugin(
            None, dumps(HostRuntime()), name="pathdask", idempotent=False
        )
        self.activity.start()
        install(scheduler)

    async def before_close(self) -> None:
        if hasattr(self, "activity"):
            self.activity.stop()

    close = before_close

    # -- planned interruptions (``interruptions.py``) ---------------------------------
    async def host_leaving(self, address: str) -> list[str]:
        """A host's runtime is closing: its opted-in clients suspend first (the same suspend
        as the one its retirement started, if it is retiring)."""
        leaving = self.leaving.get(address)
        if leaving is None:
            return await self.interruptions.host_leaving(address)
        return list(await asyncio.shield(leaving))

    def log_event(self, topic: str, msg: Any) -> None:
        """Dask's event hook: a host going to ``closing_gracefully`` (``retire_workers``)
        starts its clients' suspend now, while its buffers are all still there."""
        if (isinstance(msg, dict) and msg.get("action") == "worker-status-change"
                and msg.get("status") == "closing_gracefully" and topic in self.resources.hosts
                and topic not in self.leaving):
            self.leaving[topic] = asyncio.ensure_future(self.interruptions.host_leaving(topic))

    def suspend_on_interruption(self, client: str) -> None:
        # Subscribe here too: the client's own subscription travels on its batched stream and
        # may arrive after a host starts leaving; once this RPC answers, the event will reach it.
        self.scheduler.subscribe_topic(TOPIC, client)
        self.interruptions.opt_in(client)

    async def suspended(self, client: str, host: str, error: Any = None) -> None:
        await self.interruptions.suspended(client, host, error)

    # -- hosts ---------------------------------------------------------------
    async def register_host(self, address: str, requested: int | None = None,
                            transport: str | None = None) -> dict[str, Any]:
        """A host runtime starts. Every other host learns where its socket ``transport``
        listens, on its stream and so before any program that uses it; the reply gives the
        host the others' (and the secret they present to each other)."""
        rec = self.resources.add_host(address, requested)
        if transport is None:
            self.transports.pop(address, None)
        else:  # a host restarted on its old address has a new one
            self.transports[address] = transport
        self._tell_all({"op": "pathdask-host-joined", "host": address, "transport": transport}, but=address)
        await self._hosts_changed()
        logger.info("pathdask: %s is island %d host %d", address, rec.island, rec.host)
        return {
            "topology": self.topology.to_dict(),
            "island": rec.island,
            "host": rec.host,
            "ordering": self.ordering,
            "dispatch_jitter": self.dispatch_jitter,
            "transport_token": self.transport_token,
            "transports": {a: t for a, t in self.transports.items() if a != address},
        }

    def transport_of(self, host: str) -> str | None:
        """Where ``host``'s socket transport listens; ``None`` if it left (or has none)."""
        return self.transports.get(host) if host in self.resources.hosts else None

    def hosts_gone(self, hosts: list[str]) -> list[str]:
        """Which of ``hosts`` are not (or no longer) in the cluster."""
        return [h for h in hosts if h not in self.resources.hosts]

    async def host_failed(self, address: str, error: dict[str, Any]) -> None:
        """A worker's host runtime could not start; waiters learn it at once, with its error."""
        logger.error("pathdask: the host runtime on %s failed to start: %s", address, error.get("exception_text"))
        self.resources.remove_host(address)
        self.transports.pop(address, None)
        self.host_failures[address] = error
        await self._hosts_changed()

    async def wait_hosts(self, n: int | None = None, timeout: Any = "30s") -> int:
        """Wait until ``n`` hosts (default: all of the topology) have registered."""
        n = self.topology.num_hosts if n is None else n
        seconds = parse_timedelta(timeout)
        async with self.hosts_changed:
            try:
                await asyncio.wait_for(
                    self.hosts_changed.wait_for(
                        lambda: len(self.resources.hosts) >= n or bool(self.host_failures)
                    ),
                    seconds,
                )
            except TimeoutError:
                raise TimeoutError(
                    f"Only {len(self.resources.hosts)} of {n} pathdask hosts registered within "
                    f"{seconds:g}s; check that every worker runs the pathdask preload"
                ) from None
        for address, error in self.host_failures.items():
            # the scheduler does not deserialize what handlers receive: unpack it here
            error = {k: deserialize(v.header, v.frames) if isinstance(v, Serialized) else v
                     for k, v in error.items()}
            _, exc, tb = clean_exception(**error)
            assert exc is not None
            raise type(exc)(f"The pathdask host runtime on {address} failed to start: {exc}").with_traceback(tb)
        return len(self.resources.hosts)

    async def wait_host_gone(self, address: str) -> None:
        """Return once host ``address`` is not (or no longer) in the cluster."""
        async with self.hosts_changed:
            await self.hosts_changed.wait_for(lambda: address not in self.resources.hosts)

    async def _hosts_changed(self) -> None:
        async with self.hosts_changed:
            self.hosts_changed.notify_all()

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> Any:
        """A host left: the programs that use its devices fail with DeviceLostError everywhere.

        A host that is retiring leaves once its clients have suspended: Dask awaits this.
        """
        leaving = self.leaving.get(worker)
        if leaving is not None:
            return self._remove_after(leaving, scheduler, worker)
        self._remove_host(scheduler, worker)
        return None

    async def _remove_after(self, leaving: asyncio.Future[Any], scheduler: Scheduler, worker: str) -> None:
        for pid in self._stranded(worker):  # fail these now: a suspend must not wait for them
            reason = f"host {worker} retired before program {pid} was dispatched there"
            self._end_program(pid, reason, to_serialize(DeviceLostError(reason)))
        with contextlib.suppress(Exception):
            await asyncio.shield(leaving)
        self.leaving.pop(worker, None)
        self._leaving_locks.pop(worker, None)
        self._remove_host(scheduler, worker)

    def _remove_host(self, scheduler: Scheduler, worker: str) -> None:
        self.transports.pop(worker, None)
        rec = self.resources.remove_host(worker)
        if rec is None:
            return
        asyncio.ensure_future(self._hosts_changed())  # wakes clients waiting on it (wait_host_gone)
        self._tell_all({"op": "pathdask-host-lost", "host": worker})  # its peers stop sending to it
        affected = [s for s in self.order.inflight.values() if worker in s.hosts]
        waiting, slotted = self.order.host_lost(worker)
        affected += waiting
        if affected and scheduler.status.name == "running":
            reason = (f"host {worker} (island {rec.island}, host {rec.host}, devices "
                      f"{[d.id for d in rec.devices]}) left the cluster while this program used it")
            logger.warning("pathdask: %s; failing %d program(s)", reason, len(affected))
            per_host: dict[str, list[str]] = {}
            for s in affected:
                for addr in s.hosts:
                    per_host.setdefault(addr, []).append(s.pid)
            for addr, pids in per_host.items():
                if addr != worker:
                    self._drop(pids, [addr], reason, worker)
        else:
            logger.info("pathdask: host %s left; its devices are gone", worker)
        self._send_orders(slotted)

    # -- clients -------------------------------------------------------------
    def register_client(self, client: str, name: str, weight: float = 1.0) -> dict[str, Any]:
        self.clients[client] = {"name": name, "weight": weight}
        self.activity.record.name_client(client, name)
        # the hosts' transports and their token: the client fetches results there (client/fetch.py)
        return {**self.info(), "calls": supported(self.scheduler), "transport_token": self.transport_token,
                "transports": dict(self.transports)}

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        if client not in self.clients:
            return
        del self.clients[client]
        self._background(self.interruptions.forget(client))
        self.resources.release_client(client)
        self._send_orders(self.order.drop_client(client))
        self._tell_all({"op": "pathdask-drop-client", "client": client})

    def info(self) -> dict[str, Any]:
        return {
            "topology": self.topology.to_dict(),
            "devices": self.resources.describe_devices(),
            "hosts": {a: (h.island, h.host) for a, h in self.resources.hosts.items()},
            "clients": dict(self.clients),
            "order": self.order.info(),
        }

    # -- meshes ----------------------------------------------------------------
    def mesh(self, client: str, shape: dict[str, int], island: int | None = None,
             hints: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            sl, devices = self.resources.allocate(client, shape, island, **(hints or {}))
        except (ValueError, TypeError) as e:  # the user's mistake: answer it typed, no traceback logged
            return {"error": error_message(e)}
        return {"slice": sl.id, "devices": [(d.id, d.island, d.host, d.index, d.address) for d in devices]}

    def release_slice(self, slice_id: str) -> None:
        self.resources.release(slice_id)

    # -- programs --------------------------------------------------------------
    def update_graph(self, scheduler: Scheduler, *, client: str, annotations: dict[str, dict[Any, Any]],
                     **kwargs: Any) -> None:
        """Slot each pathdask program in a new graph, before any of its tasks is sent out.

        The graph's ``pathdask`` annotation carries the program id, the devices it
        uses per host, and which host each output key owns buffers on.
        """
        for info in {a["pid"]: a for a in annotations.get("pathdask", {}).values()}.values():
            self._submit(client, info)

    def _submit(self, client: str, info: dict[str, Any]) -> None:
        """Slot a program from its ``pathdask`` annotation (``lowering._annotation``)."""
        for key, addr, j in info["outputs"]:
            self.output_owners[as_key(key)] = (addr, info["pid"], j)
        sub = Submission(info["pid"], client, info["hosts"], info.get("cost", 0.0),
                         frozenset(info.get("deps", ())))
        gone = sorted(set(sub.hosts) - set(self.resources.hosts))
        if gone:  # planned for a host that has left since: it fails at once, on every live host
            self._drop([sub.pid], [a for a in sub.hosts if a not in gone],
                       f"host(s) {gone} left the cluster before this program was slotted", gone[0])
            return
        weight = self.clients.get(client, {}).get("weight", 1.0)
        self._send_orders(self.order.submit(sub, weight))

    async def call(self, client: str, calls: list[dict[str, Any]]) -> None:
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
        batch: dict[str, list[tuple[Any, ...]]] = defaultdict(list)  # per host, in call order
        until = None
        for call in calls:
            if until is not None and time.perf_counter() >= until:
                self._forward(client, batch)
                await asyncio.sleep(0)  # the dispatches go; the hosts and other streams get a turn
                if client not in self.clients:
                    return
                until = time.perf_counter() + CALL_SLICE
            try:
                self._call(client, call, batch)
            except Exception as e:  # noqa: BLE001 - answered to the client below
                self._forward(client, batch)  # the calls before it reach their hosts before its drop
                self._call_failed(client, call, e)
            until = until if until is not None else time.perf_counter()  # the first call goes alone
        self._forward(client, batch)

    def _forward(self, client: str, batch: dict[str, list[tuple[Any, ...]]]) -> None:
        """Send each host its calls of one message as one message: the host puts all their
        output keys' handles in its data at once."""
        for addr, calls in batch.items():
            self._tell(addr, {"op": "pathdask-dispatch", "client": client, "calls": calls})
        batch.clear()

    def _call(self, client: str, call: dict[str, Any], batch: dict[str, list[tuple[Any, ...]]]) -> None:
        pid = call["pid"]
        gone = sorted(addr for addr, *_ in call["hosts"]
                      if addr not in self.resources.hosts or addr not in self.scheduler.workers)
        if gone:
            raise DeviceLostError(f"host(s) {gone} left the cluster before program {pid} was called; "
                                  "call it again on a new mesh")
        create_outputs(self.scheduler, client, call)
        for addr, plan, outputs in call["hosts"]:
            batch[addr].append((pid, plan, call["inputs"], outputs))
        self._submit(client, {**call["program"],
                              "outputs": [(k, addr, j) for addr, _plan, outs in call["hosts"] for k, j in outs],
                              "deps": sorted({producer for producer, _ in call["inputs"]})})

    def _call_failed(self, client: str, call: dict[str, Any], e: Exception) -> None:
        pid = call["pid"]
        if isinstance(e, DeviceLostError):
            logger.info("pathdask: program %s could not be called: %s", pid, e)
        else:
            logger.exception("pathdask: program %s could not be called", pid)
        keys = call_keys(call)
        for key in keys:
            self.output_owners.pop(key, None)
        made = [k for k in keys if k in self.scheduler.tasks]
        if made:  # the keys it made go again, with no buffers behind them
            self.scheduler.client_releases_keys(keys=made, client=client, stimulus_id=f"pathdask-call-failed-{pid}")
        err = error_message(e)
        for key in keys:
            self.scheduler.report({"op": "task-erred", "key": key, "exception": err["exception"],
                                   "traceback": err["traceback"]}, client=client)
        reason = f"the call of program {pid} failed in the scheduler: {type(e).__name__}: {e}"
        cause = to_serialize(e if isinstance(e, DeviceLostError) else DispatchError(reason))
        if not self._end_program(pid, reason, cause):
            for addr, *_ in call["hosts"]:
                self._tell(addr, {"op": "pathdask-drop-programs", "pids": [pid], "reason": reason, "cause": cause})

    def dispatch_failed(self, worker: str, pid: str, error: str, cause: Any) -> None:
        """A host could not register its part of a called program (stream op from the host):
        the program is dropped on every host it uses, with the host's error."""
        self._end_program(pid, f"the dispatch of program {pid} failed on host {worker}: {error}", cause)

    def _drop(self, pids: list[str], hosts: list[str], reason: str, lost: str) -> None:
        """Tell ``hosts`` to fail ``pids`` with DeviceLostError(``reason``); ``lost`` is the gone host."""
        for addr in hosts:
            self._tell(addr, {"op": "pathdask-drop-programs", "pids": pids, "reason": reason, "host": lost})

    def _tell(self, addr: str, msg: dict[str, Any], now: bool = True) -> bool:
        """Send ``msg`` on the scheduler's stream to host ``addr``; ``False`` if the host is gone.

        It goes at once (``streams.py``), unless ``now`` is false: then it waits, as
        Dask's own messages do, for the next that goes at once or the stream's interval.
        ``stream_comms`` is the scheduler's own table of batched streams to workers;
        ``Scheduler.send_all`` would do, but silently drops messages to a gone worker.
        """
        comm = self.scheduler.stream_comms.get(addr)
        if comm is None:
            if addr in self.leaving and addr in self.resources.hosts:
                # retiring: Dask already closed its stream, but it runs until its clients
                # suspended; messages go by RPC, one at a time, in order
                self._background(self._tell_leaving(addr, msg))
                return True
            return False
        comm.send(msg)
        if now:
            flush(comm)
        return True

    def _background(self, coro: Any) -> None:
        """Run ``coro`` on the event loop, holding a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell_leaving(self, addr: str, msg: dict[str, Any]) -> None:
        async with self._leaving_locks.setdefault(addr, asyncio.Lock()):
            try:
                await self.scheduler.rpc(addr).pathdask_message(msg=msg)
            except Exception as e:  # noqa: BLE001 - it left after all: its removal fails what it held
                logger.info("pathdask: could not tell leaving host %s %s (%s)", addr, msg.get("op"), e)

    def _tell_all(self, msg: dict[str, Any], but: str | None = None) -> None:
        """Send ``msg`` to every live pathdask host (except ``but``)."""
        for addr in list(self.resources.hosts):
            if addr != but:
                self._tell(addr, msg)

    async def _broadcast(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Ask every live pathdask host; a host that dies meanwhile is left out of the replies."""
        return dict(await self.scheduler.broadcast(msg=msg, workers=list(self.resources.hosts), on_error="ignore"))

    async def _ask_quietly(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``_broadcast`` for background pulls: a host that fails to answer (it is leaving, or
        the scheduler is closing) is left out without an error in the log; the next pull asks again."""
        async def ask(addr: str) -> tuple[str, Any]:
            try:
                call = getattr(self.scheduler.rpc(addr), msg["op"])
                return addr, await call(**{k: v for k, v in msg.items() if k != "op"})
            except Exception as e:  # noqa: BLE001
                logger.debug("pathdask: %s did not answer %s: %r", addr, msg["op"], e)
                return addr, None

        return dict(await asyncio.gather(*(ask(a) for a in list(self.resources.hosts))))

    def _send_orders(self, slotted: list[tuple[int, Submission]]) -> None:
        """Tell each host of each newly slotted program where it goes in its devices' order."""
        self.progress.set()
        if not self.ordering:
            return
        per_host: dict[str, list[tuple[str, str, list[int]]]] = {}
        for _slot, sub in slotted:
            for addr, devices in sub.hosts.items():
                per_host.setdefault(addr, []).append((sub.pid, sub.client, devices))
        for addr, programs in per_host.items():
            if not self._tell(addr, {"op": "pathdask-order", "programs": programs}):
                logger.error("pathdask: programs %s use host %s, which is gone", [p for p, *_ in programs], addr)

    def program_done(self, worker: str, pid: str) -> None:
        """A host ran its part of a program (stream op from the workers)."""
        self._send_orders(self.order.host_done(pid, worker))

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Two endings the scheduler sees first.

        - A program's dispatch task failed on one host: the program is dropped on
          every host it uses, with the dispatch's own error, so that no device
          waits for a part that will never come.
        - The scheduler forgot an output key: its host frees the buffers it owned.
          Decided here rather than on the worker, because workers also see
          replicas of a key come and go (dependencies, the active memory manager).
        """
        if finish == "erred":
            self._dispatch_failed(key, kwargs)
            return
        if finish != "forgotten":
            return
        owner = self.output_owners.pop(key, None)
        if owner is None:
            return
        addr, pid, index = owner
        self._tell(addr, {"op": "pathdask-release-outputs", "outputs": [(pid, index)]}, now=False)

    def _dispatch_failed(self, key: Any, info: dict[str, Any]) -> None:
        pid = dispatched_program(key)
        if pid is None:
            return
        if info.get("cause") not in (None, key):
            return  # erred because a dependency did; only the failing task itself ends the program
        text = info.get("exception_text") or "unknown error"
        self._end_program(pid, f"the dispatch of program {pid} failed on host {info.get('worker')}: {text}",
                          info.get("exception"))

    def _end_program(self, pid: str, reason: str, cause: Any) -> bool:
        """Take ``pid`` out of the order and drop it on every host it uses, with ``cause``;
        ``False`` if the order does not hold it (it ended already, or never came)."""
        sub = self.order.fail(pid)
        if sub is None:
            return False
        logger.info("pathdask: %s; dropping it on %s", reason, sorted(sub.hosts))
        for addr in sub.hosts:
            self._tell(addr, {"op": "pathdask-drop-programs", "pids": [pid], "reason": reason, "cause": cause})
        return True

    def _stranded(self, worker: str) -> list[str]:
        """Programs whose dispatch task for ``worker`` had not run when Dask began to remove it:
        Dask took the task off it, so they can never end there."""
        return [pid for ts in self.scheduler.tasks.values()
                if (pid := dispatched_program(ts.key)) is not None
                and ts.state != "memory" and worker in (ts.worker_restrictions or ())]

    # -- observation -------------------------------------------------------------
    async def diagnose(self) -> dict[str, Any]:
        """Per host, each device's state and queue; per client, programs waiting and slotted."""
        replies = await self._broadcast({"op": "pathdask_diagnose"})
        hosts = {a: r for a, r in replies.items() if isinstance(r, dict)}
        counts = self.order.by_client()
        clients = {cid: {**c, **counts.get(cid, {"waiting": 0, "slotted": 0})} for cid, c in self.clients.items()}
        return {"hosts": hosts, "clients": clients,
                "unreachable": sorted(set(self.resources.hosts) - set(hosts))}

    async def stats(self) -> dict[str, Any]:
        replies = await self._broadcast({"op": "pathdask_stats"})
        return _merge(replies)

    async def timeline(self, since: float = 0.0) -> dict[int, list[Any]]:
        """Per device, (start, end, program, gang) of recent gangs, from every host."""
        replies = await self._broadcast({"op": "pathdask_timeline", "since": since})
        out: dict[int, list[Any]] = {}
        for reply in replies.values():
            if isinstance(reply, dict):
                out.update({int(d): v for d, v in reply.items()})
        return dict(sorted(out.items()))

    async def transfers(self) -> list[Any]:
        """Every host's recent modelled transfers (``links.py``), with wall-clock times."""
        replies = await self._broadcast({"op": "pathdask_transfers"})
        return sorted(t for reply in replies.values() if isinstance(reply, (list, tuple)) for t in reply)

    async def reset_observations(self) -> None:
        await self._broadcast({"op": "pathdask_reset_observations"})
        self.activity.record.clear()

    async def trace(self, timeout: Any = "10s") -> dict[str, Any]:
        """Every recorded gang (the dashboard's timeline view), once the programs that were
        slotted when it was asked have ended everywhere, so that their gangs are all in it."""
        from ..dashboard.views import timeline

        deadline = asyncio.get_running_loop().time() + parse_timedelta(timeout)
        running = set(self.order.inflight)
        while running & set(self.order.inflight):
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                break  # a program that does not end: trace what ran so far
        await self.activity.refresh()
        return timeline(self.activity.record)

    async def wait_idle(self, timeout: Any = "10s") -> dict[str, Any]:
        """Wait until every host holds no buffers and no program; raises ``TimeoutError`` otherwise."""
        seconds = parse_timedelta(timeout)
        try:
            replies = await asyncio.wait_for(self._broadcast({"op": "pathdask_wait_idle"}), seconds)
        except TimeoutError:
            stats = _merge(await self._broadcast({"op": "pathdask_stats"}))
            busy = {d: (s["bytes_in_use"], s["buffers"], s["pending_programs"])
                    for d, s in stats["devices"].items() if s["buffers"] or s["pending_programs"]}
            raise TimeoutError(
                f"The pathdask hosts were not idle within {seconds:g}s: {stats['programs']} program(s) "
                f"dispatched and unfinished; devices holding (bytes, buffers, queued programs): {busy}. "
                "Release the arrays you no longer need, or see system.diagnose() for what devices wait for"
            ) from None
        return _merge(replies)


def _merge(replies: dict[str, Any]) -> dict[str, Any]:
    """One ``device_stats()`` from every host's: devices, link classes and NICs.

    Link classes are counted where transfers arrive, so hosts' counts add up;
    the longest queue and wait are maxima.
    """
    devices: dict[int, Any] = {}
    links: dict[str, dict[str, Any]] = {}
    nics: dict[str, dict[str, Any]] = {}
    programs = 0
    for reply in replies.values():
        if not isinstance(reply, dict) or "devices" not in reply:
            continue
        devices.update({int(k): v for k, v in reply["devices"].items()})
        for cls, v in reply["links"].items():
            add_stats(links.setdefault(cls, {}), v)
        for host, sides in reply.get("nics", {}).items():
            nics.setdefault(host, {}).update(sides)  # a NIC's two sides are booked on its own host
        programs += reply["programs"]
    return {"devices": dict(sorted(devices.items())), "links": links, "nics": dict(sorted(nics.items())),
            "programs": programs}
