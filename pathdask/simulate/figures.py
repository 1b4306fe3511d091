"""The paper's Figure 6, Figure 8 and Table 2 at paper scale, and the speed run, on the cluster model.

- **Figure 6**: for configurations A (512 hosts x 4 devices) and B (16 x 8), the
  computations/s of ``k`` OpByOp calls of the dispatch benchmark's scalar
  all-reduce + add, by modelled computation time, for pathdask (with the fan-out
  trees of ``pathdask.fanout``, as the runtime has them, and without them, as before)
  and the multi-controller; and where pathdask first reaches 95% of the
  multi-controller (interpolated on a log scale between the sizes run), beside the
  paper's, and what bounds pathdask's rate (the largest CPU per call of a part).
- **Figure 8**: configuration B, aggregate calls/s of N clients that each wait for
  every result, beside the multi-controller.
- **Table 2**: ``bench pipeline``'s rows at the paper's sizes: SPMD and GPipe with
  S = 4, 8, 16 (M = 4S) on 128 devices, and S = 16 on 512.
- **speed**: ``programs`` calls of a program of 128 chained gangs on 2,048 devices.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict
from typing import Any

from ..bench.pipeline import Config as PipelineConfig
from ..client.tracing import Program
from ..topology import Topology
from .devices import own_seconds
from .fanout import Fanout
from .model import CostModel
from .run import ClientScript, Simulation, Tenant, simulate
from .transformer import table2
from .workloads import dispatch_programs, dispatch_rate, island_mesh, mc_throughput, throughput

Echo = Callable[[str], Any]

CONFIGS = {"A": {"islands": 1, "hosts_per_island": 512, "devices_per_host": 4},
           "B": {"islands": 1, "hosts_per_island": 16, "devices_per_host": 8}}
PAPER_95 = {"A": 35e-3, "B": 2.3e-3}
#: Figure 6's series: pathdask with fan-out trees, pathdask without them, the multi-controller
TREE, NO_TREE, MC = "pathdask OpByOp", "pathdask OpByOp, no tree", "multi-controller OpByOp"
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


def per_call(topology: Topology, costs: CostModel, program: Program, fanout: Fanout) -> dict[str, float]:
    """The CPU one pipelined call of ``program`` costs each part of the system, on the cluster
    model: the client, the scheduler, the busiest host (its own part, and what it does for its
    children in the call's tree), and a device (its own time per computation, which the
    multi-controller pays too). The largest of them bounds pathdask's computations/s."""
    sim = Simulation(topology, costs, fanout=fanout)
    sched = sim.schedule(program)
    r = sim.route(sched)
    own = costs.host_dispatch_s + costs.host_op_s * float(sched.ops_per_host.max())
    return {"client_s": costs.client_call_s + costs.client_host_s * sched.n_hosts,
            "scheduler_s": sum(costs.scheduler_s(sched.n_hosts, tree=r is not None)),
            "busiest_host_s": own + (0.0 if r is None else r.relay_cpu(costs)[1]),
            "device_s": sum(own_seconds(st, costs) for st in sched.steps if st.kind == "kernel")}


def _at(at: float | None, grid: Sequence[float]) -> str:
    if at is None:
        return "-"
    return f"<= {at * 1e3:.3g} ms" if at == grid[0] else f"{at * 1e3:.3g} ms"


#: bisections (in log scale) of the bracket of the grid in which pathdask reaches 95%
REFINE = 3


def _k(cost: float, small: bool) -> int:
    """Computations per rate: about a second of them, 8 to 128."""
    return 16 if small else max(8, min(128, int(1.0 / cost)))


def _rates(topo: Topology, costs_model: CostModel, mesh: Any, cost: float, small: bool,
           systems: dict[str, Fanout]) -> dict[str, float]:
    """pathdask's computations/s at ``cost`` for each of ``systems`` (a fan-out), and the multi-controller's."""
    k = _k(cost, small)
    progs = dispatch_programs(topo, cost, k, mesh)
    out = {system: dispatch_rate(topo, costs_model, progs, "OpByOp", k, fanout=tree)[0]
           for system, tree in systems.items()}
    out[MC] = dispatch_rate(topo, costs_model, progs, "OpByOp", k, "multi-controller")[0]
    return out


def _refined(grid: Sequence[float], rows: dict[str, list[float]], system: str,
             rate: Callable[[float], dict[str, float]]) -> float | None:
    """Where ``system`` reaches 95% of the multi-controller: the grid's bracket of the crossing
    bisected :data:`REFINE` times in log scale, then :func:`reach_95` in the last bracket."""
    coarse = reach_95(list(grid), rows[system], rows[MC])
    if coarse is None or coarse == grid[0]:
        return coarse
    i = next(j for j, (p, m) in enumerate(zip(rows[system], rows[MC])) if p / m >= 0.95)
    lo, hi = (grid[i - 1], rows[system][i - 1] / rows[MC][i - 1]), (grid[i], rows[system][i] / rows[MC][i])
    for _ in range(REFINE):
        mid = math.sqrt(lo[0] * hi[0])
        r = rate(mid)
        point = (mid, r[system] / r[MC])
        if point[1] >= 0.95:
            hi = point
        else:
            lo = point
    return reach_95([lo[0], hi[0]], [lo[1], hi[1]], [1.0, 1.0])


def figure6(costs_model: CostModel, small: bool = False, echo: Echo = print,
            fanout: Fanout | None = None, configs: Sequence[str] | None = None) -> dict[str, Any]:
    """Figure 6 with fan-out trees (``fanout``, by default the dask config's) and without them
    (the scheduler sending each host its records, as before the trees), beside the paper's;
    ``configs``: which of :data:`CONFIGS` (default B and A; with ``small``, B)."""
    from ..bench.report import table

    fanout = fanout or Fanout.from_config()
    grid = (1e-3, 1e-2, 0.1, 1.0) if small else COSTS
    out: dict[str, Any] = {}
    systems = {TREE: fanout, NO_TREE: Fanout.off()}
    for name in configs or (("B",) if small else ("B", "A")):
        topo = config(name)
        mesh = island_mesh(topo)
        rows: dict[str, list[float]] = {TREE: [], NO_TREE: [], MC: []}
        wall = time.perf_counter()
        for cost in grid:
            for system, r in _rates(topo, costs_model, mesh, cost, small, systems).items():
                rows[system].append(r)

        def rate(cost: float, system: str, _topo: Topology = topo, _mesh: Any = mesh) -> dict[str, float]:
            return _rates(_topo, costs_model, _mesh, cost, small, {system: systems[system]})

        at, old = (_refined(grid, rows, system, functools.partial(rate, system=system)) for system in (TREE, NO_TREE))
        op = dispatch_programs(topo, grid[0], 1, mesh)["OpByOp"]
        per = {system: per_call(topo, costs_model, op, tree) for system, tree in systems.items()}
        bound = {system: max(parts, key=parts.__getitem__)[:-2] for system, parts in per.items()}
        out[name] = {"topology": topo.describe(), "costs": list(grid), "rates": rows, "reaches_95pct_at_s": at,
                     "reaches_95pct_at_s_no_tree": old, "paper_95pct_at_s": PAPER_95[name],
                     "at_smallest_size": at == grid[0], "fanout": asdict(fanout),
                     "tree": fanout.fans(mesh.size // topo.devices_per_host), "per_call_s": per, "bound": bound,
                     "wall_s": time.perf_counter() - wall}
        echo(f"\nFigure 6, configuration {name} ({topo.num_hosts} hosts, {topo.num_devices} devices): "
             f"computations/s by computation time")
        echo(table(["system", *(f"{c:g}" for c in grid)], [[n, *v] for n, v in rows.items()]))
        echo(f"pathdask reaches 95% of the multi-controller at {_at(at, grid)} (without trees: "
             f"{_at(old, grid)}; paper: {PAPER_95[name] * 1e3:g} ms)")
        echo("CPU per call (ms): " + "; ".join(
            f"{system}: " + ", ".join(f"{part[:-2].replace('_', ' ')} {v * 1e3:.3g}" for part, v in parts.items())
            + f" (bound: {bound[system].replace('_', ' ')})" for system, parts in per.items()))
    echo(f"\nFigure 6: the smallest computation at which pathdask reaches 95% of the multi-controller "
         f"(fan-out trees of degree {fanout.degree} for calls on more than {fanout.threshold} hosts)")
    echo(table(["configuration", "paper", "model without trees", "model with trees", "bound with trees"],
               [[f"{n} ({config(n).num_hosts} x {config(n).devices_per_host})", f"{v['paper_95pct_at_s'] * 1e3:g} ms",
                 _at(v["reaches_95pct_at_s_no_tree"], grid), _at(v["reaches_95pct_at_s"], grid),
                 v["bound"][TREE].replace("_", " ")] for n, v in out.items()]))
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
