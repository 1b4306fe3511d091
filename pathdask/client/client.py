"""``Client``: one tenant of a pathdask system (the single controller's handle).

It asks the scheduler for meshes, puts arrays and runs programs on them. What
it hands over: the call path to its :class:`~.batching.Batcher` (calls made
while one is on its way go together) and :class:`~.dispatcher.Dispatcher`, questions
to the hosts (results, status) to :class:`~.hosts.Hosts`, observation to an
:class:`~.observe.Observer`, checkpoints to ``checkpoint.py`` (and
``interruption.py``) and recovery to ``elastic.py``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import dask
import numpy as np
import xarray as xr
from dask.utils import parse_bytes, parse_timedelta
from distributed import Client as DaskClient

from ..errors import ClientClosedError, MeshError, ShardingError
from ..gather import raise_reply_error
from ..mesh import Mesh, check_shape
from ..ops import GangSpec, HostPlan, OutSpec, PutOp
from ..protocol import AllocateMesh, RegisterClient, ask
from ..sharding import Sharding
from ..spec import PartitionSpec
from ..topology import DeviceId, DeviceInfo, Topology
from . import checkpoint, elastic, interruption
from .array import ShardedArray
from .batching import Batcher
from .dispatcher import Dispatcher, Outputs
from .hosts import Hosts
from .lowering import lower
from .observe import Observed, Observer
from .protocols import Sharded
from .tracing import Program

__all__ = ["Client", "connect"]

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
        self._lock = threading.Lock()  # guards the arrays' reader counts, with the dispatcher's state
        self._closed = False
        info = self.dask.sync(
            ask, self.dask.scheduler, RegisterClient(self.dask.id, name, weight)
        )
        if not isinstance(info, dict):
            self._closed = True
            if self._owns_dask:
                self.dask.close()
            raise RuntimeError(
                f"The Dask scheduler at {self.dask.scheduler.address} has no pathdask plugin. Start "
                "it with pathdask.LocalSystem, or with `dask scheduler --preload pathdask.preload`"
            )
        self.topology = Topology.from_dict(info["topology"])
        self._observe = Observer(self.dask)
        self._hosts = Hosts(self.dask, info, self._observe)
        self._dispatcher = Dispatcher(self.dask, self.id, self._hosts, self._lock)
        self._batcher = Batcher(self, self._launch, ShardedArray)
        self._checkpoints = checkpoint.Checkpoints()

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
        reply = self.dask.sync(ask, self.dask.scheduler, AllocateMesh(self.id, dict(shape), island, hints))
        if "error" in reply:
            raise_reply_error(reply["error"])
        infos = [DeviceInfo(DeviceId(i), isl, h, ix, addr) for i, isl, h, ix, addr in reply["devices"]]
        return Mesh.create(dict(shape), infos, reply["slice"], self.id)

    def _check_meshes(self, meshes: list[Mesh]) -> None:
        """Slices belong to the client that asked for them (and to its system)."""
        for mesh in meshes:  # one attribute each: cheaper than hashing meshes to take each once
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
    def checkpoint(self, path: str | os.PathLike[str], arrays: Mapping[str, ShardedArray]) -> checkpoint.CheckpointFuture:
        """Start writing ``arrays`` (name -> array) to a zarr checkpoint at ``path``; returns at once.

        The devices run on while the hosts write, each the shards it holds, from a thread
        of its own; the arrays' buffers stay alive until written, even if they are deleted
        meanwhile (as Orbax's async save does). The checkpoint is committed in one atomic
        step once every shard is written: until then ``path`` holds what it held before,
        whole, whatever stops the write (a lost host, a killed client, a full disk).
        Checkpoints to one path are written in the order asked for.

        Returns a :class:`~pathdask.client.checkpoint.CheckpointFuture`: ``result()`` gives
        the names once committed, or raises what stopped it (the arrays' own error,
        :class:`~pathdask.errors.DeviceLostError`, :class:`~pathdask.errors.CheckpointWriteError`).
        :meth:`close` waits for the checkpoints in flight.

        Examples
        --------
        >>> saved = client.checkpoint("state.zarr", {"w": w})      # doctest: +SKIP
        >>> w = step(w)                                            # doctest: +SKIP
        >>> saved.result()                                         # doctest: +SKIP
        ['w']
        """
        return checkpoint.checkpoint(self, path, arrays)

    def suspend(self, path: str | os.PathLike[str], arrays: Mapping[str, ShardedArray], *,
                release: bool = True) -> list[str]:
        """Write ``arrays`` (name -> array) to a zarr checkpoint at ``path``, and free their devices.

        It waits for the programs that compute them, and for the commit (:meth:`checkpoint`,
        waited for). Each host writes the shards it holds, all at once; nothing passes
        through this process or the scheduler. The checkpoint is plain zarr:
        ``xarray.open_zarr(path)`` reads it without pathdask. ``release=False`` keeps the
        arrays on their devices. ``path`` is a link to the directory of the last committed
        checkpoint (``<path>.pathdask-<token>``, beside it), swapped in one step.

        Examples
        --------
        >>> client.suspend("state.zarr", {"w": w, "b": b})          # doctest: +SKIP
        >>> state = client.resume("state.zarr"); w = state["w"]     # doctest: +SKIP
        """
        return checkpoint.suspend(self, path, arrays, release)

    def resume(self, path: str | os.PathLike[str], *, island: int | None = None,
               mesh: Mesh | None = None) -> dict[str, ShardedArray]:
        """Read a checkpoint written by :meth:`suspend` back, by name.

        Meshes of the same shapes are asked for again: they may land on other devices,
        another island (``island``) or another system, as long as they fit. Or every
        array goes onto ``mesh`` (say, a smaller one after a host was lost), whose axes
        must include those the arrays' specs name. Each device reads its own block.

        It raises :class:`~pathdask.errors.CheckpointIncompleteError` for a checkpoint that
        was never committed or lacks chunks (naming them); a chunk whose checksum differs
        from its commit record fails its array with
        :class:`~pathdask.errors.CheckpointCorruptError` (raised by ``result()``).
        """
        return checkpoint.resume(self, path, island, mesh)

    def recover(self, arrays: Mapping[str, ShardedArray], mesh: Mesh) -> dict[str, ShardedArray]:
        """After a host was lost: ``arrays`` again on ``mesh``, from the copies that survived.

        An array with a live copy of every block (a replicated one, say) is moved onto
        ``mesh`` with its spec; one that lost every copy of some block raises
        :class:`~pathdask.errors.ArrayLostError`, which names it (restore it from a
        checkpoint with :meth:`resume` instead).
        """
        return elastic.recover(self, arrays, mesh)

    def suspend_on_interruption(self, path: str | os.PathLike[str],
                                state: Mapping[str, ShardedArray] | Callable[[], Mapping[str, ShardedArray]]) -> interruption.Interruption:
        """When a host this client uses leaves on purpose (``retire_workers``, SIGTERM to
        ``dask worker``), suspend ``state`` (a mapping, or a callable returning one) to
        ``path`` before the host goes; it waits up to ``pathdask.suspend-timeout``.

        Returns an :class:`~pathdask.client.interruption.Interruption`: ``.wait()`` for a
        suspend, ``.records`` for what was written; :meth:`resume` reads it back.

        Examples
        --------
        >>> state = {"w1": w1, "w2": w2}                           # doctest: +SKIP
        >>> guard = client.suspend_on_interruption("state.zarr", lambda: state)  # doctest: +SKIP
        """
        return interruption.suspend_on_interruption(self, path, state)

    def _place(self, sharding: Sharding, dtype: np.dtype, op_for: Callable[[int, OutSpec], Any],
               meta: dict[str, Any] | None = None) -> ShardedArray:
        """A one-gang program that stores a block on every device of ``sharding``'s mesh:
        ``op_for(position, out)`` says where each block comes from (a put, a checkpoint)."""
        mesh = sharding.mesh
        out = OutSpec(0, sharding.shard_shape, dtype.str)
        gang = GangSpec(0, "put", mesh.devices)
        pid = self._dispatcher.new_pid()
        plans: dict[str, HostPlan] = {}
        for addr in mesh.hosts:
            local = [(p, d) for p, d in enumerate(mesh.devices) if d.address == addr]
            plans[addr] = HostPlan(
                "put", {0: gang},
                {d.id: (op_for(p, out),) for p, d in local},
                {0: tuple((0, d.id) for _, d in local)},
                id=pid, once=True, alone=len(mesh.hosts) == 1,
            )
        futures = self._dispatch(pid, plans, (), ())
        return ShardedArray(self, pid, 0, sharding.shape, dtype, mesh, sharding.spec, futures[0], meta)

    # -- programs --------------------------------------------------------------
    def _run(self, program: Program, arrays: tuple[Sharded, ...]) -> Any:
        return self._batcher.call(program, arrays)

    def _launch(self, program: Program, arrays: tuple[Sharded, ...],
                sent: Callable[[], None]) -> tuple[str, Outputs]:
        """Send ``program`` on ``arrays`` (a call, or a batch of them); ``sent`` is called once it
        is on its way. Its program id and, per output, the futures of its keys by host."""
        for a in arrays:
            a._check_alive()
        self._check_meshes([v.mesh for v in program.values])
        plans = lower(program, overlap=dask.config.get("pathdask.dispatch") != "sequential")
        pid = self._dispatcher.new_pid()
        return pid, self._dispatch(pid, plans, tuple(a.key for a in arrays), arrays, program, sent)

    def _dispatch(self, pid: str, plans: dict[str, HostPlan], inputs: tuple[tuple[str, int], ...],
                  keepalive: tuple[Sharded, ...], program: Program | None = None,
                  sent: Callable[[], None] | None = None) -> Outputs:
        if self._closed:
            raise ClientClosedError(f"Client {self.name!r} is closed; open a new one with system.client(...)")
        return self._dispatcher.dispatch(pid, plans, inputs, keepalive, program, sent)

    # -- results -------------------------------------------------------------------
    def _fetch(self, array: Sharded, timeout: Any = None, avoid: frozenset[int] = frozenset()) -> np.ndarray:
        return self._hosts.fetch(array.ref, timeout, avoid)

    def _status(self, array: Sharded) -> str:
        return self._hosts.status(array.ref)

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        """Close this client: its slices are released and its pending programs dropped."""
        if self._closed:
            return
        self._checkpoints.wait()  # their arrays' buffers are to be written first
        self._closed = True
        self._batcher.close()
        self._dispatcher.close()
        self._hosts.close()
        if self._owns_dask:
            self.dask.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()



def _put_part(block_nbytes: int) -> int:
    """The size of the parts a put's block travels in (see :class:`~pathdask.ops.PutOp`).

    A block that fits in one Dask frame goes whole and is stored without a copy; a
    larger one Dask would merge into a second copy, so it goes in parts of
    ``pathdask.transfer-chunk``, which the host copies in and lets go one by one.
    """
    frame = parse_bytes(dask.config.get("distributed.comm.shard"))
    return max(block_nbytes, 1) if block_nbytes <= frame else parse_bytes(dask.config.get("pathdask.transfer-chunk"))


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
