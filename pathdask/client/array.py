"""``ShardedArray``: a logical array split over a mesh, whose shards live in device stores."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes

from ..errors import ClientClosedError
from ..gather import OutputRef
from ..html import card, sharding_svg, table
from ..mesh import Mesh
from ..sharding import Sharding
from ..spec import PartitionSpec
from ..stopwatch import mark
from ..worker.tasks import gather_task
from .program import move_program
from .protocols import ArrayOwner, Sharded, Waiting
from .tracing import check_move

if TYPE_CHECKING:
    from distributed import Future


__all__ = ["ShardedArray"]


class ShardedArray(Sharded):
    """A future of a sharded array.

    It is returned at once by ``client.put`` and by program calls; ``result()``
    waits for the devices and gathers the shards into NumPy. Its device buffers
    live while it does: ``delete()`` or garbage collection frees them.

    It is also a Dask collection: ``dask.compute(x)`` returns what ``x.result()``
    does, ``dask.persist(x)`` an equivalent array, and ``distributed.wait(x)``
    waits for its Dask keys. Those hold handles, not data: they are ready once the
    program is dispatched on every host; the devices may still be running it.
    """

    def __init__(self, client: ArrayOwner, pid: str, vid: int, shape: tuple[int, ...], dtype: Any,
                 mesh: Mesh, spec: PartitionSpec, futures: dict[str, Future],
                 xarray_meta: dict[str, Any] | None = None, *, batch: Waiting | None = None,
                 slot: tuple[int, int] | None = None) -> None:
        self.client = client
        self._program_id, self._value_id = pid, vid
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.mesh = mesh
        self.spec = spec
        self._keys = futures  # host address -> output key future (owns the buffers there)
        self._xarray = xarray_meta
        self._deleted = False
        self._readers = 0  # programs reading this array that some host has not registered yet
        #: while its call waits in a batch (``batching.py``): the batch, and its call and output there
        self._batch = batch
        self._slot = slot

    # -- a call that waits in a batch ------------------------------------------
    @property
    def _pid(self) -> str:
        if self._batch is not None:
            self._settle()
        return self._program_id

    @property
    def _vid(self) -> int:
        if self._batch is not None:
            self._settle()
        return self._value_id

    @property
    def _futures(self) -> dict[str, Future]:
        if self._batch is not None:
            self._settle()
        return self._keys

    def _settle(self) -> None:
        """Send the batch this array's call waits in (or wait until it went); raises what stopped it.
        (A batch that splits hands the array on to the part that makes it.)"""
        while (batch := self._batch) is not None:
            batch.settle()

    def _settled(self, pid: str, vid: int, futures: dict[str, Future]) -> None:
        """Its batch went: this array is output ``vid`` of program ``pid``, owned by ``futures``."""
        self._program_id, self._value_id, self._keys = pid, vid, futures
        self._batch = self._slot = None

    # -- metadata ------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @cached_property
    def sharding(self) -> Sharding:
        return Sharding(self.shape, self.mesh, self.spec)

    @property
    def key(self) -> tuple[str, int]:
        return (self._pid, self._vid)

    @cached_property
    def ref(self) -> OutputRef:
        """Where this array's shards are (the handle its Dask keys stand for)."""
        return OutputRef(self._pid, self._vid, self.sharding, self.dtype.str)

    def __repr__(self) -> str:
        return (f"ShardedArray(shape={self.shape}, dtype={self.dtype}, spec={self.spec}, "
                f"mesh={self.mesh.shape}{', deleted' if self._deleted else ''})")

    def _repr_html_(self) -> str:
        sharding = self.sharding
        rows = [
            ("shape", self.shape),
            ("dtype", self.dtype),
            ("bytes", format_bytes(self.nbytes)),
            ("block shape", sharding.shard_shape),
            ("spec", self.spec),
            ("mesh", ", ".join(f"{a}: {n}" for a, n in self.mesh.axes) + f" on devices {list(self.mesh.device_ids)}"),
            ("status", self.status),
            ("program", self._pid),
        ]
        return card("pathdask.ShardedArray", f"{self.ndim}-d {self.dtype} array", table(rows),
                    sharding_svg(sharding))

    @property
    def status(self) -> str:
        """``pending``, ``ready`` (computed on every device), ``error`` (its program failed),
        ``deleted``, or ``closed`` (its client is). Asks the hosts; it does not wait."""
        if self._deleted:
            return "deleted"
        if self.client._closed:
            return "closed"
        return self.client._status(self)

    # -- the Dask collection protocol --------------------------------------------
    # The array's Dask keys are its program's output keys, one per host holding
    # shards. They hold small handles; the data stays on the devices. So
    # ``dask.compute`` finalizes by gathering from the hosts as ``result()`` does,
    # and ``dask.persist`` / ``distributed.wait`` act on the keys alone.

    def __dask_graph__(self) -> HighLevelGraph:
        self._check_alive()
        layer = {f.key: f for f in self._futures.values()}
        return HighLevelGraph.from_collections(self._layer_name, layer, dependencies=())

    def __dask_keys__(self) -> list[Any]:
        return [f.key for f in self._futures.values()]

    def __dask_layers__(self) -> tuple[str, ...]:
        return (self._layer_name,)

    @property
    def _layer_name(self) -> str:
        return f"pathdask-array-{self._pid}-{self._vid}"

    def __dask_tokenize__(self) -> Any:
        return ("pathdask.ShardedArray", self._pid, self._vid)

    @staticmethod
    def __dask_optimize__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return dsk  # nothing to optimize: the keys are computed already

    @property
    def __dask_scheduler__(self) -> Any:
        """The ``get`` of the client's Dask client: never Dask's local schedulers, which
        cannot run pathdask handles."""
        self._check_alive()
        return self.client.dask.get

    def __dask_postcompute__(self) -> tuple[Any, tuple[Any, ...]]:
        return gather_task, (self.ref,)

    def __dask_postpersist__(self) -> tuple[Any, tuple[Any, ...]]:
        return self._rebuild, ()

    def _rebuild(self, dsk: Mapping[Any, Future], *, rename: Mapping[str, str] | None = None) -> ShardedArray:
        """The same array, held by the futures of ``dsk`` (``dask.persist``)."""
        if rename:
            raise NotImplementedError(
                "A ShardedArray's keys cannot be renamed (dask.graph_manipulation): they own "
                "device buffers. Compute it (dask.compute or .result()) and put the result again"
            )
        host_of = {f.key: addr for addr, f in self._futures.items()}
        futures = {host_of[key]: f for key, f in dsk.items()}
        return ShardedArray(self.client, self._pid, self._vid, self.shape, self.dtype, self.mesh, self.spec,
                            futures, self._xarray)

    # -- moves -----------------------------------------------------------------
    def to(self, mesh: Mesh, spec: PartitionSpec | None = None, *, model_nbytes: float | None = None) -> ShardedArray:
        """This array resharded onto ``mesh`` with ``spec`` (default: the same spec).

        One gang of transfers, dispatched at once; ``mesh`` may be in another island
        (the pieces then cross DCN). Each device that needs a piece gets it straight
        from a device that holds it, the nearest one, and each byte moves once.
        Inside a ``@pathdask.program`` the same call on a traced value adds the move
        to the program. ``model_nbytes`` times the move as if the array had that many
        bytes (a small stand-in for a large model's activations or gradients); the
        real bytes still move.

        Examples
        --------
        >>> y = x.to(client.mesh({"data": 4}, island=1), P("data", None))  # doctest: +SKIP
        """
        spec = self.spec if spec is None else spec
        check_move(mesh, spec, self)
        return move_program(mesh, spec, model_nbytes)(self)  # type: ignore[no-any-return]

    # -- data ------------------------------------------------------------------
    def result(self, timeout: Any = None) -> np.ndarray:
        """Wait for the devices and return the global array as NumPy.

        Raises the original exception if a kernel that produced it failed.
        """
        self._check_alive()
        out = self.client._fetch(self, timeout)
        mark("result", self.ref.pid)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.result()
        return out if dtype is None else out.astype(dtype, copy=False)

    def to_xarray(self, dims: Any = None, coords: Any = None, name: Any = None,
                  attrs: dict[str, Any] | None = None) -> xr.DataArray:
        """The result as an ``xarray.DataArray``.

        Its labels are those given here, else those it carries: the dims, coords,
        name and attrs of the DataArray it was ``put`` from, or of the program
        input of the same shape that it came from.

        Examples
        --------
        >>> y.to_xarray(dims=("time", "space"), coords={"time": [0, 1, 2, 3]})  # doctest: +SKIP
        """
        meta = dict(self._xarray or {"dims": tuple(f"dim_{i}" for i in range(self.ndim))})
        if dims is not None:
            meta = {"dims": tuple(dims)}  # new dims: the old coords would not fit them
        for key, value in (("coords", coords), ("name", name), ("attrs", attrs)):
            if value is not None:
                meta[key] = value
        return xr.DataArray(self.result(), **meta)

    def delete(self) -> None:
        """Free this array's device buffers (also happens when it is garbage-collected).

        Programs already called on it still read it: the buffers go once every
        host has registered them.
        """
        if self._batch is not None and self._batch.drop(self):
            return  # its call has not gone yet: it will be no output
        with self.client._lock:
            if self._deleted:
                return
            self._deleted = True
            if self._readers:
                return  # the last reader's registration releases the keys
        self._release()

    def _release(self) -> None:
        for f in self._futures.values():
            f.release()
        self._keys = {}

    def _check_alive(self) -> None:
        if self._deleted:
            raise RuntimeError("This ShardedArray was deleted; its device buffers are gone")
        if self.client._closed:
            raise ClientClosedError(
                f"The client {self.client.name!r} that made this array is closed, so its device "
                "buffers were freed. Keep the client open while you use its arrays"
            )
