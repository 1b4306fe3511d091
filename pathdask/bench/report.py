"""Tables, JSON and Bokeh plots shared by the benchmarks."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import xarray as xr

from ..dashboard.trace import gangs_of, to_dataset


def best_rate(run: Callable[[], float], count: int, repeats: int) -> float:
    """Computations per second of the fastest of ``repeats`` runs; ``run`` returns seconds."""
    return count / min(run() for _ in range(repeats))


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def write_json(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def window(trace: xr.Dataset, since: float | None = None, until: float | None = None,
           gang: str | None = None) -> xr.Dataset:
    """The gangs of a trace (``client.trace()``) that started at or after ``since`` and before
    ``until`` (wall-clock seconds, ``time.time()``), named ``gang`` if given; a trace again."""
    cols = gangs_of(trace)
    keep = [i for i, (s, g) in enumerate(zip(cols["start"], cols["gang"]))
            if (since is None or s >= since) and (until is None or s < until) and (gang is None or g == gang)]
    names = {str(i): str(n) for i, n in zip(trace["client_id"].values.ravel(), trace["client"].values.ravel()) if i}
    return to_dataset({"gangs": {k: [v[i] for i in keep] for k, v in cols.items()}, "clients": names,
                       "devices": [int(d) for d in trace["device"].values]})


def idle_gaps(trace: xr.Dataset) -> list[float]:
    """Idle time between consecutive gangs of one program on each device of a trace."""
    cols = gangs_of(trace)
    spans: dict[int, list[tuple[float, float, str]]] = {}
    for d, s, e, p in zip(cols["device"], cols["start"], cols["end"], cols["program"]):
        spans.setdefault(d, []).append((s, e, p))
    gaps = []
    for device in spans.values():
        device.sort()
        for a, b in zip(device, device[1:]):
            if a[2] == b[2]:  # same program
                gaps.append(max(0.0, b[0] - a[1]))
    return gaps


def save_plots(path: str, title: str, curves: list[dict[str, Any]], trace: xr.Dataset | None = None) -> str:
    """Save line plots (``{"title", "x_label", "y_label", "series": {name: (xs, ys)}, "log_x"}``)
    and optionally a trace's device timeline (coloured by client), as one Bokeh HTML file."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    figs = []
    for c in curves:
        fig = figure(title=c["title"], x_axis_label=c["x_label"], y_axis_label=c["y_label"],
                     x_axis_type="log" if c.get("log_x") else "linear", width=800, height=350)
        for color, (name, (xs, ys)) in zip(Category10_10 * 3, c["series"].items()):
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                fig.line([p[0] for p in pts], [p[1] for p in pts], legend_label=name, color=color, line_width=2)
                fig.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, size=6)
        if fig.renderers:  # a plot with no points has no legend to place
            fig.legend.location = "top_left"
        figs.append(fig)
    if trace is not None and trace.sizes["event"]:
        figs.append(trace.pathdask.plot(width=800, height=300, sizing_mode="fixed"))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(file_html(column(*figs), INLINE, title))
    return path
