"""``pathdask simulate validate``: the simulation beside real runs of the same configurations.

Real runs use the benchmarks' own functions on a real ``LocalSystem(processes=False)``
(the default topology for dispatch and tenancy, ``bench pipeline``'s for the
pipeline); the simulation runs the same programs with the embedded cost model
(:meth:`CostModel.embedded`: one shared processor, as in that one process).
Each row gives both numbers and the relative error; the worst is reported.

A real rate is the best of :data:`REAL_RUNS` runs, as the benchmarks report
theirs: a machine slowed from outside only ever makes a run slower. Shares are
the mean of the runs; a pipeline's seconds per step are over that many steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .. import P
from ..bench import pipeline as bench_pipeline
from ..bench import tenancy as bench_tenancy
from ..bench.dispatch import Kernels, _mc_run, _pathdask_run
from ..bench.report import table
from ..system import LocalSystem, default_topology
from .model import CostModel
from .transformer import pipeline_seconds, spmd_seconds
from .workloads import dispatch_programs, dispatch_rate, shares, throughput

Echo = Callable[[str], Any]

#: real runs per row (one with ``small``)
REAL_RUNS = 3


def _runs(small: bool) -> int:
    return 1 if small else REAL_RUNS


def _row(rows: list[dict[str, Any]], name: str, real: float, sim: float, echo: Echo) -> None:
    err = abs(sim - real) / real if real else math.inf
    rows.append({"configuration": name, "real": real, "simulated": sim, "relative_error": err})
    echo(f"  {name}: real {real:,.4g}, simulated {sim:,.4g} ({err:.1%})")


def dispatch_rows(costs: CostModel, small: bool, echo: Echo) -> list[dict[str, Any]]:
    topology = default_topology()
    rows: list[dict[str, Any]] = []
    k = 16 if small else 64
    grid = (1e-3, 1e-2) if small else (1e-3, 3e-3, 1e-2)
    with LocalSystem(topology, processes=False, dashboard_address=None) as system:
        client = system.client(name="validate")
        mesh = client.mesh({"x": topology.devices_per_island}, island=0)
        x = client.put(np.zeros(mesh.size), mesh, P("x"))
        x.result()
        for cost in grid:
            kernels = Kernels(cost, k)
            programs = dispatch_programs(topology, cost, k)
            for shape in ("OpByOp", "Chained", "Fused"):
                for system_name, run in (
                        ("pathdask", lambda s=shape, kn=kernels: _pathdask_run(kn, x, s, "parallel")),
                        ("multi-controller", lambda s=shape, kn=kernels: _mc_run(client, kn, x, s))):
                    run()  # warm-up: traces, plans, connections
                    real = k / min(run() for _ in range(_runs(small)))
                    sim, _ = dispatch_rate(topology, costs, programs, shape, k, system_name)
                    _row(rows, f"dispatch {system_name} {shape} {cost * 1e3:g} ms", real, sim, echo)
        client.close()
    return rows


def tenancy_rows(costs: CostModel, small: bool, echo: Echo) -> list[dict[str, Any]]:
    topology = default_topology()
    cfg = bench_tenancy.Config.small() if small else bench_tenancy.Config()
    rows: list[dict[str, Any]] = []
    with LocalSystem(topology, processes=False, dashboard_address=None, policy="proportional") as system:
        for weights in cfg.weights:
            runs = [bench_tenancy._shares(system, cfg, weights, echo)["share"] for _ in range(_runs(small))]
            real = [float(np.mean(col)) for col in zip(*runs)]  # shares: the mean of the runs
            sim, _ = shares(topology, costs, weights, cfg.gang_cost, cfg.gangs_per_program, cfg.inflight,
                            cfg.share_seconds)
            label = ":".join(f"{w:g}" for w in weights)
            _row(rows, f"tenancy share of the heaviest client, weights {label}", real[-1], sim[-1], echo)
        for n in cfg.clients:
            cost = cfg.costs[0]
            real_rate = max(bench_tenancy._throughput(system, n, cost, cfg.throughput_seconds)
                            for _ in range(_runs(small)))
            sim_rate, _ = throughput(topology, costs, n, cost, cfg.throughput_seconds)
            _row(rows, f"tenancy {n} client(s) waiting on results, {cost * 1e3:g} ms: calls/s", real_rate,
                 sim_rate, echo)
    return rows


def pipeline_rows(costs: CostModel, small: bool, echo: Echo) -> list[dict[str, Any]]:
    cfg = replace(bench_pipeline.Config.small(), steps=_runs(small))
    b = bench_pipeline.Bench(cfg)
    topology = bench_pipeline._topology(cfg, 1)
    rows: list[dict[str, Any]] = []
    with LocalSystem(topology, processes=False, dashboard_address=None) as system:
        client = system.client(name="validate")
        real = bench_pipeline.spmd(b, client)
        _row(rows, f"pipeline bench SPMD on {cfg.devices} devices: s/step", real, spmd_seconds(b, topology, costs), echo)
        for s in cfg.stages:
            real = bench_pipeline.pipelined(b, client, s, 1)[0]
            _row(rows, f"pipeline bench S={s} M={4 * s}: s/step", real, pipeline_seconds(b, topology, costs, s), echo)
        client.close()
    return rows


def validate(costs: CostModel | None = None, small: bool = False, echo: Echo = print) -> dict[str, Any]:
    """Every row, the table and the worst relative error."""
    costs = (costs or CostModel.load()).embedded()
    start = time.perf_counter()
    echo("pathdask simulate validate: real embedded runs beside the simulation of the same")
    rows = dispatch_rows(costs, small, echo) + tenancy_rows(costs, small, echo) + pipeline_rows(costs, small, echo)
    echo(table(["configuration", "real", "simulated", "relative error"],
               [[r["configuration"], r["real"], r["simulated"], f"{r['relative_error']:.1%}"] for r in rows]))
    worst = max(rows, key=lambda r: r["relative_error"])
    echo(f"worst: {worst['configuration']}, {worst['relative_error']:.1%}")
    return {"rows": rows, "worst": worst, "seconds": time.perf_counter() - start, "costs": costs.to_dict()}
