"""The device Gantt chart: one row per device, one bar per gang, coloured by client.

The timeline page and a trace's ``.pathdask.plot()`` both draw with this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, DataRange1d, FixedTicker, HoverTool
from bokeh.palettes import Category10_10, Category20_20
from bokeh.plotting import figure

#: the columns of a Gantt chart's data source
FIELDS = ("left", "right", "bottom", "top", "device", "client", "program", "gang", "duration_ms",
          "bytes_in", "bytes_out", "color")

TOOLTIPS = [("program", "@program"), ("gang", "@gang"), ("client", "@client"), ("device", "@device"),
            ("duration", "@duration_ms{0.000} ms"), ("bytes in/out", "@bytes_in / @bytes_out")]


def palette(clients: Sequence[str]) -> dict[str, str]:
    """A colour per client, in the order given (the order clients were first seen)."""
    colors = Category10_10 if len(clients) <= 10 else Category20_20
    return {c: colors[i % len(colors)] for i, c in enumerate(clients)}


def bars(gangs: Mapping[str, Sequence[Any]], names: Mapping[str, str], colors: Mapping[str, str]) -> dict[str, Any]:
    """A Gantt data source's columns from gangs as columns (``device``, ``start``, ``end`` in
    wall-clock seconds, ``program``, ``gang``, ``client``, ``bytes_in``, ``bytes_out``, ``name``).

    Numbers are NumPy arrays, which Bokeh sends to the browser as binary, not as JSON lists.
    """
    start, end = np.asarray(gangs["start"], dtype=float), np.asarray(gangs["end"], dtype=float)
    device = np.asarray(gangs["device"], dtype=float)
    return {
        "left": start * 1e3,  # Bokeh's datetime axis counts milliseconds
        "right": end * 1e3,
        "bottom": device - 0.4,
        "top": device + 0.4,
        "device": device.astype(int),
        "client": [names.get(c, c) for c in gangs["client"]],
        "program": [f"{n} ({p})" if n else p for n, p in zip(gangs["name"], gangs["program"])],
        "gang": list(gangs["gang"]),
        "duration_ms": (end - start) * 1e3,
        "bytes_in": np.asarray(gangs["bytes_in"], dtype=np.int64),
        "bytes_out": np.asarray(gangs["bytes_out"], dtype=np.int64),
        "color": [colors.get(c, "#888888") for c in gangs["client"]],
    }


def gantt_figure(source: ColumnDataSource, devices: Sequence[int], **kwargs: Any) -> Any:
    """A Bokeh figure drawing ``source`` (columns :data:`FIELDS`) with a row per device."""
    kwargs.setdefault("height", max(300, 50 * len(devices) + 160))
    kwargs.setdefault("title", "device timeline (colour: client)")
    kwargs.setdefault("y_range", DataRange1d())
    kwargs["y_range"].flipped = True  # device 0 on top, as a list reads
    fig = figure(x_axis_type="datetime", y_axis_label="device", tools="xpan,xwheel_zoom,box_zoom,reset,save",
                 **kwargs)
    fig.quad(source=source, left="left", right="right", bottom="bottom", top="top", fill_color="color",
             line_color="color", legend_field="client")
    fig.add_tools(HoverTool(tooltips=TOOLTIPS, point_policy="follow_mouse"))
    set_devices(fig, devices)
    legend = fig.legend[0]
    if len(set(source.data["client"])) <= 8:
        legend.orientation = "horizontal"
        fig.add_layout(legend, "above")  # above the rows, never over a bar
    else:
        fig.add_layout(legend, "right")  # many labels: a column beside the rows
    return fig


def set_devices(fig: Any, devices: Sequence[int]) -> None:
    """Label the y axis with one tick per device."""
    fig.yaxis.ticker = FixedTicker(ticks=list(devices))
    fig.yaxis.major_label_overrides = {d: f"device {d}" for d in devices}


def transfer_rows(fig: Any, transfers: Any, devices: Sequence[int]) -> None:
    """Add a row per receiving device below the devices, with the modelled DCN transfers
    into it (``transfers`` is a ``client.transfers()`` Dataset)."""
    dcn = transfers.where(transfers.link == "dcn", drop=True) if transfers.sizes["transfer"] else transfers
    if not dcn.sizes["transfer"]:
        return
    dst = dcn.dst.values.astype(int)
    base = max(devices, default=-1) + 1
    row = {d: base + i for i, d in enumerate(sorted(set(dst.tolist())))}
    y = np.array([row[d] for d in dst], dtype=float)
    start = dcn.start.values.astype("datetime64[ns]").astype(np.int64) / 1e6
    end = dcn.end.values.astype("datetime64[ns]").astype(np.int64) / 1e6
    source = ColumnDataSource({"left": start, "right": end, "bottom": y - 0.3, "top": y + 0.3,
                               "dst": dst, "src": dcn.src.values.astype(int),
                               "bytes": dcn["bytes"].values.astype(np.int64)})
    fig.quad(source=source, left="left", right="right", bottom="bottom", top="top", fill_color="#222222",
             fill_alpha=0.35, line_color="#222222", legend_label="DCN transfer")
    fig.yaxis.ticker = FixedTicker(ticks=[*devices, *row.values()])
    fig.yaxis.major_label_overrides = {**fig.yaxis.major_label_overrides,  # set_devices' labels
                                       **{r: f"DCN into device {d}" for d, r in row.items()}}
