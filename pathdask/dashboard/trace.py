"""Traces: the scheduler's record of device activity as an ``xarray.Dataset``.

``Client.trace()`` and ``LocalSystem.trace()`` return one; ``trace.pathdask.plot()``
draws it as the dashboard's timeline page does (a Bokeh figure that shows
inline in a notebook).

Examples
--------
>>> trace = system.trace()
>>> trace.sizes                                   # {'device': 8, 'event': ...}
>>> (trace.end - trace.start).sum("event")        # busy time per device
>>> trace.where(trace.client == "alice", drop=True)
>>> bokeh.plotting.show(trace.pathdask.plot())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from .record import COLUMNS

#: the variables of a trace, each with dims (device, event)
VARIABLES = ("start", "end", "program", "name", "gang", "client", "client_id", "bytes_in", "bytes_out")


def to_dataset(view: dict[str, Any]) -> xr.Dataset:
    """A trace from the ``timeline`` view (what ``pathdask_trace`` answers).

    Dims are ``device`` (every device the system has or ran a gang on) and
    ``event`` (a device's gangs in start order). ``start`` and ``end`` are
    ``datetime64[ns]`` wall-clock times (``NaT`` past a device's last gang);
    ``program`` (id), ``name`` (the program's), ``gang``, ``client`` (its name)
    and ``client_id`` are strings (``""`` as padding); ``bytes_in`` and
    ``bytes_out`` are the bytes the device received from and sent to other
    devices during the gang (``NaN`` as padding).
    """
    gangs, names = view["gangs"], view["clients"]
    device = np.asarray(gangs["device"], dtype=int)
    devices = np.array(sorted(set(view["devices"]) | set(device.tolist())), dtype=int)
    order = np.lexsort((np.asarray(gangs["start"], dtype=float), device))  # by device, then start
    row = np.searchsorted(devices, device[order])
    first = np.searchsorted(row, np.arange(len(devices)))  # where each device's gangs begin
    col = np.arange(len(order)) - first[row]
    shape = (len(devices), int(col.max()) + 1 if len(col) else 0)

    def grid(values: Any, fill: Any, dtype: Any) -> np.ndarray:
        out = np.full(shape, fill, dtype=dtype)
        out[row, col] = np.asarray(values, dtype=dtype)[order] if len(order) else []
        return out

    seconds = {k: np.asarray(gangs[k], dtype=float) for k in ("start", "end")}
    data = {k: grid(np.round(v * 1e9).astype(np.int64).astype("datetime64[ns]"), np.datetime64("NaT"),
                    "datetime64[ns]") for k, v in seconds.items()}
    for k in ("program", "name", "gang"):
        data[k] = grid(gangs[k], "", object)
    data["client_id"] = grid(gangs["client"], "", object)
    data["client"] = grid([names.get(c, c) for c in gangs["client"]], "", object)
    for k in ("bytes_in", "bytes_out"):
        data[k] = grid(gangs[k], np.nan, float)
    dims = ("device", "event")
    return xr.Dataset({k: (dims, data[k]) for k in VARIABLES},
                      coords={"device": devices, "event": np.arange(shape[1])},
                      attrs={"title": "pathdask device activity"})


def transfers_dataset(rows: list[Any]) -> xr.Dataset:
    """Modelled transfers (what ``pathdask_transfers`` answers) as a Dataset with dim ``transfer``.

    ``start`` and ``end`` are the modelled times the transfer held the receiver's port
    and reached its memory (``datetime64[ns]``, wall clock); ``src`` and ``dst`` are
    device ids; ``link`` is ``"same_host"``, ``"ici"`` or ``"dcn"``; ``bytes`` the real
    bytes moved.
    """
    cols: list[Any] = list(zip(*rows)) if rows else [()] * 6
    times = {k: (np.round(np.asarray(v, dtype=float) * 1e9).astype(np.int64).astype("datetime64[ns]"))
             for k, v in zip(("start", "end"), cols[:2])}
    return xr.Dataset(
        {**{k: ("transfer", v) for k, v in times.items()},
         "src": ("transfer", np.asarray(cols[2], dtype=int)), "dst": ("transfer", np.asarray(cols[3], dtype=int)),
         "link": ("transfer", np.asarray(cols[4], dtype=object)),
         "bytes": ("transfer", np.asarray(cols[5], dtype=np.int64))},
        attrs={"title": "pathdask modelled transfers"})


def gangs_of(ds: xr.Dataset) -> dict[str, list[Any]]:
    """A trace's gangs as columns (the timeline view's ``gangs``), padding left out."""
    mask = ~np.isnat(ds["start"].values)
    rows, _ = np.nonzero(mask)  # row-major, as mask indexing orders them
    out: dict[str, list[Any]] = {"device": ds["device"].values[rows].astype(int).tolist()}
    for k in ("start", "end"):
        out[k] = (ds[k].values[mask].astype("datetime64[ns]").astype(np.int64) / 1e9).tolist()
    for k, var in (("program", "program"), ("gang", "gang"), ("name", "name"), ("client", "client_id")):
        out[k] = [str(v) for v in ds[var].values[mask]]
    for k in ("bytes_in", "bytes_out"):
        out[k] = ds[k].values[mask].astype(np.int64).tolist()
    return {c: out[c] for c in COLUMNS}


@xr.register_dataset_accessor("pathdask")
class TraceAccessor:
    """``trace.pathdask``: what pathdask adds to a trace Dataset."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def plot(self, color_by: Callable[[str], str] | None = None, colors: Mapping[str, str] | None = None,
             transfers: xr.Dataset | None = None, **kwargs: Any) -> Any:
        """The device Gantt chart of this trace (a Bokeh figure), as the timeline page draws it.

        Bars are coloured by client, or by ``color_by(gang name)`` (a label; ``colors``
        may give each label's colour). ``transfers`` (``client.transfers()``) adds a row
        per receiving device with the modelled DCN transfers into it. Other keyword arguments go to
        :func:`bokeh.plotting.figure` (``width``, ``title``, ...).

        Examples
        --------
        >>> trace.pathdask.plot(color_by=lambda gang: gang.split(".")[0])  # doctest: +SKIP
        """
        from bokeh.models import ColumnDataSource

        from .gantt import bars, gantt_figure, palette, transfer_rows

        gangs = gangs_of(self._ds)
        names = {str(i): str(n) for i, n in zip(self._ds["client_id"].values.ravel(),
                                                 self._ds["client"].values.ravel()) if i}
        if color_by is not None:  # the labels stand in for clients: colour and legend
            gangs["client"] = [color_by(g) for g in gangs["gang"]]
            names = {}
        labels = list(dict.fromkeys(gangs["client"]))
        source = ColumnDataSource(bars(gangs, names, {**palette(labels), **(colors or {})}))
        devices = [int(d) for d in self._ds["device"].values]
        kwargs.setdefault("sizing_mode", "stretch_width")
        fig = gantt_figure(source, devices, **kwargs)
        if transfers is not None:
            transfer_rows(fig, transfers, devices)
        return fig
