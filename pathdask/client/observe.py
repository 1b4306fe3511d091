"""Observation: what a pathdask system's devices did and are doing, read from its scheduler.

:class:`Observer` defines it once, over any Dask client connected to the
scheduler. Users find it where they look, on a :class:`~pathdask.Client` and on
a system (:class:`~pathdask.LocalSystem`, :class:`~pathdask.deploy.CliSystem`):
both are :class:`Observed`, whose methods hand over to their observer.
"""

from __future__ import annotations

from typing import Any

import xarray as xr
from distributed import Client as DaskClient

from ..dashboard.trace import to_dataset, transfers_dataset
from ..diagnosis import Diagnosis, describe
from ..protocol import Diagnose, Info, Message, ResetObservations, Stats, Trace, Transfers, WaitIdle, ask

__all__ = ["Observed", "Observer"]


class Observer:
    """Reads device activity, memory, transfers and waits from the scheduler of ``dask``."""

    def __init__(self, dask: DaskClient) -> None:
        self.dask = dask

    def ask(self, msg: Message) -> Any:
        """Send the scheduler an RPC record (``protocol.py``) and wait for its answer."""
        return self.dask.sync(ask, self.dask.scheduler, msg)

    def devices(self) -> list[dict[str, Any]]:
        return list(self.ask(Info())["devices"])

    def device_stats(self) -> dict[str, Any]:
        return dict(self.ask(Stats()))

    def trace(self, timeout: Any = "10s") -> xr.Dataset:
        return to_dataset(self.ask(Trace(timeout)))

    def transfers(self) -> xr.Dataset:
        return transfers_dataset(self.ask(Transfers()))

    def diagnose(self) -> Diagnosis:
        return Diagnosis.from_reply(self.ask(Diagnose()))

    def reset_observations(self) -> None:
        self.ask(ResetObservations())

    def wait_idle(self, timeout: Any = "10s") -> dict[str, Any]:
        return dict(self.ask(WaitIdle(timeout)))

    async def waiting_for(self, pid: str) -> str:
        """A sentence on what program ``pid`` waits for, for timeout messages (event loop)."""
        try:
            waits = Diagnosis.from_reply(await ask(self.dask.scheduler, Diagnose())).waiting(pid)
        except Exception as e:  # noqa: BLE001 - the timeout is the error; this only explains it
            return f"(Its state could not be read: {type(e).__name__}: {e})"
        if not waits:
            return "No device is waiting inside it: it waits for its slot or for earlier programs."
        return "Waiting: " + "; ".join(describe(s) for s in waits)


class Observed:
    """What a client or a system shows of the devices: each method asks its :class:`Observer`."""

    @property
    def _observer(self) -> Observer:
        raise NotImplementedError

    def devices(self) -> list[dict[str, Any]]:
        """Every device with its island, host, slices and state."""
        return self._observer.devices()

    def device_stats(self) -> dict[str, Any]:
        """Per device bytes in use, capacity, peak, busy time and gangs run; per link class and
        per host NIC (``"island/host"``, ``send`` and ``recv``): bytes, transfers, busy seconds
        and the longest queue."""
        return self._observer.device_stats()

    def trace(self, timeout: Any = "10s") -> xr.Dataset:
        """Device activity as an ``xarray.Dataset`` (dims ``device`` x ``event``), every client's.

        Programs running when it is called are waited for (up to ``timeout``), so
        that their gangs are in it. ``trace.pathdask.plot()`` draws it; see
        :mod:`pathdask.dashboard.trace` for its variables.
        """
        return self._observer.trace(timeout)

    def transfers(self) -> xr.Dataset:
        """Recent modelled transfers between devices, every client's: an ``xarray.Dataset``
        with dim ``transfer`` (see :func:`pathdask.dashboard.trace.transfers_dataset`)."""
        return self._observer.transfers()

    def diagnose(self) -> Diagnosis:
        """What every device is doing or waiting for, and every client's queue.

        ``print(system.diagnose())`` is the first thing to read when a notebook seems stuck.

        Examples
        --------
        >>> print(client.diagnose())    # doctest: +SKIP
        devices:
          device 0 (island 0 host 0): waiting for pieces from devices [2] in collective #0 of ...
        """
        return self._observer.diagnose()

    def reset_observations(self) -> None:
        """Forget the recorded idle gaps, timelines and transfers on every host."""
        self._observer.reset_observations()

    def wait_idle(self, timeout: Any = "10s") -> dict[str, Any]:
        """Wait until no device holds a buffer; returns the stats, or raises ``TimeoutError``."""
        return self._observer.wait_idle(timeout)
