"""``Client``: one tenant of a pathdask system (the single controller's handle)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import dask
import numpy as np
import xarray as xr
from dask.utils import parse_bytes, parse_timedelta
from distributed import Client as DaskClient
from distributed import Future
from distributed.protocol import to_serialize

from ..compat import client_send, new_futures
from ..errors import ClientClosedError, DeviceLostError, MeshError, ShardingError
from ..gather import gather, raise_reply_error
from ..mesh import Mesh, check_shape
from ..ops import PLANS_PER_CLIENT, GangSpec, HostPlan, OutSpec, PutOp
from ..sharding import Sharding
from ..spec import PartitionSpec
from ..topology import DeviceId, DeviceInfo, Topology
from .array import ShardedArray
from .calls import CALL_OP, build_call
from .fetch import HOST_CHECK_AFTER, HostSockets, Unreachable
from .lowering import build_sequential_graph, lower
from .observe import Observed, Observer
from .program import Program

__all__ = ["Client", "connect"]

logger = logging.getLogger("pathdask.client")

#: plan ids a client remembers per host as sent; hosts keep twice as many (worker/plans.py)
PLANS_REMEMBERED = PLANS_PER_CLIENT // 2


class Client(Observed):
    """A pathdask client: asks for meshes, puts arrays, and dispatches programs.

    Parameters
    ----------
    address : str or distributed.Client
        A Dask scheduler address (whose scheduler runs the pathdask plugin), or
        a connected Dask client to reuse.
    name : str
        A name for this tenant, shown in stats and on the dashboard.
    weight : float
        Its weight under proportional share.
    security : distributed.Security, optional
        Dask's security settings, for a scheduler that uses TLS.
    loop : tornado.ioloop.IOLoop, optional
        The event loop of a scheduler in this process, to share, as a Dask client made
        from a ``LocalCluster`` does: no thread hand-off between them.
    """

    def __init__(self, address: str | DaskClient, *, name: str = "client", weight: float = 1.0,
                 timeout: Any = "30s", security: Any = None, loop: Any = None) -> None:
        if isinstance(address, DaskClient):
            self.dask, self._owns_dask = address, False
        else:
            self.dask = DaskClient(address, set_as_default=False, timeout=parse_timedelta(timeout),
                                   security=security, loop=loop)
            self._owns_dask = True
        self.name, self.weight = name, float(weight)
        self._inflight: dict[str, list[Any]] = {}
        #: guarded by ``_lock``: host -> ids of the plans it holds for us, least recently used first
        self._plans_sent: dict[str, OrderedDict[str, None]] = {}
        self._lock = threading.Lock()
        self._sending_plans = threading.Lock()  # one plan upload at a time; cached calls skip it
        self._closed = False
        #: guarded by ``_lock``: calls not sent yet, with the arrays they read
        self._waiting_calls: list[tuple[dict[str, Any], tuple[ShardedArray, ...]]] = []
        #: program ids: unique to this client, then counted (cheaper than a uuid per call)
        self._pid_prefix = uuid.uuid4().hex[:16]
        self._pids = itertools.count()
        info = self.dask.sync(
            self.dask.scheduler.pathdask_register_client, client=self.dask.id, name=name, weight=weight
        )
        if not isinstance(info, dict):
            self.close()
            raise RuntimeError(
                f"The Dask scheduler at {self.dask.scheduler.address} has no pathdask plugin. Start "
                "it with pathdask.LocalSystem, or with `dask scheduler --preload pathdask.preload`"
            )
        self.topology = Topology.from_dict(info["topology"])
        self._observe = Observer(self.dask)
        #: results come over the hosts' socket transports where they have them (``fetch.py``)
        self._sockets: HostSockets | None = None
        if info.get("transports") and dask.config.get("pathdask.transport") == "socket":
            security = self.dask.security
            self._sockets = HostSockets(info["transport_token"], info["transports"],
                                        security.get_connection_args("client").get("ssl_context"),
                                        self._transport_of, self._hosts_gone)

    def _new_pid(self) -> str:
        return f"{self._pid_prefix}{next(self._pids):08x}"

    @property
    def _observer(self) -> Observer:
        return self._observe

    @property
    def id(self) -> str:
        return str(self.dask.id)

    def __repr__(self) -> str:
        return f"<pathdask.Client {self.name!r} weight={self.weight:g} scheduler={self.dask.scheduler.address}>"

    # -- resources -------------------------------------------------------------
    def mesh(self, shape: Mapping[str, int], island: int | None = None, *,
             devices: list[int] | None = None, exclude: list[int] | None = None,
             placement: str = "pack") -> Mesh:
        """A virtual slice of devices inside one island, as a :class:`Mesh`.

        The resource manager picks the least-loaded devices. Placement hints:
        ``devices`` (exact device ids, in mesh order), ``exclude`` (device ids to
        avoid), ``placement`` (``"pack"`` fills hosts so that collectives use
        same-host links; ``"spread"`` takes one device per host first).

        Examples
        --------
        >>> mesh = client.mesh({"data": 2, "model": 2})
        >>> wide = client.mesh({"x": 2}, placement="spread")   # two hosts, one device each
        """
        check_shape(shape)
        hints = {"devices": devices, "exclude": exclude, "placement": placement}
        reply = self.dask.sync(
            self.dask.scheduler.pathdask_mesh, client=self.id, shape=dict(shape), island=island, hints=hints
        )
        if "error" in reply:
            raise_reply_error(reply["error"])
        infos = [DeviceInfo(DeviceId(i), isl, h, ix, addr) for i, isl, h, ix, addr in reply["devices"]]
        return Mesh.create(dict(shape), infos, reply["slice"], self.id)

    def _check_meshes(self, meshes: list[Mesh]) -> None:
        """Slices belong to the client that asked for them (and to its system)."""
        for mesh in dict.fromkeys(meshes):
            if mesh.client != self.id:
                owner = f"client {mesh.client}" if mesh.client else "no pathdask client"
                raise MeshError(
                    f"Mesh {mesh.shape} (slice {mesh.slice_id or '-'}) belongs to {owner}, not to "
                    f"client {self.name!r} ({self.id}), perhaps of another system. A slice belongs "
                    "to the client that asked for it: ask this client for its own mesh with "
                    "client.mesh(...), and move arrays between clients through NumPy"
                )

    def lost_devices(self) -> list[int]:
        """Ids of the topology's devices that are not live now (their host left, or never came).

        After a :class:`~pathdask.errors.DeviceLostError`, this says what is gone; the
        next :meth:`mesh` picks only live devices, including those of a host that rejoined.
        """
        live = {d["id"] for d in self.devices()}
        return sorted(set(range(self.topology.num_devices)) - live)

    # -- data ----------------------------------------------------------------------
    def put(self, array: Any, mesh: Mesh, spec: PartitionSpec | Mapping[str, str | tuple[str, ...] | None] | None = None) -> ShardedArray:
        """Split ``array`` over ``mesh`` by ``spec`` and store the blocks on the devices.

        ``array`` may be a NumPy array (``spec`` a :class:`PartitionSpec`) or an
        ``xarray.DataArray`` (``spec`` a mapping ``{dim: mesh_axis}``; its dims,
        coords, attrs and name come back with ``to_xarray()``).
        """
        meta = None
        if isinstance(array, xr.DataArray):
            mapping = dict(spec or {}) if not isinstance(spec, PartitionSpec) else None
            if mapping is not None:
                unknown = sorted(set(mapping) - set(map(str, array.dims)))
                if unknown:
                    raise ShardingError(
                        f"Unknown dimension(s) {unknown} in the spec; the DataArray has dims {list(array.dims)}"
                    )
                spec = PartitionSpec(*[mapping.get(str(d)) for d in array.dims])
            meta = {"dims": array.dims, "coords": array.coords, "attrs": dict(array.attrs), "name": array.name}
            array = array.values
        if spec is None:
            spec = PartitionSpec()
        if not isinstance(spec, PartitionSpec):
            raise ShardingError(f"spec must be a PartitionSpec for a NumPy array, got {spec!r}")
        self._check_meshes([mesh])
        data = np.asarray(array)
        if data.dtype == object:
            raise TypeError("client.put needs a numeric array; got an array of Python objects")
        sharding = Sharding(data.shape, mesh, spec)
        blocks = sharding.split(data)
        part = _put_part(int(np.prod(sharding.shard_shape)) * data.dtype.itemsize)
        # The blocks travel with the plan, straight to their host (``_send_plans``),
        # never inside the graph: the scheduler sees only the program's keys.
        parts: dict[int, list[np.ndarray]] = {}  # by block: a replicated block goes once per host

        def put_op(p: int, out: OutSpec) -> PutOp:
            if id(blocks[p]) not in parts:
                parts[id(blocks[p])] = PutOp.parts_of(blocks[p], part)
            return PutOp(0, out, list(parts[id(blocks[p])]))

        return self._place(sharding, data.dtype, put_op, meta)

    # -- checkpoints ----------------------------------------------------------------
    def suspend(self, path: str | os.PathLike[str], arrays: Mapping[str, ShardedArray], *,
                release: bool = True) -> list[str]:
        """Write ``arrays`` (name -> array) to a zarr checkpoint at ``path``, and free their devices.

        It waits for the programs that compute them. Each host writes the shards it
        holds, all at once; nothing passes through this process or the scheduler. The
        checkpoint is plain zarr: ``xarray.open_zarr(path)`` reads it without pathdask.
        ``release=False`` keeps the arrays on their devices (a checkpoint, not a suspend).

        Examples
        --------
        >>> client.suspend("state.zarr", {"w": w, "b": b})          # doctest: +SKIP
        >>> state = client.resume("state.zarr"); w = state["w"]     # doctest: +SKIP
        """
        from .checkpoint import suspend

        return suspend(self, path, arrays, release)

    def resume(self, path: str | os.PathLike[str], *, island: int | None = None,
               mesh: Mesh | None = None) -> dict[str, ShardedArray]:
        """Read a checkpoint written by :meth:`suspend` back, by name.

        Meshes of the same shapes are asked for again: they may land on other devices,
        another island (``island``) or another system, as long as they fit. Or every
        array goes onto ``mesh`` (say, a smaller one after a host was lost), whose axes
        must include those the arrays' specs name. Each device reads its own block.
        """
        from .checkpoint import resume

        return resume(self, path, island, mesh)

    def recover(self, arrays: Mapping[str, ShardedArray], mesh: Mesh) -> dict[str, ShardedArray]:
        """After a host was lost: ``arrays`` again on ``mesh``, from the copies that survived.

        An array with a live copy of every block (a replicated one, say) is moved onto
        ``mesh`` with its spec; one that lost every copy of some block raises
        :class:`~pathdask.errors.ArrayLostError`, which names it (restore it from a
        checkpoint with :meth:`resume` instead).
        """
        from .elastic import recover

        return recover(self, arrays, mesh)

    def suspend_on_interruption(self, path: str | os.PathLike[str],
                                state: Mapping[str, ShardedArray] | Callable[[], Mapping[str, ShardedArray]]) -> Any:
        """When a host this client uses leaves on purpose (``retire_workers``, SIGTERM to
        ``dask worker``), suspend ``state`` (a mapping, or a callable returning one) to
        ``path`` before the host goes; it waits up to ``pathdask.suspend-timeout``.

        Returns an :class:`~pathdask.client.checkpoint.Interruption`: ``.wait()`` for a
        suspend, ``.records`` for what was written; :meth:`resume` reads it back.

        Examples
        --------
        >>> state = {"w1": w1, "w2": w2}                           # doctest: +SKIP
        >>> guard = client.suspend_on_interruption("state.zarr", lambda: state)  # doctest: +SKIP
        """
        from .checkpoint import suspend_on_interruption

        return suspend_on_interruption(self, path, state)

    def _place(self, sharding: Sharding, dtype: np.dtype, op_for: Callable[[int, OutSpec], Any],
               meta: dict[str, Any] | None = None) -> ShardedArray:
        """A one-gang program that stores a block on every device of ``sharding``'s mesh:
        ``op_for(position, out)`` says where each block comes from (a put, a checkpoint)."""
        mesh = sharding.mesh
        out = OutSpec(0, sharding.shard_shape, dtype.str)
        gang = GangSpec(0, "put", mesh.devices)
        pid = self._new_pid()
        plans: dict[str, HostPlan] = {}
        for addr in mesh.hosts:
            local = [(p, d) for p, d in enumerate(mesh.devices) if d.address == addr]
            plans[addr] = HostPlan(
                "put", {0: gang},
                {d.id: (op_for(p, out),) for p, d in local},
                {0: tuple((0, d.id) for _, d in local)},
                id=pid, once=True,
            )
        futures = self._dispatch(pid, plans, (), ())
        return ShardedArray(self, pid, 0, sharding.shape, dtype, mesh, sharding.spec, futures[0], meta)

    # -- programs --------------------------------------------------------------
    def _run(self, program: Program, arrays: tuple[ShardedArray, ...]) -> Any:
        for a in arrays:
            a._check_alive()
        self._check_meshes([v.mesh for v in program.values])
        plans = lower(program, overlap=dask.config.get("pathdask.dispatch") != "sequential")
        pid = self._new_pid()
        futures = self._dispatch(pid, plans, tuple(a.key for a in arrays), arrays, program)
        outs: list[ShardedArray] = []
        for j, vid in enumerate(program.outputs):
            if vid < program.n_inputs:
                outs.append(arrays[vid])
                continue
            v = program.values[vid]
            outs.append(ShardedArray(self, pid, vid, v.shape, v.dtype, v.mesh, v.spec, futures[j],
                                     _labels_for(v.shape, arrays)))
        return tuple(outs) if program.multiple_outputs else outs[0]

    def _dispatch(self, pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...],
                  keepalive: tuple[ShardedArray, ...], program: Program | None = None) -> dict[int, dict[str, Any]]:
        """Submit one program as one graph; returns output futures per output and host."""
        if self._closed:
            raise ClientClosedError(f"Client {self.name!r} is closed; open a new one with system.client(...)")
        mode = dask.config.get("pathdask.dispatch")
        if mode not in ("parallel", "sequential"):
            raise ValueError(f"pathdask.dispatch must be 'parallel' or 'sequential', got {mode!r}")
        if mode == "sequential" and program is not None:
            arg_keys = tuple([f.key for f in a._futures.values()] for a in keepalive)
            graph, keys, out_keys = build_sequential_graph(pid, program, plans, inputs, self.id, arg_keys)
        else:
            self._send_plans(plans)
            call, keys, out_keys = build_call(pid, plans, inputs)
            by_key = dict(zip(keys, self._send_call(call, keys, keepalive)))
            return {j: {addr: by_key[k] for addr, k in hosts.items()} for j, hosts in out_keys.items()}
        futures = self.dask.get(graph, keys, sync=False)
        by_key = dict(zip(keys, futures))
        self._hold(pid, futures, keepalive)
        return {j: {addr: by_key[k] for addr, k in hosts.items()} for j, hosts in out_keys.items()}

    def _send_call(self, call: dict[str, Any], keys: list[Any], reads: tuple[ShardedArray, ...]) -> list[Future]:
        """Send a call on the Dask client's stream; returns the futures of its keys.

        As ``distributed.Client`` does for a graph, the futures exist before the call
        goes, so that the scheduler's reports on their keys find them. Calls made before
        the event loop sends the first go with it, as one message. The arrays it ``reads``
        are kept until it is sent: a release sent after it reaches the hosts after it.
        """
        futures = new_futures(self.dask, keys)
        with self._lock:
            for a in reads:
                a._readers += 1
            self._waiting_calls.append((call, reads))
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
        """
        with self._lock:
            waiting, self._waiting_calls = self._waiting_calls, []
        if not waiting:
            return
        try:
            client_send(self.dask, {"op": CALL_OP, "calls": [call for call, _ in waiting]})
        finally:  # sent, or never to be: either way no host will count these reads later
            self._unread([a for _, reads in waiting for a in reads])

    def _unread(self, arrays: list[ShardedArray]) -> None:
        """Calls that read ``arrays`` are on their way: a deleted array that no call reads goes now."""
        release = []
        with self._lock:
            for a in arrays:
                a._readers -= 1
                if a._deleted and a._readers == 0:
                    release.append(a)
        for a in release:
            a._release()

    def _unsent(self, plans: dict[str, HostPlan]) -> dict[str, HostPlan]:
        """The cached plans (by host) that their host does not hold yet; marks the others used."""
        missing = {}
        with self._lock:
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
            with self._lock:
                for addr, plan in missing.items():
                    sent = self._plans_sent.setdefault(addr, OrderedDict())
                    sent[plan.id] = None
                    while len(sent) > PLANS_REMEMBERED:
                        sent.popitem(last=False)

    def _upload(self, plans: dict[str, HostPlan]) -> None:
        async def send() -> None:
            await asyncio.gather(*(
                self._ask_host(addr, "pathdask_plans", "runs part of this program", client=self.id,
                               plans=to_serialize([plan]))
                for addr, plan in plans.items()))

        self.dask.sync(send)

    async def _ask_host(self, addr: str, handler: str, role: str, **kwargs: Any) -> Any:
        """Call ``handler`` on host ``addr``; ``DeviceLostError`` as soon as the host is known gone.

        A dead host's address would otherwise take Dask's whole connect timeout to fail.
        """
        gone = DeviceLostError(f"Host {addr}, which {role}, left the cluster")
        try:
            return await _unless_gone(getattr(self.dask.rpc(addr), handler)(**kwargs),
                                      lambda: self.dask.scheduler.pathdask_wait_host_gone(address=addr), gone)
        except OSError as e:  # CommClosedError is one
            raise DeviceLostError(f"Host {addr}, which {role}, is gone ({type(e).__name__}: {e})") from e

    def _hold(self, pid: str, futures: list[Any], keepalive: tuple[ShardedArray, ...]) -> None:
        """Keep a program's futures and inputs alive until every host has registered it.

        Inputs must outlive the registration that counts their readers, and no
        dispatch task may be cancelled half-way across hosts.
        """
        entry: list[Any] = [len(futures), futures, keepalive]
        with self._lock:
            self._inflight[pid] = entry
            for a in keepalive:
                a._readers += 1

        def done(_: Any) -> None:
            with self._lock:
                entry[0] -= 1
                last = entry[0] == 0
                if last:
                    self._inflight.pop(pid, None)
            if last:
                self._unread(list(keepalive))

        for f in futures:
            f.add_done_callback(done)

    def _status(self, array: ShardedArray) -> str:
        """``error`` if any shard failed, ``ready`` once all are computed, else ``pending``."""
        async def ask() -> list[list[str]]:
            return list(await asyncio.gather(*(
                self._ask_host(addr, "pathdask_status", "holds shards of this array",
                               buffers=[b for _, b in items])
                for addr, items in array.ref.shards().items())))

        try:
            states = {s for reply in self.dask.sync(ask) for s in reply}
        except (OSError, DeviceLostError):
            return "error"  # a host holding shards is gone
        return "error" if "error" in states else "pending" if "pending" in states else "ready"

    def _hosts_gone(self, hosts: list[str]) -> list[str]:
        """Which of ``hosts`` have left the cluster."""
        return list(self.dask.sync(self.dask.scheduler.pathdask_hosts_gone, hosts=hosts))

    def _transport_of(self, host: str) -> str | None:
        """Where host ``host``'s socket transport listens now; ``None`` if it has left."""
        found = self.dask.sync(self.dask.scheduler.pathdask_transport_of, host=host)
        return None if found is None else str(found)

    def _fetch(self, array: ShardedArray, timeout: Any = None, avoid: frozenset[int] = frozenset()) -> np.ndarray:
        seconds = parse_timedelta(timeout) if timeout is not None else None
        if self._sockets is not None:
            try:
                return self._sockets.fetch(array.ref, avoid, seconds)
            except Unreachable as e:
                logger.warning("pathdask: %s; results come over Dask's comms from now on", e)
                self._sockets.close()
                self._sockets = None
            except TimeoutError:
                assert seconds is not None
                raise _not_ready(array, seconds, self.dask.sync(self._observer.waiting_for, array._pid)) from None

        async def ask(addr: str, buffers: list[tuple[str, int, int]]) -> dict[str, Any]:
            return dict(await self._ask_host(addr, "pathdask_fetch", "holds shards of this array",
                                             buffers=buffers))

        async def fetch() -> np.ndarray:
            # The hosts answer once the shards are computed, or with the error that ended
            # the program: a failed kernel, a failed dispatch (dropped on every host by
            # the scheduler), a lost host.
            try:
                return await asyncio.wait_for(gather(array.ref, ask, avoid), seconds)
            except TimeoutError:
                assert seconds is not None
                raise _not_ready(array, seconds, await self._observer.waiting_for(array._pid)) from None

        return self.dask.sync(fetch)

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Close this client: its slices are released and its pending programs dropped."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._inflight.clear()
        if self._sockets is not None:
            self._sockets.close()
        if self._owns_dask:
            self.dask.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()



async def _unless_gone(work: Any, gone_waiter: Any, gone: BaseException) -> Any:
    """``await work``, unless the scheduler says first that its host left (then raise ``gone``).

    Quick answers (the common case) never ask the scheduler.
    """
    tasks = [asyncio.ensure_future(work)]
    try:  # also when we are cancelled (the caller was interrupted): nothing is left unread
        done, _ = await asyncio.wait(tasks, timeout=HOST_CHECK_AFTER)
        if not done:
            tasks.append(asyncio.ensure_future(gone_waiter()))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done:
            return tasks[0].result()
        tasks[1].result()
        raise gone
    finally:
        for t in tasks:
            t.cancel()  # no-op for a finished one
            t.add_done_callback(_consume)  # whichever we did not read, its outcome is read


def _put_part(block_nbytes: int) -> int:
    """The size of the parts a put's block travels in (see :class:`~pathdask.ops.PutOp`).

    A block that fits in one Dask frame goes whole and is stored without a copy; a
    larger one Dask would merge into a second copy, so it goes in parts of
    ``pathdask.transfer-chunk``, which the host copies in and lets go one by one.
    """
    frame = parse_bytes(dask.config.get("distributed.comm.shard"))
    return max(block_nbytes, 1) if block_nbytes <= frame else parse_bytes(dask.config.get("pathdask.transfer-chunk"))


def _not_ready(array: ShardedArray, seconds: float, waits: str) -> TimeoutError:
    return TimeoutError(f"The shards of program {array._pid} were not ready within {seconds:g}s. {waits}")


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _labels_for(shape: tuple[int, ...], arrays: tuple[ShardedArray, ...]) -> dict[str, Any] | None:
    """xarray in, xarray out: an output keeps the dims and coords of the first labelled input
    of its shape (its name and attrs describe the input, so they stay behind)."""
    for a in arrays:
        if a._xarray is not None and a.shape == shape:
            return {"dims": a._xarray["dims"], "coords": a._xarray.get("coords")}
    return None


def connect(address: str, *, name: str = "client", weight: float = 1.0, timeout: Any = "30s",
            security: Any = None) -> Client:
    """Attach to a running Dask cluster whose scheduler runs the pathdask plugin.

    The scheduler and workers are started with the dask CLI and pathdask's
    preload module; see ``cluster/README.md``.

    Examples
    --------
    >>> client = connect("tcp://127.0.0.1:8786", name="alice")
    """
    return Client(address, name=name, weight=weight, timeout=timeout, security=security)
