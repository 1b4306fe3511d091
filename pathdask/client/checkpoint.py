"""Checkpoints: a client's arrays to a zarr store and back, shard by shard, by the hosts.

``client.checkpoint(path, arrays)`` returns at once with a
:class:`CheckpointFuture`; the devices run on while the hosts write, and the
arrays' buffers stay alive until written, even if the caller drops or deletes
the arrays meanwhile. ``client.suspend(path, arrays)`` is the same, waited for,
and then frees the arrays' devices. ``client.resume(path)`` asks for meshes of
the same shapes (anywhere they fit: other devices, another island, another
system) and reads every array back, by name. Shards never pass through the
client or the scheduler: each host writes the shards it holds
(``worker/storage.py``), and each device reads the block it will hold
(:class:`~pathdask.ops.LoadOp`).

A checkpoint is committed in one atomic step once every shard is written, and
what the path held before stays whole until then; ``resume`` checks the commit
record and every chunk's checksum (``checkpoint_format.py``). The format is
plain zarr, readable without pathdask (``xarray.open_zarr(path)``): one
uncompressed zarr array per named array, one chunk per distinct shard, with
``dimension_names`` (its xarray dims, else ``<name>_dim<i>``).

A client's checkpoints to one path are written one after the other, in the order
they were asked for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import threading
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from dask.utils import parse_timedelta
from tornado.platform.asyncio import BaseAsyncIOLoop

from ..checkpoint_format import (
    ArrayLayout,
    check_target,
    chunk_coords,
    chunk_key,
    clean,
    commit,
    create,
    new_directory,
    normalize,
    open_committed,
    overlapping,
)
from ..errors import CheckpointWriteError, DeviceLostError
from ..gather import raise_reply_error
from ..mesh import Mesh
from ..ops import LoadOp, OutSpec
from ..protocol import Save
from ..sharding import Sharding
from ..spec import PartitionSpec
from .array import ShardedArray
from .dispatcher import hold_reads, unread

if TYPE_CHECKING:
    from distributed import Client as DaskClient

    from .hosts import Hosts

__all__ = ["ArrayClient", "CheckpointFuture", "Checkpoints", "checkpoint", "resume", "suspend"]


class ArrayClient(Protocol):
    """What checkpoints and recovery (``elastic.py``) need from their client (``Client`` is one)."""

    dask: DaskClient
    _hosts: Hosts
    _lock: threading.Lock
    _checkpoints: Checkpoints

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


class CheckpointFuture:
    """A checkpoint being written (``client.checkpoint``): ``result()`` waits for its commit.

    ``result()`` returns the names written, or raises what stopped it: an array's own
    error, :class:`~pathdask.errors.DeviceLostError` (a host left mid-write) or
    :class:`~pathdask.errors.CheckpointWriteError` (storage). Then nothing was committed
    and ``path`` still holds what it held before. It can also be awaited.
    """

    def __init__(self, path: str, names: list[str], future: concurrent.futures.Future[list[str]]) -> None:
        self.path, self.names = path, names
        self._future = future

    def result(self, timeout: Any = None) -> list[str]:
        """The names written, once committed; ``timeout`` (seconds or ``"10s"``) raises ``TimeoutError``."""
        seconds = parse_timedelta(timeout) if timeout is not None else None
        try:
            return self._future.result(seconds)
        except concurrent.futures.TimeoutError:
            if self._future.done():
                raise
            raise TimeoutError(f"The checkpoint of {self.names} to {self.path!r} is not committed after "
                               f"{seconds:g} s; wait longer (result(timeout=None) waits until it is)") from None

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: Any = None) -> BaseException | None:
        return self._future.exception(parse_timedelta(timeout) if timeout is not None else None)

    def add_done_callback(self, fn: Callable[[CheckpointFuture], Any]) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    def __await__(self) -> Generator[Any, None, list[str]]:
        return asyncio.wrap_future(self._future).__await__()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "error" if self._future.exception() else "committed"
        return f"<CheckpointFuture {self.names} to {self.path!r}: {state}>"


class Checkpoints:
    """A client's checkpoints in flight.

    ``tails`` (event loop only): per path, the end of the last checkpoint queued to it,
    which the next one waits for. ``pending`` (under ``lock``): those not ended.
    """

    def __init__(self) -> None:
        self.tails: dict[str, asyncio.Future[None]] = {}
        self.lock = threading.Lock()
        self.pending: set[CheckpointFuture] = set()

    def add(self, future: CheckpointFuture) -> None:
        with self.lock:
            self.pending.add(future)

        def ended(f: CheckpointFuture) -> None:
            with self.lock:
                self.pending.discard(f)

        future.add_done_callback(ended)

    def wait(self) -> None:
        """Wait until every checkpoint in flight ended (its outcome is its caller's)."""
        with self.lock:
            pending = list(self.pending)
        concurrent.futures.wait([f._future for f in pending])


@dataclass(frozen=True)
class _Plan:
    """What a checkpoint writes: the arrays' layout, their record, and each host's writes."""

    layout: dict[str, ArrayLayout]
    record: dict[str, dict[str, Any]]
    meshes: list[dict[str, int]]
    #: per host: (array name, program, value id, device, chunk key) of each shard it writes
    writes: dict[str, list[tuple[str, str, int, int, str]]]


def _plan(arrays: Mapping[str, ShardedArray]) -> _Plan:
    meshes: list[Mesh] = []
    layout, record = {}, {}
    writes: dict[str, list[tuple[str, str, int, int, str]]] = {}
    for name, a in arrays.items():
        if a.mesh not in meshes:
            meshes.append(a.mesh)
        dims = tuple(map(str, a._xarray["dims"])) if a._xarray else tuple(f"{name}_dim{i}" for i in range(a.ndim))
        layout[name] = ArrayLayout(a.shape, a.dtype.str, tuple(max(1, n) for n in a.sharding.shard_shape), dims)
        record[name] = {"mesh": meshes.index(a.mesh), "spec": [_entry(e) for e in a.spec]}
        if a.size == 0:
            continue  # no chunks
        for addr, items in a.ref.shards().items():
            for p, buf in items:
                writes.setdefault(addr, []).append((name, *buf, chunk_key(a.sharding.block_index(p))))
    return _Plan(layout, record, [dict(m.shape) for m in meshes], writes)


def checkpoint(client: ArrayClient, path: str | os.PathLike[str],
               arrays: Mapping[str, ShardedArray]) -> CheckpointFuture:
    """Start writing ``arrays`` (name -> array) to ``path``; see ``Client.checkpoint``."""
    path = normalize(path)
    arrays = dict(arrays)
    for name, a in arrays.items():
        if not isinstance(a, ShardedArray):
            raise TypeError(f"checkpoint: {name!r} is a {type(a).__name__}, expected a ShardedArray")
        a._check_alive()
    check_target(path)
    plan = _plan(arrays)
    held = list(arrays.values())
    hold_reads(client._lock, held)  # a delete() now waits for the write: the buffers stay
    try:
        loop = client.dask.loop
        assert isinstance(loop, BaseAsyncIOLoop), loop
        future = asyncio.run_coroutine_threadsafe(_write(client, path, plan, held), loop.asyncio_loop)
    except BaseException:
        unread(client._lock, held)
        raise
    done = CheckpointFuture(path, list(arrays), future)
    client._checkpoints.add(done)
    return done


async def _write(client: ArrayClient, path: str, plan: _Plan, held: list[ShardedArray]) -> list[str]:
    """Write a checkpoint into a new directory, then commit it (event loop)."""
    book = client._checkpoints
    previous = book.tails.get(path)
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    book.tails[path] = ended
    directory: str | None = None
    try:
        if previous is not None:
            await asyncio.wait([previous])  # its outcome is its own caller's
        directory = new_directory(path)
        await _storage(path, "create", asyncio.to_thread(create, directory, plan.layout))
        replies = await asyncio.gather(*(
            client._hosts.ask(addr, Save(directory, writes), f"holds shards to save to {path!r}")
            for addr, writes in plan.writes.items()), return_exceptions=True)
        sums: dict[str, dict[str, int]] = {name: {} for name in plan.layout}
        for addr, reply in zip(plan.writes, replies):
            _raise_failure(path, directory, addr, reply)
            assert isinstance(reply, dict), reply
            for (name, *_, key), crc in zip(plan.writes[addr], reply["checksums"]):
                sums[name][key] = crc
        record = {"arrays": {name: {**info, "chunks": sums[name]} for name, info in plan.record.items()},
                  "meshes": plan.meshes}
        await _storage(path, "commit", asyncio.to_thread(commit, path, directory, record))
        directory = None  # committed: it is the checkpoint now
        await asyncio.to_thread(clean, path)
        return list(plan.layout)
    finally:
        if directory is not None:  # never committed: nothing names it
            await asyncio.to_thread(shutil.rmtree, directory, True)
        ended.set_result(None)
        if book.tails.get(path) is ended:
            del book.tails[path]
        unread(client._lock, list(held))


def _remains(path: str) -> str:
    return (f"{path!r} still holds the previous checkpoint, unchanged" if os.path.islink(path)
            else f"there is still no checkpoint at {path!r}")


async def _storage(path: str, step: str, work: Any) -> None:
    """Await the client's own storage ``work``; its ``OSError`` as a :class:`CheckpointWriteError`."""
    try:
        await work
    except OSError as e:
        raise _write_error(e, f"The checkpoint to {path!r} failed at its {step} step ({type(e).__name__}: {e}); "
                           f"nothing was committed and {_remains(path)}. Free space or fix the permissions, then "
                           "checkpoint again") from e


def _write_error(cause: BaseException, message: str) -> CheckpointWriteError:
    """A :class:`CheckpointWriteError` with the ``errno`` of its cause, where it has one."""
    errno = getattr(cause, "errno", None)
    return CheckpointWriteError(errno, message) if errno is not None else CheckpointWriteError(message)


def _raise_failure(path: str, directory: str, addr: str, reply: Any) -> None:
    """Raise what a host's answer to ``Save`` says went wrong, if anything."""
    if isinstance(reply, DeviceLostError):
        raise DeviceLostError(f"{reply}. The checkpoint was not committed: {_remains(path)}") from reply
    if isinstance(reply, BaseException):
        raise reply
    if "error" in reply:  # an array's own error: its program failed
        raise_reply_error(reply["error"])
    if "write_error" in reply:
        try:
            raise_reply_error(reply["write_error"])
        except Exception as e:
            raise _write_error(e, f"Host {addr} could not write its shards into {directory!r} "
                                  f"({type(e).__name__}: {e}); nothing was committed and {_remains(path)}. "
                                  "Free space or fix the permissions, then checkpoint again") from e


def suspend(client: ArrayClient, path: str | os.PathLike[str], arrays: Mapping[str, ShardedArray],
            release: bool = True) -> list[str]:
    """Write ``arrays`` (name -> array) to ``path`` and wait for the commit; see ``Client.suspend``."""
    names = checkpoint(client, path, arrays).result()
    if release:
        for a in arrays.values():
            a.delete()
    return names


def resume(client: ArrayClient, path: str | os.PathLike[str], island: int | None = None,
           mesh: Mesh | None = None) -> dict[str, ShardedArray]:
    """Read a checkpoint back onto new meshes of the same shapes; see ``Client.resume``."""
    path = normalize(path)
    directory, group, record = open_committed(path)
    meshes = [mesh or client.mesh(shape, island=island) for shape in record["meshes"]]
    out = {}
    for name, m in record["arrays"].items():
        arr: Any = group[name]
        shape, chunks = tuple(arr.shape), tuple(arr.chunks)
        sums = {chunk_coords(key): crc for key, crc in m["chunks"].items()}
        sharding = Sharding(shape, meshes[m["mesh"]], PartitionSpec(*[_entry_back(e) for e in m["spec"]]))
        dims = arr.metadata.dimension_names
        meta = {"dims": tuple(dims), "name": name} if dims else None

        def load(p: int, spec: OutSpec, name: str = name, sharding: Sharding = sharding,
                 shape: tuple[int, ...] = shape, chunks: tuple[int, ...] = chunks,
                 sums: dict[tuple[int, ...], int] = sums) -> LoadOp:
            region = sharding.index(p)
            touched = overlapping(region, chunks) if sums else []
            return LoadOp(0, spec, directory, name, region, shape, chunks, tuple((c, sums[c]) for c in touched))

        out[name] = client._place(sharding, np.dtype(arr.dtype), load, meta)
    return out


def _entry(e: Any) -> Any:
    return list(e) if isinstance(e, tuple) else e


def _entry_back(e: Any) -> Any:
    return tuple(e) if isinstance(e, list) else e
