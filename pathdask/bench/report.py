"""Tables, JSON and Bokeh plots shared by the benchmarks."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any


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


def idle_gaps(timeline: dict[int, list[Any]]) -> list[float]:
    """Idle time between consecutive gangs of one program on each device."""
    gaps = []
    for spans in timeline.values():
        spans = sorted(spans)
        for a, b in zip(spans, spans[1:]):
            if a[2] == b[2]:  # same program
                gaps.append(max(0.0, b[0] - a[1]))
    return gaps


def save_plots(path: str, title: str, curves: list[dict[str, Any]],
               timeline: dict[int, list[Any]] | None = None, names: dict[str, str] | None = None) -> str:
    """Save line plots (``{"title", "x_label", "y_label", "series": {name: (xs, ys)}, "log_x"}``)
    and optionally a device timeline (coloured by client, named by ``names``), as one Bokeh HTML file."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource
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
    if timeline:
        t0 = min(s for spans in timeline.values() for s, *_ in spans) if any(timeline.values()) else 0.0
        names = names or {}
        clients = sorted({t[4] for spans in timeline.values() for t in spans})
        colors = {c: Category10_10[i % 10] for i, c in enumerate(clients)}
        src: dict[str, list[Any]] = {k: [] for k in ("left", "right", "bottom", "top", "gang", "client", "color")}
        for dev, spans in timeline.items():
            for t in spans:
                src["left"].append((t[0] - t0) * 1e3)
                src["right"].append((t[1] - t0) * 1e3)
                src["bottom"].append(dev - 0.4)
                src["top"].append(dev + 0.4)
                src["gang"].append(t[3])
                src["client"].append(names.get(t[4], t[4]))
                src["color"].append(colors[t[4]])
        fig = figure(title="device timeline (colour: client)", x_axis_label="ms", y_axis_label="device",
                     width=800, height=300, tooltips=[("gang", "@gang"), ("client", "@client")])
        fig.quad(source=ColumnDataSource(src), left="left", right="right", bottom="bottom", top="top",
                 color="color")
        figs.append(fig)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(file_html(column(*figs), INLINE, title))
    return path
