"""``pathdask simulate``: what the command line runs, and the JSON and Bokeh plots it writes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from ..bench.report import save_plots, write_json
from .measure import one_cpu
from .model import CostModel

Echo = Callable[[str], Any]


def run_simulate(what: str | None, calibrate: bool, costs_path: str | None, small: bool, programs: int, out: str,
                 echo: Echo = print, cpu: int | None = None) -> dict[str, Any]:
    """What ``pathdask simulate`` runs; ``cpu``: where calibration and validation measure
    (:func:`~.measure.one_cpu`)."""
    from . import figures
    from .calibrate import calibrate as do_calibrate
    from .validate import validate

    result: dict[str, Any] = {}
    measuring = calibrate or what in ("validate", "all")
    with one_cpu(cpu, echo) if measuring else nullcontext() as pinned:
        if measuring:
            result["cpu"] = pinned
        if calibrate:
            costs = do_calibrate(costs_path, k=16 if small else 64, repeats=1 if small else 5, echo=echo)
            result["calibration"] = costs.to_dict()
        costs = CostModel.load(costs_path)
        if what in ("validate", "all"):
            result["validate"] = validate(costs, small, echo)
    cluster = costs.cluster()
    plots: list[dict[str, Any]] = []
    if what in ("figure6", "all"):
        result["figure6"] = f6 = figures.figure6(cluster, small, echo)
        for name, v in f6.items():
            plots.append({"title": f"Figure 6, configuration {name}: computations/s by computation time",
                          "x_label": "modelled computation (s)", "y_label": "computations/s", "log_x": True,
                          "series": {s: (v["costs"], r) for s, r in v["rates"].items()}})
    if what in ("figure8", "all"):
        result["figure8"] = f8 = figures.figure8(cluster, small, echo)
        plots.append({"title": "Figure 8, configuration B: aggregate calls/s by clients", "x_label": "clients",
                      "y_label": "calls/s", "series": {f"{float(c) * 1e3:g} ms": (
                          [int(n) for n in v["clients"]], list(v["clients"].values())) for c, v in f8.items()}})
    if what in ("table2", "all"):
        result["table2"] = figures.paper_table2(cluster, small, echo)
    if what in ("speed", "all"):
        result["speed"] = figures.speed(cluster, 20 if small else programs, echo=echo)
    result["costs"] = costs.to_dict()
    name = what or "calibrate"
    write_json(f"{out}/simulate-{name}.json", result)
    if plots:
        html = save_plots(f"{out}/simulate-{name}.html", f"pathdask simulate {name}", plots)
        echo(f"wrote {out}/simulate-{name}.json and {html}")
    else:
        echo(f"wrote {out}/simulate-{name}.json")
    return result
