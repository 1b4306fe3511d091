"""The paper's Figure 6, Figure 8 and Table 2 at paper scale, and the speed run, on the cluster model.

- **Figure 6**: for configurations A (512 hosts x 4 devices) and B (16 x 8), the
  computations/s of ``k`` OpByOp calls of the dispatch benchmark's scalar
  all-reduce + add, by modelled computation time, for pathdask and the
  multi-controller; and where pathdask first reaches 95% of the multi-controller
  (interpolated on a log scale between the sizes run).
- **Figure 8**: configuration B, aggregate calls/s of N clients that each wait for
  every result, beside the multi-controller.
- **Table 2**: ``bench pipeline``'s rows at the paper's sizes: SPMD and GPipe with
  S = 4, 8, 16 (M = 4S) on 128 devices, and S = 16 on 512.
- **speed**: ``programs`` calls of a program of 128 chained gangs on 2,048 devices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from typing import Any

from ..bench.pipeline import Config as PipelineConfig
from ..topology import Topology
from .model import CostModel
from .run import ClientScript, Tenant, simulate
from .transformer import table2
from .workloads import dispatch_programs, dispatch_rate, island_mesh, mc_throughput, throughput

Echo = Callable[[str], Any]

CONFIGS = {"A": {"islands": 1, "hosts_per_island": 512, "devices_per_host": 4},
           "B": {"islands": 1, "hosts_per_island": 16, "devices_per_host": 8}}
PAPER_95 = {"A": 35e-3, "B": 2.3e-3}
COSTS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)


def config(name: str) -> Topology:
    return Topology.from_dict(CONFIGS[name])


def reach_95(costs: list[float], pathdask: list[float], mc: list[float]) -> float | None:
    """The smallest computation time at which pathdask reaches 95% of the multi-controller,
    interpolated linearly in log(cost) between the two sizes around the crossing."""
    ratio = [p / m for p, m in zip(pathdask, mc)]
    for i, r in enumerate(ratio):
        if r >= 0.95:
            if i == 0:
                return costs[0]
            a, b = ratio[i - 1], r
            f = (0.95 - a) / (b - a)
            return math.exp(math.log(costs[i - 1]) + f * (math.log(costs[i]) - math.log(costs[i - 1])))
    return None


def figure6(costs_model: CostModel, small: bool = False, echo: Echo = print) -> dict[str, Any]:
    grid = (1e-3, 1e-2, 0.1, 1.0) if small else COSTS
    out: dict[str, Any] = {}
    for name in ("B",) if small else ("B", "A"):
        topo = config(name)
        mesh = island_mesh(topo)
        rows: dict[str, list[float]] = {"pathdask OpByOp": [], "multi-controller OpByOp": []}
        wall = time.perf_counter()
        for cost in grid:
            k = 16 if small else max(8, min(128, int(1.0 / cost)))
            progs = dispatch_programs(topo, cost, k, mesh)
            rows["pathdask OpByOp"].append(dispatch_rate(topo, costs_model, progs, "OpByOp", k)[0])
            rows["multi-controller OpByOp"].append(dispatch_rate(topo, costs_model, progs, "OpByOp", k,
                                                                 "multi-controller")[0])
        at = reach_95(list(grid), rows["pathdask OpByOp"], rows["multi-controller OpByOp"])
        out[name] = {"topology": topo.describe(), "costs": list(grid), "rates": rows, "reaches_95pct_at_s": at,
                     "paper_95pct_at_s": PAPER_95[name], "wall_s": time.perf_counter() - wall}
        echo(f"\nFigure 6, configuration {name} ({topo.num_hosts} hosts, {topo.num_devices} devices): "
             f"computations/s by computation time")
        from ..bench.report import table

        echo(table(["system", *(f"{c:g}" for c in grid)], [[n, *v] for n, v in rows.items()]))
        echo(f"pathdask reaches 95% of the multi-controller at "
             f"{'-' if at is None else f'{at * 1e3:.3g} ms'} (paper: {PAPER_95[name] * 1e3:g} ms)")
    return out


def figure8(costs_model: CostModel, small: bool = False, echo: Echo = print) -> dict[str, Any]:
    from ..bench.report import table

    topo = config("B")
    grid = (0.33e-3, 2.4e-3) if small else (0.04e-3, 0.33e-3, 1.04e-3, 2.4e-3)
    clients = (1, 4) if small else (1, 2, 4, 8, 16, 32, 64)
    out: dict[str, Any] = {}
    for cost in grid:
        seconds = 0.5 if small else 2.0
        rates = {n: throughput(topo, costs_model, n, cost, seconds)[0] for n in clients}
        mc = mc_throughput(topo, costs_model, cost)
        out[str(cost)] = {"clients": {str(n): r for n, r in rates.items()}, "multi-controller": mc}
    echo(f"\nFigure 8, configuration B: aggregate calls/s of N clients waiting on results ({topo.num_devices} devices)")
    echo(table(["gang (ms)", *(f"{n} clients" for n in clients), "multi-controller"],
               [[f"{float(c) * 1e3:g}", *v["clients"].values(), v["multi-controller"]] for c, v in out.items()]))
    return out


def paper_table2(costs_model: CostModel, small: bool = False, echo: Echo = print) -> list[dict[str, Any]]:
    from ..bench.report import table

    echo("\nTable 2: the 3B Transformer (modelled), SPMD and GPipe pipelines")
    if small:
        rows = table2(PipelineConfig(devices=16, batch=64, steps=1), costs_model, (2, 4), echo)
    else:
        computed = {**PipelineConfig().computed, "layers": 16}  # a layer or more per stage, at the computed width
        rows = table2(PipelineConfig(devices=128, batch=512, steps=2, computed=computed), costs_model, (4, 8, 16),
                      echo)
        rows += table2(PipelineConfig(devices=512, batch=2048, steps=2, computed=computed), costs_model, (16,),
                       echo)
    spmd = {r["devices"]: r["tokens_per_s"] for r in rows if r["row"] == "SPMD"}
    for r in rows:
        r["ratio_to_spmd"] = r["tokens_per_s"] / spmd[r["devices"]]
    echo(table(["configuration", "devices", "tokens/s", "ratio to SPMD", "efficiency", "bubble M/(M+S-1)"],
               [[r["row"], r["devices"], r["tokens_per_s"], r["ratio_to_spmd"], r["efficiency"], r["bubble"]]
                for r in rows]))
    return rows


def speed(costs_model: CostModel, programs: int = 1000, gangs: int = 128, echo: Echo = print) -> dict[str, Any]:
    """Simulate ``programs`` calls of a program of ``gangs`` chained gangs on configuration A."""
    topo = config("A")
    t = time.perf_counter()
    prog = dispatch_programs(topo, 1e-3, gangs)["Chained"]
    from .schedule import compile_schedule

    compile_schedule(prog, topo)
    lowering = time.perf_counter() - t

    def script(h: Tenant) -> Generator[Any, Any, None]:
        call = None
        for _ in range(programs):
            call = yield from h.call(prog, after=call)
        assert call is not None
        yield from h.result(call)

    result = simulate(topo, [ClientScript("speed", script)], costs_model, trace_gangs=20000)
    out = {"programs": programs, "gangs": gangs, "devices": topo.num_devices, "lowering_s": lowering,
           "wall_s": result.wall_s, "virtual_s": result.end, "simpy_events": result.events,
           "device_ops": result.device_ops, "events_per_s": result.events_per_s,
           "device_ops_per_s": result.device_ops / result.wall_s}
    echo(f"\nspeed: {programs} programs x {gangs} gangs on {topo.num_devices} devices: {result.wall_s:.1f} s "
         f"(+ {lowering:.1f} s lowering, once), {result.device_ops:,} device ops and {result.events:,} clock "
         f"events, {out['events_per_s']:,.0f} events/s; {result.end:.1f} virtual seconds")
    return out
