"""``ShardedArray``: a logical array split over a mesh, whose shards live in device stores."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import ClientClosedError
from ..mesh import Mesh
from ..sharding import Sharding
from ..spec import PartitionSpec

if TYPE_CHECKING:
    import threading

    import xarray as xr
    from distributed import Future

    from ..topology import Topology


class ArrayOwner(Protocol):
    """What a ``ShardedArray`` needs from the client that made it (``Client`` is one)."""

    _lock: threading.Lock
    _closed: bool
    name: str
    topology: Topology

    def _fetch(self, array: ShardedArray, timeout: Any = None) -> np.ndarray:
        """Gather the array's shards from their hosts."""

    def _status(self, array: ShardedArray) -> str:
        """Ask the hosts how the array's shards are."""

    def _run(self, program: Any, arrays: tuple[ShardedArray, ...]) -> Any:
        """Dispatch a traced ``Program`` on these arrays."""

__all__ = ["ShardedArray"]


class ShardedArray:
    """A future of a sharded array.

    It is returned at once by ``client.put`` and by program calls; ``result()``
    waits for the devices and gathers the shards into NumPy. Its device buffers
    live while it does: ``delete()`` or garbage collection frees them.
    """

    def __init__(self, client: ArrayOwner, pid: str, vid: int, shape: tuple[int, ...], dtype: Any,
                 mesh: Mesh, spec: PartitionSpec, futures: dict[str, Future],
                 xarray_meta: dict[str, Any] | None = None) -> None:
        self.client = client
        self._pid, self._vid = pid, vid
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.mesh = mesh
        self.spec = spec
        self._futures = futures  # host address -> output key future (owns the buffers there)
        self._xarray = xarray_meta
        self._deleted = False
        self._readers = 0  # programs reading this array that some host has not registered yet

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

    @property
    def sharding(self) -> Sharding:
        return Sharding(self.shape, self.mesh, self.spec)

    @property
    def key(self) -> tuple[str, int]:
        return (self._pid, self._vid)

    def __repr__(self) -> str:
        return (f"ShardedArray(shape={self.shape}, dtype={self.dtype}, spec={self.spec}, "
                f"mesh={self.mesh.shape}{', deleted' if self._deleted else ''})")

    @property
    def status(self) -> str:
        """``pending``, ``ready`` (computed on every device), ``error`` (its program failed),
        ``deleted``, or ``closed`` (its client is). Asks the hosts; it does not wait."""
        if self._deleted:
            return "deleted"
        if self.client._closed:
            return "closed"
        return self.client._status(self)

    # -- data ------------------------------------------------------------------
    def result(self, timeout: Any = None) -> np.ndarray:
        """Wait for the devices and return the global array as NumPy.

        Raises the original exception if a kernel that produced it failed.
        """
        self._check_alive()
        return self.client._fetch(self, timeout)

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
        import xarray as xr

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
        self._futures = {}

    def _check_alive(self) -> None:
        if self._deleted:
            raise RuntimeError("This ShardedArray was deleted; its device buffers are gone")
        if self.client._closed:
            raise ClientClosedError(
                f"The client {self.client.name!r} that made this array is closed, so its device "
                "buffers were freed. Keep the client open while you use its arrays"
            )
