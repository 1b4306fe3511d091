"""Suspend and resume: a client's arrays to a zarr store and back, shard by shard, by the hosts.

``client.suspend(path, arrays)`` waits for the arrays, writes them to a zarr
group at ``path`` and frees their devices; ``client.resume(path)`` asks for
meshes of the same shapes (anywhere they fit: other devices, another island,
another system) and reads every array back, returning them by name. Shards
never pass through the client or the scheduler: each host writes the shards
it holds (``worker/storage.py``), and each device reads the block it will
hold (:class:`~pathdask.ops.LoadOp`).

The format is plain zarr, readable without pathdask (``xarray.open_zarr(path)``):
one uncompressed zarr array per named array, one chunk per distinct shard, with
``dimension_names`` (its xarray dims, else ``<name>_dim<i>``), and a group
attribute ``pathdask`` that records each array's mesh shape and spec.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import CheckpointError
from ..gather import raise_reply_error
from ..mesh import Mesh
from ..ops import LoadOp, OutSpec
from ..protocol import CLIENT, HostRetiring, Save, Suspended, SuspendOnInterruption, ask, decode
from ..scheduler.interruptions import TOPIC
from ..sharding import Sharding
from ..spec import PartitionSpec
from .array import ShardedArray

if TYPE_CHECKING:
    from distributed import Client as DaskClient

    from .hosts import Hosts

__all__ = ["ArrayClient", "Interruption", "resume", "suspend", "suspend_on_interruption"]

FORMAT = 1


class ArrayClient(Protocol):
    """What checkpoints and recovery (``elastic.py``) need from their client (``Client`` is one)."""

    dask: DaskClient
    _hosts: Hosts

    @property
    def id(self) -> str:
        """The client's id (its Dask client's)."""

    def mesh(self, shape: Mapping[str, int], island: int | None = None) -> Mesh:
        """A new slice of devices of this shape."""

    def devices(self) -> list[dict[str, Any]]:
        """Every live device."""

    def put(self, array: Any, mesh: Mesh, spec: PartitionSpec | None = None) -> ShardedArray:
        """An array put onto ``mesh``."""

    def _fetch(self, array: ShardedArray, timeout: Any = None, avoid: frozenset[int] = frozenset()) -> np.ndarray:
        """The array's values, from devices not in ``avoid``."""

    def _place(self, sharding: Sharding, dtype: np.dtype, op_for: Callable[[int, OutSpec], Any],
               meta: dict[str, Any] | None = None) -> ShardedArray:
        """A one-gang program storing a block on every device of ``sharding``'s mesh."""


def suspend(client: ArrayClient, path: str | os.PathLike[str], arrays: Mapping[str, ShardedArray],
            release: bool = True) -> list[str]:
    """Write ``arrays`` (name -> array) to a zarr group at ``path``; see ``Client.suspend``."""
    import zarr

    path = os.fspath(path)
    for name, a in arrays.items():
        if not isinstance(a, ShardedArray):
            raise TypeError(f"suspend: {name!r} is a {type(a).__name__}, expected a ShardedArray")
        a._check_alive()
    meshes: list[Mesh] = []
    meta: dict[str, Any] = {}
    group = zarr.open_group(path, mode="w")
    for name, a in arrays.items():
        if a.mesh not in meshes:
            meshes.append(a.mesh)
        dims = tuple(map(str, a._xarray["dims"])) if a._xarray else tuple(f"{name}_dim{i}" for i in range(a.ndim))
        group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=tuple(max(1, n) for n in a.sharding.shard_shape),
                           compressors=None, fill_value=0, dimension_names=dims)
        meta[name] = {"mesh": meshes.index(a.mesh), "spec": [_entry(e) for e in a.spec]}
    group.attrs["pathdask"] = {"format": FORMAT, "arrays": meta,
                               "meshes": [dict(m.shape) for m in meshes]}
    writes: dict[str, list[tuple[str, str, int, int, tuple[slice, ...]]]] = {}
    for name, a in arrays.items():
        for addr, items in a.ref.shards().items():
            writes.setdefault(addr, []).extend((name, *buf, a.sharding.index(p)) for p, buf in items)

    async def write() -> None:
        replies = await asyncio.gather(*(
            client._hosts.ask(addr, Save(path, w), "holds shards to save")
            for addr, w in writes.items()))
        for reply in replies:
            if "error" in reply:
                raise_reply_error(reply["error"])

    client.dask.sync(write)
    with warnings.catch_warnings():  # zarr notes that v3 has no consolidated metadata in its spec yet;
        warnings.simplefilter("ignore")  # xarray reads it, and opens the group in one read
        zarr.consolidate_metadata(path)
    if release:
        for a in arrays.values():
            a.delete()
    return list(arrays)


def resume(client: ArrayClient, path: str | os.PathLike[str], island: int | None = None,
           mesh: Mesh | None = None) -> dict[str, ShardedArray]:
    """Read a checkpoint back onto new meshes of the same shapes; see ``Client.resume``."""
    import zarr

    path = os.fspath(path)
    try:
        group = zarr.open_group(path, mode="r")
        info: dict[str, Any] = dict(group.attrs["pathdask"])  # type: ignore[arg-type]
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"No pathdask checkpoint at {path!r} ({type(e).__name__}: {e}); expected a zarr group "
            "written by client.suspend"
        ) from None
    if info.get("format") != FORMAT:
        raise CheckpointError(f"The checkpoint at {path!r} has format {info.get('format')!r}; this "
                              f"version of pathdask reads format {FORMAT}")
    meshes = [mesh or client.mesh(shape, island=island) for shape in info["meshes"]]
    out = {}
    for name, m in info["arrays"].items():
        arr: Any = group[name]
        sharding = Sharding(tuple(arr.shape), meshes[m["mesh"]], PartitionSpec(*[_entry_back(e) for e in m["spec"]]))
        dims = arr.metadata.dimension_names
        meta = {"dims": tuple(dims), "name": name} if dims else None

        def load(p: int, spec: OutSpec, name: str = name, sharding: Sharding = sharding) -> LoadOp:
            return LoadOp(0, spec, path, name, sharding.index(p))

        out[name] = client._place(sharding, np.dtype(arr.dtype), load, meta)
    return out


def _entry(e: Any) -> Any:
    return list(e) if isinstance(e, tuple) else e


def _entry_back(e: Any) -> Any:
    return tuple(e) if isinstance(e, list) else e


class Interruption:
    """What ``client.suspend_on_interruption`` returns: a record of the suspends it made.

    ``happened`` is set once a leaving host made this client suspend; ``records``
    says which host, which arrays, where, and any error.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.happened = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a suspend happened; ``False`` on timeout."""
        return self.happened.wait(timeout)


def suspend_on_interruption(client: ArrayClient, path: str | os.PathLike[str],
                            state: Mapping[str, ShardedArray] | Callable[[], Mapping[str, ShardedArray]]) -> Interruption:
    """Suspend ``state`` to ``path`` when a host this client uses leaves on purpose."""
    watch = Interruption(os.fspath(path))

    async def on_event(event: tuple[float, dict[str, Any]]) -> None:
        msg = decode(event[1], "the scheduler", CLIENT, HostRetiring.kind)
        assert isinstance(msg, HostRetiring)
        if client.id not in msg.clients:
            return
        error, names = None, []
        try:
            arrays = dict(state() if callable(state) else state)
            names = await asyncio.to_thread(suspend, client, watch.path, arrays)
        except Exception as e:  # noqa: BLE001 - told to the scheduler and kept in the record
            error = f"{type(e).__name__}: {e}"
        watch.records.append({"host": msg.host, "arrays": names, "path": watch.path, "error": error})
        watch.happened.set()
        await ask(client.dask.scheduler, Suspended(client.id, msg.host, error))

    client.dask.subscribe_topic(TOPIC, on_event)
    client.dask.sync(ask, client.dask.scheduler, SuspendOnInterruption(client.id))
    return watch
