"""The plots of the dashboard's pages. Each has a ``root`` layout and an ``update()``.

They read the scheduler plugin's state through :mod:`.views`, on the scheduler's
event loop (where Bokeh's server runs their periodic callbacks), and mark the
dashboard as watched so that the activity record keeps being pulled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    DataRange1d,
    FixedTicker,
    HoverTool,
    LogColorMapper,
    NumeralTickFormatter,
    Range1d,
)
from bokeh.models.widgets import DataTable, Div, NumberFormatter, TableColumn
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from ..topology import LINK_CLASSES
from . import views
from .gantt import FIELDS, bars, gantt_figure, palette, set_devices
from .record import columns

#: rows a browser keeps of the timeline (older bars scroll out of its window anyway)
TIMELINE_ROWS = 10_000
LINK_COLORS = {"same_host": "#1f77b4", "ici": "#ff7f0e", "dcn": "#2ca02c"}
IDLE = "#dddddd"
#: page kind -> (signature, view): every open session of a page shares one computation
#: (all run on the scheduler's event loop)
_VIEWS: dict[str, tuple[Any, dict[str, Any]]] = {}


class Component:
    """A plot fed by the scheduler plugin; ``update()`` runs on the scheduler's event loop.

    A page calls ``update()`` once after building its component (the first draw),
    then on every tick of its periodic callback.
    """

    root: Any

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        self.plugin = plugin
        self.collector = plugin.activity
        self.record = self.collector.record

    def colors(self) -> dict[str, str]:
        return palette(list(self.record.names))

    def update(self) -> None:
        """Redraw, unless nothing changed since the last draw (an idle system costs nothing)."""
        self.collector.watch()
        seen = self.signature()
        if seen == getattr(self, "_drawn", None):
            return
        self._drawn = seen
        self.draw()

    def signature(self) -> Any:
        """What a redraw depends on: the record's version, and the clients and slices."""
        return self.record.version, len(self.plugin.clients), len(self.plugin.resources.slices)

    def view(self, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """This page's view of the current state, computed once for every open copy of the page."""
        key = (id(self.plugin), self.signature())
        cached = _VIEWS.get(type(self).__name__)
        if cached is None or cached[0] != key:
            cached = _VIEWS[type(self).__name__] = (key, compute())
        return cached[1]

    def draw(self) -> None:
        raise NotImplementedError


class Timeline(Component):
    """Gangs per device over the last ``pathdask.dashboard.window``, streamed as they are pulled."""

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        super().__init__(plugin)
        self.source = ColumnDataSource({f: [] for f in FIELDS})
        self.devices = self.record.devices()
        window_ms = self.collector.window * 1e3
        self.root = gantt_figure(self.source, self.devices, x_range=DataRange1d(
            follow="end", follow_interval=window_ms, range_padding=0, only_visible=True), **kwargs)
        gangs = self.record.since(self.record.updated - self.collector.window) if self.record.updated else []
        self.cursor = self.record.total
        self._stream(gangs)

    def _stream(self, gangs: list[Any]) -> None:
        if gangs:
            new: dict[str, Any] = bars(columns(gangs), self.record.names, self.colors())
            self.source.stream(new, rollover=TIMELINE_ROWS)

    def draw(self) -> None:
        gangs, self.cursor = self.record.after(self.cursor)
        self._stream(gangs)
        devices = self.record.devices()
        if devices != self.devices:
            self.devices = devices
            set_devices(self.root, devices)


class Memory(Component):
    """HBM in use per device, split by owning client, against its capacity (outline) and peak (red)."""

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        super().__init__(plugin)
        self.parts = ColumnDataSource({k: [] for k in ("left", "right", "bottom", "top", "device", "client",
                                                       "bytes", "color")})
        self.limits = ColumnDataSource({k: [] for k in ("device", "capacity", "peak", "in_use", "bottom", "top")})
        fig = figure(title="HBM per device (colour: owning client; outline: capacity; red: peak)",
                     x_axis_label="bytes", y_axis_label="device", tools="save,reset", height=360,
                     y_range=DataRange1d(flipped=True), **kwargs)
        fig.quad(source=self.limits, left=0, right="capacity", bottom="bottom", top="top", fill_alpha=0,
                 line_color="black")
        bars_ = fig.quad(source=self.parts, left="left", right="right", bottom="bottom", top="top",
                         fill_color="color", line_color="white", legend_field="client")
        fig.segment(source=self.limits, x0="peak", x1="peak", y0="bottom", y1="top", color="red", line_width=3)
        fig.add_tools(HoverTool(renderers=[bars_], tooltips=[("device", "@device"), ("client", "@client"),
                                                             ("bytes", "@bytes{0.0 b}")]))
        fig.xaxis.formatter = NumeralTickFormatter(format="0.0 b")
        fig.add_layout(fig.legend[0], "right")
        self.root = fig

    def draw(self) -> None:
        view = self.view(lambda: views.memory(self.record))
        colors = self.colors()
        parts: dict[str, list[Any]] = {k: [] for k in self.parts.data}
        limits: dict[str, list[Any]] = {k: [] for k in self.limits.data}
        for dev in view["devices"]:
            d, left = dev["device"], 0
            pieces = [(self.record.name(c), n, colors.get(c, IDLE)) for c, n in sorted(dev["by_client"].items())]
            if dev["in_flight"]:
                pieces.append(("(allocated by running gangs)", dev["in_flight"], "#999999"))
            for name, n, color in pieces:
                for k, v in (("left", left), ("right", left + n), ("bottom", d - 0.4), ("top", d + 0.4),
                             ("device", d), ("client", name), ("bytes", n), ("color", color)):
                    parts[k].append(v)
                left += n
            for k, v in (("device", d), ("capacity", dev["capacity"]), ("peak", dev["peak"]),
                         ("in_use", dev["bytes_in_use"]), ("bottom", d - 0.45), ("top", d + 0.45)):
                limits[k].append(v)
        self.parts.data, self.limits.data = parts, limits
        set_devices(self.root, limits["device"])


class Links(Component):
    """Bytes per second per link class over time, and bytes moved per (source, destination) pair."""

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        super().__init__(plugin)
        self.rates = ColumnDataSource({"time": [], **{c: [] for c in LINK_CLASSES}})
        rate = figure(title="link throughput per class", x_axis_type="datetime", y_axis_label="bytes/s",
                      tools="xpan,xwheel_zoom,reset,save", height=300, **kwargs)
        for c in LINK_CLASSES:
            rate.line(source=self.rates, x="time", y=c, color=LINK_COLORS.get(c, "black"), line_width=2,
                      legend_label=c)
        rate.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
        rate.legend.location = "top_left"
        self.matrix = ColumnDataSource({k: [] for k in ("src", "dst", "bytes", "shown")})
        self.mapper = LogColorMapper(palette=Viridis256, low=1, high=2, low_color="#f4f4f4")
        grid = figure(title="bytes moved, source device x destination device", x_axis_label="source device",
                      y_axis_label="destination device", tools="save", height=420, width=460, match_aspect=True,
                      y_range=DataRange1d(flipped=True))
        cells = grid.rect(source=self.matrix, x="src", y="dst", width=0.95, height=0.95,
                          fill_color={"field": "shown", "transform": self.mapper}, line_color=None)
        grid.add_tools(HoverTool(renderers=[cells], tooltips=[("from", "@src"), ("to", "@dst"),
                                                              ("bytes", "@bytes{0.0 b}")]))
        self.rate, self.grid = rate, grid
        self.root = column(rate, grid, **kwargs)

    def draw(self) -> None:
        view = self.view(lambda: views.links(self.record))
        rates = view["rates"]
        self.rates.data = {"time": [t * 1e3 for t in rates["time"]], **{c: rates[c] for c in LINK_CLASSES}}
        devices = view["devices"]
        moved = {(p["src"], p["dst"]): p["bytes"] for p in view["pairs"]}
        cells = [(s, d, moved.get((s, d), 0)) for s in devices for d in devices]
        self.matrix.data = {"src": [c[0] for c in cells], "dst": [c[1] for c in cells],
                            "bytes": [c[2] for c in cells], "shown": [max(c[2], 0.5) for c in cells]}
        self.mapper.high = max([2, *moved.values()])
        ticks = FixedTicker(ticks=devices)
        self.grid.xaxis.ticker, self.grid.yaxis.ticker = ticks, ticks


class Queue(Component):
    """Per client: programs waiting, slotted and done; weight, target share and measured share."""

    FIELDS = ("name", "weight", "waiting", "slotted", "done", "target_share", "measured_share")

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        super().__init__(plugin)
        self.table_source = ColumnDataSource({f: [] for f in self.FIELDS})
        share = NumberFormatter(format="0.0%")
        table = DataTable(source=self.table_source, height=160, index_position=None, reorderable=False, columns=[
            TableColumn(field="name", title="client"), TableColumn(field="weight", title="weight"),
            TableColumn(field="waiting", title="waiting"), TableColumn(field="slotted", title="slotted"),
            TableColumn(field="done", title="done"),
            TableColumn(field="target_share", title="target share", formatter=share),
            TableColumn(field="measured_share", title="measured share", formatter=share)], **kwargs)
        self.bars = ColumnDataSource({k: [] for k in ("x", "share", "kind", "name", "color", "alpha")})
        fig = figure(title=f"share of device time over the last {self.collector.window:g}s "
                           "(light: target, dark: measured)",
                     y_axis_label="share", tools="save", height=300, y_range=Range1d(start=0, end=1), **kwargs)
        fig.vbar(source=self.bars, x="x", top="share", width=0.38, fill_color="color", line_color="black",
                 fill_alpha="alpha")
        fig.add_tools(HoverTool(tooltips=[("client", "@name"), ("", "@kind"), ("share", "@share{0.0%}")]))
        fig.yaxis.formatter = NumeralTickFormatter(format="0%")
        self.fig = fig
        self.policy = Div()
        self.root = column(self.policy, table, fig, **kwargs)

    def signature(self) -> Any:
        return super().signature(), repr(self.plugin.order.by_client())

    def draw(self) -> None:
        view = self.view(lambda: views.queue(self.plugin, self.record, self.collector.window))
        rows = view["clients"]
        self.policy.text = f"<b>policy</b>: {view['policy']}; {len(rows)} client(s)"
        self.table_source.data = {f: [r[f] for r in rows] for f in self.FIELDS}
        colors = self.colors()
        bars: dict[str, list[Any]] = {k: [] for k in ("x", "share", "kind", "name", "color", "alpha")}
        for i, r in enumerate(rows):
            for dx, kind, alpha in ((-0.2, "target", 0.35), (0.2, "measured", 1.0)):
                for k, v in (("x", i + dx), ("share", r[f"{kind}_share"]), ("kind", kind), ("name", r["name"]),
                             ("color", colors.get(r["client"], IDLE)), ("alpha", alpha)):
                    bars[k].append(v)
        self.bars.data = bars
        self.fig.xaxis.ticker = FixedTicker(ticks=list(range(len(rows))))
        self.fig.xaxis.major_label_overrides = {i: r["name"] for i, r in enumerate(rows)}


class Resources(Component):
    """Islands > hosts > devices, coloured by the client whose slices use them; the slices as a table."""

    def __init__(self, plugin: Any, **kwargs: Any) -> None:
        super().__init__(plugin)
        topo = plugin.topology
        self.cells = ColumnDataSource({k: [] for k in ("x", "y", "id", "label", "island", "host", "address",
                                                       "slices", "owners", "color")})
        width = topo.islands * (topo.hosts_per_island + 1)
        fig = figure(title=f"islands > hosts > devices ({topo.describe()})", tools="save", height=
                     max(200, 60 * topo.devices_per_host + 100), x_range=Range1d(start=-0.6, end=width - 0.9),
                     y_range=Range1d(start=topo.devices_per_host - 0.4, end=-0.6), **kwargs)
        rects = fig.rect(source=self.cells, x="x", y="y", width=0.9, height=0.85, fill_color="color",
                         line_color="black")
        fig.text(source=self.cells, x="x", y="y", text="label", text_align="center", text_baseline="middle",
                 text_font_size="10pt")
        fig.add_tools(HoverTool(renderers=[rects], tooltips=[
            ("device", "@id"), ("island", "@island"), ("host", "@host"), ("worker", "@address"),
            ("slices", "@slices"), ("owners", "@owners")]))
        fig.xaxis.ticker = FixedTicker(ticks=[i * (topo.hosts_per_island + 1) + h for i in range(topo.islands)
                                              for h in range(topo.hosts_per_island)])
        fig.xaxis.major_label_overrides = {i * (topo.hosts_per_island + 1) + h: f"island {i} host {h}"
                                           for i in range(topo.islands) for h in range(topo.hosts_per_island)}
        fig.yaxis.visible = False
        self.slices = ColumnDataSource({k: [] for k in ("id", "name", "shape", "devices")})
        table = DataTable(source=self.slices, height=200, index_position=None, reorderable=False, columns=[
            TableColumn(field="id", title="slice"), TableColumn(field="name", title="owner"),
            TableColumn(field="shape", title="mesh shape"), TableColumn(field="devices", title="devices")],
            **kwargs)
        self.root = column(fig, table, **kwargs)

    def draw(self) -> None:
        view = self.view(lambda: views.resources(self.plugin))
        span = self.plugin.topology.hosts_per_island + 1
        colors = self.colors()
        cells: dict[str, list[Any]] = {k: [] for k in self.cells.data}
        for isl in view["islands"]:
            for host in isl["hosts"]:
                for dev in host["devices"]:
                    owners, clients = dev["owners"], dev["clients"]
                    color = colors.get(clients[0], IDLE) if len(clients) == 1 else "#bbbbbb" if clients else IDLE
                    row = {"x": isl["island"] * span + host["host"], "y": dev["index"], "id": dev["id"],
                           "label": f"d{dev['id']}" + ("" if dev["live"] else " (gone)")
                                    + "".join(f"\n{o}" for o in owners),
                           "island": isl["island"], "host": host["host"], "address": host["address"] or "-",
                           "slices": ", ".join(dev["slices"]) or "-", "owners": ", ".join(owners) or "-",
                           "color": color if dev["live"] else "white"}
                    for k, v in row.items():
                        cells[k].append(v)
        self.cells.data = cells
        sl = view["slices"]
        self.slices.data = {"id": [s["id"] for s in sl], "name": [s["name"] for s in sl],
                            "shape": [" x ".join(f"{a}={n}" for a, n in s["shape"].items()) for s in sl],
                            "devices": [", ".join(map(str, s["devices"])) for s in sl]}
