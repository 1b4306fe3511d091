"""The paper's Figure 6, Figure 8 and Table 2 at paper scale, and the speed run, on the cluster model.

- **Figure 6**: for configurations A (512 hosts x 4 devices) and B (16 x 8), the
  computations/s of ``k`` OpByOp calls of the dispatch benchmark's scalar
  all-reduce + add, by modelled computation time, for pathdask (with the relay
  tree of ``pathdask.fanout``, and without it) and the multi-controller; and
  where pathdask first reaches 95% of the multi-controller (interpolated on a log
  scale between the sizes run), beside the paper's.
- **Figure 8**: configuration B, aggregate calls/s of N clients that each wait for
  every result, beside the multi-controller.
- **Table 2**: ``bench pipeline``'s rows at the paper's sizes: SPMD and GPipe with
  S = 4, 8, 16 (M = 4S) on 128 devices, and S = 16 on 512.
- **speed**: ``programs`` calls of a program of 128 chained gangs on 2,048 devices.
"""

from __future__ import annotations

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
#: Figure 6's series: pathdask with the relay tree, pathdask without it, the multi-controller
TREE, NO_TREE, MC = "pathdask OpByOp", "pathdask OpByOp, no relay tree", "multi-controller OpByOp"
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
    model: the client, the scheduler, the busiest host (its own part, and what it does as a
    relay), and a device (its own time per computation, which the multi-controller pays too).
    The largest of them bounds pathdask's computations/s."""
    sim = Simulation(topology, costs, fanout=fanout)
    sched = sim.schedule(program)
    r = sim.route(sched)
    own = costs.host_dispatch_s + costs.host_op_s * float(sched.ops_per_host.max())
    return {"client_s": costs.client_call_s + costs.client_host_s * sched.n_hosts,
            "scheduler_s": sum(costs.scheduler_s(sched.n_hosts) if r is None
                               else costs.scheduler_s(0, trees=r.messages)),
            "busiest_host_s": own + (0.0 if r is None else r.relay_cpu(costs)[1]),
            "device_s": sum(own_seconds(st, costs) for st in sched.steps if st.kind == "kernel")}


def _at(at: float | None, grid: Sequence[float]) -> str:
    if at is None:
        return "-"
    return f"<= {at * 1e3:.3g} ms" if at == grid[0] else f"{at * 1e3:.3g} ms"


def figure6(costs_model: CostModel, small: bool = False, echo: Echo = print,
            fanout: Fanout | None = None) -> dict[str, Any]:
    """Figure 6 with the relay tree (``fanout``, by default the dask config's) and without it
    (the scheduler sending each host its records, as before the tree), beside the paper's."""
    from ..bench.report import table

    fanout = fanout or Fanout.from_config()
    grid = (1e-3, 1e-2, 0.1, 1.0) if small else COSTS
    out: dict[str, Any] = {}
    systems = {TREE: fanout, NO_TREE: Fanout.off()}
    for name in ("B",) if small else ("B", "A"):
        topo = config(name)
        mesh = island_mesh(topo)
        rows: dict[str, list[float]] = {TREE: [], NO_TREE: [], MC: []}
        wall = time.perf_counter()
        for cost in grid:
            k = 16 if small else max(8, min(128, int(1.0 / cost)))
            progs = dispatch_programs(topo, cost, k, mesh)
            for system, tree in systems.items():
                rows[system].append(dispatch_rate(topo, costs_model, progs, "OpByOp", k, fanout=tree)[0])
            rows[MC].append(dispatch_rate(topo, costs_model, progs, "OpByOp", k, "multi-controller")[0])
        at = reach_95(list(grid), rows[TREE], rows[MC])
        old = reach_95(list(grid), rows[NO_TREE], rows[MC])
        op = dispatch_programs(topo, grid[0], 1, mesh)["OpByOp"]
        out[name] = {"topology": topo.describe(), "costs": list(grid), "rates": rows, "reaches_95pct_at_s": at,
                     "reaches_95pct_at_s_no_tree": old, "paper_95pct_at_s": PAPER_95[name],
                     "at_smallest_size": at == grid[0], "fanout": asdict(fanout),
                     "tree": fanout.tree_for(topo.hosts_per_island),
                     "per_call_s": {system: per_call(topo, costs_model, op, tree) for system, tree in systems.items()},
                     "wall_s": time.perf_counter() - wall}
        echo(f"\nFigure 6, configuration {name} ({topo.num_hosts} hosts, {topo.num_devices} devices): "
             f"computations/s by computation time")
        echo(table(["system", *(f"{c:g}" for c in grid)], [[n, *v] for n, v in rows.items()]))
        echo(f"pathdask reaches 95% of the multi-controller at {_at(at, grid)} (without the relay tree: "
             f"{_at(old, grid)}; paper: {PAPER_95[name] * 1e3:g} ms)")
        echo("CPU per call (ms): " + "; ".join(
            f"{system}: " + ", ".join(f"{part[:-2].replace('_', ' ')} {v * 1e3:.3g}" for part, v in parts.items())
            for system, parts in out[name]["per_call_s"].items()))
    echo(f"\nFigure 6: the smallest computation at which pathdask reaches 95% of the multi-controller "
         f"(relay tree: degree {fanout.degree}, in islands of more than {fanout.threshold} hosts)")
    echo(table(["configuration", "paper", "model without the tree", "model with the tree"],
               [[f"{n} ({config(n).num_hosts} x {config(n).devices_per_host})", f"{v['paper_95pct_at_s'] * 1e3:g} ms",
                 _at(v["reaches_95pct_at_s_no_tree"], grid), _at(v["reaches_95pct_at_s"], grid)]
                for n, v in out.items()]))
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
