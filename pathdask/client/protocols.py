"""What the client's modules need of each other, stated here so that their imports form a DAG.

- :class:`ArrayOwner`: what an array and a program need from the client that
  made the array (:class:`~pathdask.Client` is one, structurally);
- :class:`Sharded`: what a program, the dispatcher and the client need from an
  array argument (:class:`~pathdask.ShardedArray` is the one, by inheritance:
  a program checks its arguments with ``isinstance``, which must stay cheap).

So ``array.py`` needs no ``client.py``, and ``program.py`` no ``array.py``.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import threading

    import numpy as np
    from distributed import Client as DaskClient
    from distributed import Future

    from ..gather import OutputRef
    from ..mesh import Mesh
    from ..spec import PartitionSpec
    from ..topology import Topology
    from .tracing import Program

__all__ = ["ArrayOwner", "Sharded", "Waiting"]


class Waiting(Protocol):
    """The batch that a pending array's call waits in (``batching.Batch``)."""

    def settle(self) -> None:
        """Send it now if it is still open, else wait until it went; raises what stopped it."""

    def drop(self, a: Sharded) -> bool:
        """``a.delete()`` while it is open: ``a`` will be no output. False once it is being sent."""


class Sharded(abc.ABC):
    """A logical array split over a mesh, whose shards live on devices (a ``ShardedArray``)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    mesh: Mesh
    spec: PartitionSpec
    client: ArrayOwner
    _xarray: dict[str, Any] | None  # the labels it carries (see ``to_xarray``)
    _deleted: bool
    _readers: int  # calls reading it that are not on their way yet (guarded by the client's lock)
    _batch: Waiting | None  # the batch its call waits in, until that goes (``batching.py``)
    _slot: tuple[int, int] | None  # its call and output in that batch

    @property
    @abc.abstractmethod
    def _pid(self) -> str:
        """Its program's id (sends its batch first, if its call waits in one)."""

    @property
    @abc.abstractmethod
    def _futures(self) -> dict[str, Future]:
        """Host address -> its output key's future there, which owns the buffers there."""

    @property
    @abc.abstractmethod
    def key(self) -> tuple[str, int]:
        """(program id, value id): what a program reading it names."""

    @property
    @abc.abstractmethod
    def ref(self) -> OutputRef:
        """Where its shards are."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Let go of its keys (and so its buffers)."""

    @abc.abstractmethod
    def _settle(self) -> None:
        """Send the batch its call waits in (or wait until it went); raises what stopped it."""

    @abc.abstractmethod
    def _settled(self, pid: str, vid: int, futures: dict[str, Future]) -> None:
        """Its batch went: it is output ``vid`` of program ``pid``, owned by ``futures``."""

    @abc.abstractmethod
    def _check_alive(self) -> None:
        """Raise if it was deleted or its client closed."""


class ArrayOwner(Protocol):
    """What a ``ShardedArray`` and a program need from the client that made the array."""

    _lock: threading.Lock
    _closed: bool
    name: str
    topology: Topology
    dask: DaskClient

    def _fetch(self, array: Sharded, timeout: Any = None) -> np.ndarray:
        """Gather the array's shards from their hosts."""

    def _status(self, array: Sharded) -> str:
        """Ask the hosts how the array's shards are."""

    def _run(self, program: Program, arrays: tuple[Sharded, ...]) -> Any:
        """Dispatch a traced ``Program`` on these arrays."""
