"""``pathdask simulate validate``: the simulation beside real runs of the same configurations.

Real runs use the benchmarks' own functions on a real ``LocalSystem(processes=False)``
(the default topology for dispatch and tenancy, ``bench pipeline``'s for the
pipeline, and one island of :data:`HOSTS` hosts of one device each for the rows
beyond the calibration's 4 hosts); the simulation runs the same programs with the
embedded cost model (:meth:`CostModel.embedded`: one shared processor, as in that
one process). The simulation of those rows takes the real scheduler's fan-out trees
(``pathdask.fanout``: its degree and threshold, :func:`runtime_fanout`), and each row
checks that the real calls went down trees exactly where the model sends them
(:func:`fanned`).
Each row gives both numbers and the relative error; the worst is reported.

Calibration and validation run the real system on one CPU, each run from a settled
heap (:mod:`.measure`).
Each real figure is the median of :data:`REAL_RUNS` runs, and the row keeps their
range: one process's threads make a run's rate vary (a one-gang call whose result
is waited for varies by 15-20% from run to run), and the range says whether
the simulation's figure is one the real system gives.

A :class:`~.measure.SpeedMeter` measures the CPU's speed during each real run;
a run made while the CPU ran more than 15% away from the calibration's speed is
made again (up to three times, keeping the closest), and the simulation of each
run kept takes the calibration's costs at its speed
(:meth:`~.model.CostModel.at_speed`): the simulated figure is the median of
those. Each row also gives the simulation at the calibration's own speed, and
its error, as the model would predict with no meter.

Clients that each wait for every result keep the CPU busy, and their rate moves
with the machine's speed more than the meter sees. Their rows also time the
hosts' handler of calls in each run (:class:`~.measure.HandlerClock`) and give
both spreads over the runs: of the rates, and of each rate times that handler's
CPU per call. When the second is much smaller, the runs differed in the
machine's speed, not in the system's work.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from .. import P
from ..bench import pipeline as bench_pipeline
from ..bench import tenancy as bench_tenancy
from ..bench.dispatch import Kernels, _mc_run, _pathdask_run
from ..bench.report import table
from ..system import LocalSystem, default_topology
from ..topology import Topology
from .fanout import Fanout
from .measure import HandlerClock, SpeedMeter
from .model import CostModel
from .transformer import pipeline_seconds, spmd_seconds
from .workloads import dispatch_programs, dispatch_rate, shares, throughput

Echo = Callable[[str], Any]

#: real runs per row (one with ``small``)
REAL_RUNS = 7


def _runs(small: bool) -> int:
    return 1 if small else REAL_RUNS


def _error(sim: float, real: float) -> float:
    return abs(sim - real) / real if real else math.inf


class Run(NamedTuple):
    """One real run: its figure, the meter's reference seconds during it, and, where the row
    times it, the hosts' handler CPU per message of one call (:class:`~.measure.HandlerClock`)."""

    figure: float
    speed: float
    handler_s: float | None = None


def _real(meter: SpeedMeter, costs: CostModel, small: bool, run: Callable[..., Any], *args: Any,
          figure: Callable[[Any], float] = float, clock: HandlerClock | None = None) -> list[Run]:
    """Each real run of ``run(*args)``, runs made again while the CPU ran away from the
    calibration's speed (:meth:`SpeedMeter.during`); ``clock`` times the hosts' handler."""
    def timed(*a: Any) -> tuple[Any, float | None]:
        mark = clock.mark() if clock is not None else 0
        out = run(*a)
        return out, clock.since(mark) if clock is not None else None

    runs = []
    for _ in range(_runs(small)):
        (out, handler_s), speed = meter.during(timed, *args, near=costs.reference_s)
        runs.append(Run(figure(out), speed, handler_s))
    return runs


def _costs(costs: CostModel, measured: list[Run]) -> list[CostModel]:
    """What to simulate a row with: the calibration's costs, then those at each real run's speed."""
    return [costs] + [costs.at_speed(r.speed) for r in measured]


def _spread(values: list[float]) -> float:
    """Standard deviation over mean."""
    return float(np.std(values) / np.mean(values))


def _row(rows: list[dict[str, Any]], name: str, measured: list[Run], simulated: list[float], echo: Echo) -> None:
    """One row: ``measured`` holds the real runs; ``simulated`` the simulation's figures with :func:`_costs`."""
    runs = [r.figure for r in measured]
    real = float(np.median(runs))
    at_calibration, *at_speed = simulated
    sim = float(np.median(at_speed))
    err = _error(sim, real)
    within = min(runs) <= sim <= max(runs)
    row = {"configuration": name, "real": real, "real_runs": runs, "reference_s": [r.speed for r in measured],
           "simulated": sim, "relative_error": err, "within_real_range": within,
           "simulated_at_calibration": at_calibration, "relative_error_at_calibration": _error(at_calibration, real)}
    echo(f"  {name}: real {real:,.4g} ({min(runs):,.4g}-{max(runs):,.4g}), simulated {sim:,.4g} ({err:.1%}); "
         f"at the calibration's speed {at_calibration:,.4g} ({_error(at_calibration, real):.1%})")
    handler = [r.handler_s for r in measured if r.handler_s is not None and not math.isnan(r.handler_s)]
    if handler and len(handler) == len(runs):  # timed, and every run had messages of one call
        row["handler_cpu_s"] = handler
        if len(runs) > 1:  # the machine's speed, or the system's work: which moved between runs
            row["spread"] = _spread(runs)
            row["spread_in_own_work"] = _spread([f * h for f, h in zip(runs, handler)])
            echo(f"    its runs spread {row['spread']:.1%}; in the system's own work (each rate times its hosts' "
                 f"handler CPU per call) {row['spread_in_own_work']:.1%}")
    rows.append(row)


def dispatch_rows(costs: CostModel, small: bool, meter: SpeedMeter, echo: Echo) -> list[dict[str, Any]]:
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
                    real = _real(meter, costs, small, run, figure=lambda t: k / t)
                    _row(rows, f"dispatch {system_name} {shape} {cost * 1e3:g} ms", real,
                         [dispatch_rate(topology, c, programs, shape, k, system_name)[0] for c in _costs(costs, real)],
                         echo)
        client.close()
    return rows


def tenancy_rows(costs: CostModel, small: bool, meter: SpeedMeter, echo: Echo) -> list[dict[str, Any]]:
    topology = default_topology()
    cfg = bench_tenancy.Config.small() if small else bench_tenancy.Config()
    rows: list[dict[str, Any]] = []
    with LocalSystem(topology, processes=False, dashboard_address=None, policy="proportional") as system:
        clock = HandlerClock(system)
        for weights in cfg.weights:
            real = _real(meter, costs, small, bench_tenancy._shares, system, cfg, weights, echo,
                         figure=lambda r: r["ops_share"][-1])
            label = ":".join(f"{w:g}" for w in weights)
            _row(rows, f"tenancy share of the heaviest client's gangs, weights {label}", real,
                 [shares(topology, c, weights, cfg.gang_cost, cfg.gangs_per_program, cfg.inflight, cfg.share_seconds,
                         measure="ops")[0][-1] for c in _costs(costs, real)], echo)
        for n in cfg.clients:
            cost = cfg.costs[0]
            real = _real(meter, costs, small, bench_tenancy._throughput, system, n, cost, cfg.throughput_seconds,
                         clock=clock)
            _row(rows, f"tenancy {n} client(s) waiting on results, {cost * 1e3:g} ms: calls/s", real,
                 [throughput(topology, c, n, cost, cfg.throughput_seconds)[0] for c in _costs(costs, real)], echo)
    return rows


def pipeline_rows(costs: CostModel, small: bool, meter: SpeedMeter, echo: Echo) -> list[dict[str, Any]]:
    cfg = replace(bench_pipeline.Config.small(), steps=3)
    b = bench_pipeline.Bench(cfg)
    topology = bench_pipeline._topology(cfg, 1)
    rows: list[dict[str, Any]] = []
    with LocalSystem(topology, processes=False, dashboard_address=None) as system:
        client = system.client(name="validate")
        real = _real(meter, costs, small, bench_pipeline.spmd, b, client)
        _row(rows, f"pipeline bench SPMD on {cfg.devices} devices: s/step", real,
             [spmd_seconds(b, topology, c) for c in _costs(costs, real)], echo)
        for s in cfg.stages:
            real = _real(meter, costs, small, bench_pipeline.pipelined, b, client, s, 1, figure=lambda t: t[0])
            _row(rows, f"pipeline bench S={s} M={4 * s}: s/step", real,
                 [pipeline_seconds(b, topology, c, s) for c in _costs(costs, real)], echo)
        client.close()
    return rows


#: hosts (of one device each, in one island) of the rows beyond the calibration's 4: above the
#: fan-out trees' default threshold (2), so that the runtime sends these calls down trees
HOSTS = (8, 16)


def runtime_fanout(system: LocalSystem) -> Fanout:
    """The fan-out trees of the real system's scheduler: its degree and threshold, as it runs
    (``SchedulerCore``), which the simulation of its rows uses."""
    assert system.cluster is not None
    core = system.cluster.scheduler.plugins["pathdask"].core
    return Fanout(int(core.degree), int(core.threshold))


def fanned(client: Any, run: Callable[[], Any]) -> float:
    """The share of the calls that ``run`` made which the real scheduler sent down a fan-out tree
    (``device_stats()["scheduler"]``: its ``calls`` and ``fanned``)."""
    before = client.device_stats()["scheduler"]
    run()
    after = client.device_stats()["scheduler"]
    calls = after["calls"] - before["calls"]
    return (after["fanned"] - before["fanned"]) / calls if calls else 0.0


def hosts_rows(costs: CostModel, small: bool, meter: SpeedMeter, echo: Echo) -> list[dict[str, Any]]:
    """OpByOp calls of 1 ms on one island of :data:`HOSTS` hosts of one device: pathdask as it runs
    (down the real scheduler's fan-out trees, and so in the model), pathdask with its scheduler's
    threshold set above the hosts (no tree, in either), and the multi-controller."""
    rows: list[dict[str, Any]] = []
    for hosts in HOSTS:
        topology = Topology(islands=1, hosts_per_island=hosts, devices_per_host=1)
        with LocalSystem(topology, processes=False, dashboard_address=None) as system:
            client = system.client(name="validate")
            _hosts_rows(rows, costs, small, meter, echo, system, client)
            client.close()
    return rows


def _hosts_rows(rows: list[dict[str, Any]], costs: CostModel, small: bool, meter: SpeedMeter, echo: Echo,
                system: LocalSystem, client: Any) -> None:
    assert system.cluster is not None
    topology = system.topology
    hosts, k, cost = topology.hosts_per_island, (16 if small else 64), 1e-3
    kernels, programs = Kernels(cost, k), dispatch_programs(topology, cost, k)
    mesh = client.mesh({"x": hosts}, island=0)
    x = client.put(np.zeros(hosts), mesh, P("x"))
    x.result()
    fanout = runtime_fanout(system)
    core = system.cluster.scheduler.plugins["pathdask"].core

    def direct() -> float:  # the same calls, each host sent its records by the scheduler
        found = core.threshold
        core.threshold = sys.maxsize
        try:
            return _pathdask_run(kernels, x, "OpByOp", "parallel")
        finally:
            core.threshold = found

    # (system, what the row's name adds, the real run, the model's trees)
    runs = [("pathdask", "", lambda: _pathdask_run(kernels, x, "OpByOp", "parallel"), fanout),
            ("pathdask", ", no tree", direct, Fanout.off()),
            ("multi-controller", "", lambda: _mc_run(client, kernels, x, "OpByOp"), fanout)]
    for system_name, suffix, run, tree in runs:
        share = fanned(client, run)  # warm-up; it tells whether the calls went down trees
        if system_name == "pathdask" and share != tree.fans(hosts):
            raise RuntimeError(f"on {hosts} hosts the real scheduler sent {share:.0%} of the calls down trees; "
                               f"the model sends {'all' if tree.fans(hosts) else 'none'}")
        real = _real(meter, costs, small, run, figure=lambda t: k / t)
        _row(rows, f"{hosts} hosts x 1 device: dispatch {system_name} OpByOp {cost * 1e3:g} ms{suffix}", real,
             [dispatch_rate(topology, c, programs, "OpByOp", k, system_name, tree)[0] for c in _costs(costs, real)],
             echo)
        if system_name == "pathdask":
            rows[-1]["tree"] = tree.fans(hosts)
            if rows[-1]["tree"]:
                rows[-1]["fanout"] = {"degree": tree.degree, "threshold": tree.threshold}


def far_from_calibration(ratio: float | None, tolerance: float) -> str | None:
    """What to say before validating when the CPU does the meter's work ``ratio`` times as slowly
    as during calibration: more than twice the meter's ``tolerance`` away, where scaling the
    costs by the meter is least exact (None: near enough, or no calibration speed)."""
    if ratio is None or abs(math.log(ratio)) <= math.log(1 + 2 * tolerance):
        return None
    how = f"{ratio:.2f}x as slowly" if ratio > 1 else f"{1 / ratio:.2f}x as fast"
    return (f"warning: the CPU does the speed meter's work {how} as during calibration. Runs made while it is more "
            f"than {tolerance:.0%} away are made again and the model runs at each run's speed, but that scaling is not exact: "
            f"CPU-bound rows (one-gang calls, clients that wait for every result) may miss. Calibrate on this "
            f"machine now (--calibrate --costs F), with other work off it, or validate when it is steadier")


def validate(costs: CostModel | None = None, small: bool = False, echo: Echo = print) -> dict[str, Any]:
    """Every row, the table and the worst relative error."""
    costs = (costs or CostModel.load()).embedded()
    start = time.perf_counter()
    echo("pathdask simulate validate: real embedded runs beside the simulation of the same")
    with SpeedMeter() as meter:
        ratio = SpeedMeter.now() / costs.reference_s if costs.reference_s else None
        warning = far_from_calibration(ratio, meter.tolerance)
        if warning:
            echo(warning)
        rows = (dispatch_rows(costs, small, meter, echo) + tenancy_rows(costs, small, meter, echo)
                + pipeline_rows(costs, small, meter, echo) + hosts_rows(costs, small, meter, echo))
        speed, redone = meter.mean(), meter.redone
    echo(table(["configuration", "real (median)", "real range", "simulated", "relative error", "in range",
                "at calibration speed"],
               [[r["configuration"], r["real"], f"{min(r['real_runs']):,.4g}-{max(r['real_runs']):,.4g}",
                 r["simulated"], f"{r['relative_error']:.1%}", "yes" if r["within_real_range"] else "no",
                 f"{r['relative_error_at_calibration']:.1%}"] for r in rows]))
    if costs.reference_s:
        echo(f"the CPU did the speed meter's work in {speed * 1e3:.3f} ms (at its mean speed) during validation, "
             f"and in {costs.reference_s * 1e3:.3f} ms during calibration; {redone} run(s) made again, "
             f"the CPU having run more than {meter.tolerance:.0%} away from the calibration's speed")
    worst = max(rows, key=lambda r: r["relative_error"])
    over = [r for r in rows if r["relative_error"] > 0.1]
    echo(f"worst: {worst['configuration']}, {worst['relative_error']:.1%}; {len(rows) - len(over)} of {len(rows)} "
         f"rows within 10%" + (f", and {sum(r['within_real_range'] for r in over)} of the other {len(over)} "
                               f"inside the real runs' range" if over else ""))
    worst_at_calibration = max(r["relative_error_at_calibration"] for r in rows)
    echo(f"at the calibration's speed: worst {worst_at_calibration:.1%}, "
         f"{sum(r['relative_error_at_calibration'] <= 0.1 for r in rows)} of {len(rows)} rows within 10%")
    return {"rows": rows, "worst": worst, "over_10_percent": len(over), "seconds": time.perf_counter() - start,
            "reference_s": speed, "speed_ratio_at_start": ratio, "redone": redone, "worst_at_calibration": worst_at_calibration, "costs": costs.to_dict()}
