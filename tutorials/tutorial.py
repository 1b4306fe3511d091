"""What the tutorial notebooks share: links to pathdask's dashboard pages, and a device timeline.

Notebooks import it as ``from tutorial import ...``; they run from this folder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urljoin

__all__ = ["PAGES", "dashboard_pages", "gantt"]

#: pathdask's pages on the Dask dashboard, under ``/pathdask/<page>``
PAGES = ("timeline", "memory", "links", "queue", "resources")


def dashboard_pages(dashboard_link: str | None, pages: Sequence[str] = PAGES) -> Any:
    """Links to pathdask's dashboard ``pages`` on the dashboard at ``dashboard_link``, as Markdown.

    ``dashboard_link`` is ``system.dashboard_link`` (or a Dask client's); ``None``
    means the system runs without a dashboard.
    """
    from IPython.display import Markdown

    if not dashboard_link:
        return Markdown("This system runs without a dashboard.")
    rows = [f"- [{page}]({urljoin(dashboard_link, f'/pathdask/{page}')})" for page in pages]
    return Markdown("\n".join([f"Dask's dashboard: <{dashboard_link}>; pathdask's pages:", *rows]))


def gantt(timeline: Mapping[int, Sequence[Sequence[Any]]], names: Mapping[str, str] | None = None,
          title: str = "device timeline (colour: client)", width: int = 760) -> Any:
    """A Bokeh Gantt chart of ``client.timeline()``: one row per device, one bar per gang.

    ``timeline`` maps a device to its ``(start, end, program, gang, client id)``
    spans; ``names`` maps client ids to the names shown. Show the figure with
    ``bokeh.io.show``.
    """
    from bokeh.models import ColumnDataSource
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    names = dict(names or {})
    spans = [(dev, *span) for dev, items in timeline.items() for span in items]
    t0 = min((s[1] for s in spans), default=0.0)
    clients = sorted({s[5] for s in spans}, key=lambda c: names.get(c, c))
    colour = {c: Category10_10[i % 10] for i, c in enumerate(clients)}
    data: dict[str, list[Any]] = {k: [] for k in ("left", "right", "device", "gang", "program", "client", "color")}
    for dev, start, end, program, gang, client in spans:
        data["left"].append((start - t0) * 1e3)
        data["right"].append((end - t0) * 1e3)
        data["device"].append(int(dev))
        data["gang"].append(gang)
        data["program"].append(program[:8])
        data["client"].append(names.get(client, client))
        data["color"].append(colour[client])
    devices = sorted({int(d) for d in timeline})
    fig = figure(title=title, x_axis_label="ms", y_axis_label="device", width=width,
                 height=60 + 30 * max(1, len(devices)),
                 tooltips=[("gang", "@gang"), ("program", "@program"), ("client", "@client")])
    fig.hbar(source=ColumnDataSource(data), y="device", left="left", right="right", height=0.8,
             color="color", legend_field="client")
    fig.yaxis.ticker = devices
    fig.y_range.flipped = True
    fig.legend.orientation = "horizontal"
    fig.legend.location = "top_right"
    return fig
