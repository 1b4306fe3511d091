"""``pathdask bench dispatch``: the paper's Figures 5, 6 and 7 at our scale.

One computation is a scalar all-reduce over every device of a mesh plus an
add, whose output feeds the next computation. It runs in three shapes:

- **OpByOp**: one call (one program) per computation;
- **Chained**: one program of ``k`` gangs;
- **Fused**: one gang whose body loops ``k`` times;

each run a series of such calls, each reading the last one's output (in Figure 5, for
pathdask and the multi-controller, ``Config.figure5_series`` of them, as the paper's
"series of calls"; else one),

on these systems, in one run on the same cluster:

- ``dask``: plain Dask as a Dask user writes it, per-shard futures with a reduce task per step;
- ``pathdask-seq``: pathdask with ``pathdask.dispatch: sequential``;
- ``pathdask-unbatched``: pathdask with ``pathdask.batch.enabled: false``, each call its own program;
- ``pathdask``: pathdask with parallel asynchronous dispatch and opportunistic batching;
- ``multi-controller``: every host runs the same loop itself (``client.run``), with
  the same runtime and collectives and no central dispatch: the JAX analogue;
- ``ray-*``: Ray tasks, actors and Compiled Graphs, where Ray is installed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import dask
import numpy as np

from .. import P, function, pmean, program
from ..client.client import Client
from ..client.function import Function
from ..client.program import ProgramFunction
from ..compat import set_interval, worker_stream
from ..streams import pace
from ..system import LocalSystem, default_topology
from ..topology import Topology
from .multicontroller import run_multicontroller
from .placement import hosts_on_own_cpus
from .report import best_rate, idle_gaps, median, save_plots, table, timed, window, write_json

SHAPES = ("OpByOp", "Chained", "Fused")
Echo = Callable[[str], Any]


@dataclass
class Config:
    computations: int = 128
    repeats: int = 3
    #: rounds of Figure 5 (cost 0, each run 0.5-2 s) in which pathdask and the multi-controller
    #: take turns: the best run of each kept, and the median of the rounds' ratios
    figure5_repeats: int = 15
    #: calls of ``computations`` each per run of Figure 5 (OpByOp: as many computations, one
    #: call each), each reading the last one's output: the paper's "series of calls", whose
    #: throughput a single call's round trip (about 2.5 ms of the run) does not bound
    figure5_series: int = 16
    #: calls timed one at a time, each waiting for its result (the round trip)
    round_trips: int = 200
    costs: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    stages: tuple[int, ...] = (1, 2, 4, 8)
    microbatches: int = 16
    stage_cost: float = 1e-3
    ray: bool = True
    #: also run pathdask on a system with TLS (Dask's Security.temporary(), needs cryptography)
    security: bool = True
    #: each host's worker process on a CPU of its own (:mod:`.placement`), where it can be
    pin_hosts: bool = True

    @classmethod
    def small(cls) -> Config:
        return cls(computations=16, repeats=1, figure5_repeats=1, figure5_series=2, costs=(1e-4, 1e-3, 1e-2), stages=(1, 2), microbatches=4,
                   ray=False, round_trips=20)


@dataclass
class Kernels:
    """The computations of one cost, built once so that their traces are cached."""

    cost: float
    k: int
    #: calls per run (each of ``k`` computations; OpByOp: ``k * series`` calls)
    series: int = 1
    step: Function = field(init=False)
    op: ProgramFunction = field(init=False)
    chained: ProgramFunction = field(init=False)
    fused: ProgramFunction = field(init=False)

    def __post_init__(self) -> None:
        cost, k = self.cost, self.k

        def body(b: np.ndarray) -> np.ndarray:
            return pmean(b, "x") + 1.0

        def fused_body(b: np.ndarray) -> np.ndarray:
            for _ in range(k):
                b = pmean(b, "x") + 1.0
            return b

        self.step = function(body, in_specs=P("x"), out_specs=P("x"), cost=cost, name="allreduce_add")
        fused = function(fused_body, in_specs=P("x"), out_specs=P("x"), cost=cost * k, name="fused")
        step = self.step

        @program
        def op(x: Any) -> Any:
            return step(x)

        @program
        def chained(x: Any) -> Any:
            for _ in range(k):
                x = step(x)
            return x

        @program
        def fused_prog(x: Any) -> Any:
            return fused(x)

        self.op, self.chained, self.fused = op, chained, fused_prog

    @property
    def total(self) -> int:
        """Computations per run."""
        return self.k * self.series


def _pathdask_run(kernels: Kernels, x: Any, shape: str, mode: str, batch: bool = True) -> float:
    with dask.config.set({"pathdask.dispatch": mode, "pathdask.batch.enabled": batch}):
        def go() -> None:
            y = x
            if shape == "OpByOp":
                for _ in range(kernels.total):
                    y = kernels.step(y)
            else:
                prog = kernels.chained if shape == "Chained" else kernels.fused
                for _ in range(kernels.series):
                    y = prog(y)
            _check(y.result(), kernels.total)
        return timed(go)


def round_trips(kernels: Kernels, x: Any, n: int) -> dict[str, float | None]:
    """Median seconds of a one-gang call whose result is waited for, one call at a time (a
    notebook's training loop), beside the median fetch of a result that is ready already."""
    calls, fetches = [], []
    y = kernels.step(x)
    y.result()  # warm: traces, plans on the hosts, connections
    for _ in range(n):
        start = time.perf_counter()
        y = kernels.step(y)
        y.result()
        calls.append(time.perf_counter() - start)
        fetches.append(timed(y.result))
    return {"call_and_result_s": median(calls), "fetch_ready_s": median(fetches)}


def _mc_run(client: Client, kernels: Kernels, x: Any, shape: str) -> float:
    if shape == "OpByOp":
        return run_multicontroller(client, kernels.op, x, kernels.total)
    return run_multicontroller(client, kernels.chained if shape == "Chained" else kernels.fused, x, kernels.series)


def _shard_step(value: float, total: float, n: int, cost: float) -> float:
    if cost:
        time.sleep(cost)  # plain Dask has no modelled device: the shard's compute holds its thread
    return total / n + 1.0


def _host_pacing(dask_default: bool, dask_worker: Any = None) -> None:
    """Set a host's stream to the scheduler to Dask's own interval, or back to pathdask's."""
    if dask_default:
        set_interval(worker_stream(dask_worker), dask_worker.plugins["pathdask"].dask_stream_interval)
    else:
        pace(worker_stream(dask_worker))


def _dask_run(client: Client, workers: list[str], k: int, cost: float, shape: str) -> float | None:
    """Plain Dask: one future per shard, a reduce task per step, pinned like the devices,
    with Dask's own stream intervals (pathdask batches Dask's messages longer on its hosts)."""
    if shape == "Fused":
        return None  # a fused collective loop has no plain-Dask form: there are no collectives
    hosts = sorted(set(workers))
    client.dask.run(_host_pacing, True, workers=hosts)
    try:
        return _plain_dask(client, workers, k, cost, shape)
    finally:
        client.dask.run(_host_pacing, False, workers=hosts)


def _plain_dask(client: Client, workers: list[str], k: int, cost: float, shape: str) -> float:
    dc = client.dask
    n = len(workers)
    start = time.perf_counter()
    if shape == "OpByOp":
        shards = [dc.submit(float, 0.0, workers=[w], pure=False) for w in workers]
        for _ in range(k):
            total = dc.submit(sum, shards, pure=False)
            shards = [dc.submit(_shard_step, s, total, n, cost, workers=[w], pure=False)
                      for s, w in zip(shards, workers)]
        _check(np.array(dc.gather(shards)), k)
    else:  # Chained: the whole loop as one graph, as dask.delayed users write it
        from dask import delayed

        vals = [delayed(float)(0.0) for _ in workers]
        for _ in range(k):
            total = delayed(sum)(vals)
            vals = [delayed(_shard_step)(v, total, n, cost) for v in vals]
        _check(np.array(dc.compute(vals, sync=True)), k)
    return time.perf_counter() - start


def _rates(client: Client, system_workers: list[str], x: Any, cost: float, k: int, cfg: Config,
           systems: tuple[str, ...] = ("dask", "pathdask-seq", "pathdask-unbatched", "pathdask", "multi-controller"),
           shapes: tuple[str, ...] = SHAPES, repeats: int | None = None, series: int = 1,
           paired: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float | None]]:
    """Computations/s of each system and shape: the best of ``repeats`` runs (``cfg.repeats``),
    each of ``series`` calls of ``k`` computations (:class:`Kernels`); the :data:`SLOW` systems'
    of one call, ``cfg.repeats`` times.

    pathdask (batched and not) and the multi-controller, whose ratios are the result, take
    turns run by run (who goes first rotating), so that they see the same moments of a noisy
    machine. If ``paired`` is given, it is filled with each such system's ratio to the
    multi-controller per shape: the median over the rounds of the ratio within a round, whose
    two runs come from the same moments of the machine, where the ratio of the best runs
    holds two extremes, each of its own sample, against each other. The other
    systems run their repeats back to back first; a run right after sequential dispatch pays
    for the clean-up of its hundreds of Dask tasks, so the first round of turns is not counted.
    """
    kernels, single = Kernels(cost, k, series), Kernels(cost, k)
    repeats = repeats or cfg.repeats
    out: dict[str, dict[str, float | None]] = {s: {} for s in systems}
    for shape in shapes:
        # the slow baselines (plain Dask, sequential dispatch): single calls, cfg.repeats of them
        runs = {system: _runner(system, shape, client, system_workers, single if system in SLOW else kernels, x)
                for system in systems}
        ready = {system: run for system, run in runs.items() if run() is not None}  # warm-up
        for system in systems:
            if system not in ready:
                out[system][shape] = None
            elif system in SLOW:
                out[system][shape] = best_rate(partial(_seconds, ready[system]), k, cfg.repeats)
            elif system not in TAKE_TURNS:
                out[system][shape] = best_rate(partial(_seconds, ready[system]), kernels.total, repeats)
        turns = [system for system in TAKE_TURNS if system in ready]
        rounds = _take_turns({system: ready[system] for system in turns}, repeats)
        for system, seconds in rounds.items():
            out[system][shape] = kernels.total / min(seconds)
        if paired is not None and "multi-controller" in rounds:
            mc = rounds["multi-controller"]
            for system, seconds in rounds.items():
                if system != "multi-controller":
                    paired.setdefault(system, {})[shape] = statistics.median(m / s for m, s in zip(mc, seconds))
    return out


def _take_turns(runs: dict[str, Callable[[], float | None]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each run in ``repeats`` rounds, each round running every system once, the
    first of them rotating; a first round before them is not counted (it follows the other
    systems' clean-up)."""
    order = list(runs)
    seconds: dict[str, list[float]] = {system: [] for system in order}
    for i in range(repeats + 1):
        turn = order[i % len(order):] + order[:i % len(order)] if order else []
        for system in turn:
            t = _seconds(runs[system])
            if i:
                seconds[system].append(t)
    return seconds


#: the systems whose runs alternate in :func:`_rates`
TAKE_TURNS = ("pathdask", "pathdask-unbatched", "multi-controller")
#: the systems that run single calls, ``cfg.repeats`` times, whatever the series and repeats asked
SLOW = ("dask", "pathdask-seq")


def _seconds(run: Callable[[], float | None]) -> float:
    return run() or math.inf


def _runner(system: str, shape: str, client: Client, workers: list[str], kernels: Kernels,
            x: Any) -> Callable[[], float | None]:
    """A callable that runs ``kernels.total`` computations of ``shape`` on ``system``; returns seconds."""
    if system == "dask":
        return lambda: _dask_run(client, workers, kernels.total, kernels.cost, shape)
    if system == "multi-controller":
        return lambda: _mc_run(client, kernels, x, shape)
    mode = "sequential" if system == "pathdask-seq" else "parallel"
    return lambda: _pathdask_run(kernels, x, shape, mode, batch=system != "pathdask-unbatched")


def _pipeline(client: Client, stages: int, cfg: Config, mode: str) -> float:
    """Computations/s of a pipeline of ``stages`` one-device stages, each on its own device."""
    meshes = [client.mesh({"s": 1}) for _ in range(stages)]
    stage = function(lambda b: b + 1.0, in_specs=P(), out_specs=P(), cost=cfg.stage_cost, name="stage")

    @program
    def pipe(*xs: Any) -> Any:
        outs = []
        for x in xs:
            for m in meshes:
                x = stage(x, mesh=m)
            outs.append(x)
        return tuple(outs)

    xs = [client.put(np.zeros(8), meshes[0], P()) for _ in range(cfg.microbatches)]

    def go() -> None:
        with dask.config.set({"pathdask.dispatch": mode}):
            outs = pipe(*xs)
        for o in outs:
            o.result()

    go()
    return best_rate(lambda: timed(go), stages * cfg.microbatches, cfg.repeats)


def run(cfg: Config, topology: Topology | None = None, out: str = "bench-results", echo: Echo = print,
        processes: bool = True) -> dict[str, Any]:
    """Run the dispatch benchmark; print tables, write ``dispatch.json`` and ``dispatch.html``."""
    topology = topology or default_topology()
    result: dict[str, Any] = {"config": cfg.__dict__, "topology": topology.to_dict()}
    with LocalSystem(topology, processes=processes, dashboard_address=None) as system:
        client = system.client(name="bench")
        mesh = client.mesh({"x": topology.devices_per_island}, island=0)
        workers = [d.address for d in mesh.devices]
        x = client.put(np.zeros(mesh.size), mesh, P("x"))
        x.result()
        result["placement"] = _place(client, mesh, cfg)
        echo(f"pathdask bench dispatch: {cfg.computations} computations of a scalar all-reduce + add "
             f"over {mesh.size} devices on {len(mesh.hosts)} hosts ({topology.describe()}); "
             + _placed(result["placement"]))

        # -- Figure 5: the three shapes, cost 0 ------------------------------------
        client.reset_observations()
        since = time.time()
        batcher = client._batcher
        batched = (batcher.batched_calls, batcher.batch_programs)
        paired: dict[str, dict[str, float]] = {}
        rates = _rates(client, workers, x, 0.0, cfg.computations, cfg, repeats=cfg.figure5_repeats,
                       series=cfg.figure5_series, paired=paired)
        batched = (batcher.batched_calls - batched[0], batcher.batch_programs - batched[1])
        trace = window(client.trace(), since)
        gaps = idle_gaps(window(trace, gang="allreduce_add"))
        mc = rates["multi-controller"]
        best = {name: {s: _ratio(r.get(s), mc.get(s)) for s in SHAPES} for name, r in rates.items()}
        over_mc = {name: paired.get(name, best[name]) for name in rates}
        rows = [[name, *(r.get(s) for s in SHAPES), *(over_mc[name].get(s) for s in SHAPES)]
                for name, r in rates.items()]
        echo(f"\nFigure 5 analogue: computations/s, best run (and ratio to the multi-controller, same shape); "
             f"a run of {', '.join(TAKE_TURNS)}: {cfg.figure5_series} Chained or Fused calls of "
             f"{cfg.computations}, or {cfg.figure5_series * cfg.computations} OpByOp calls, "
             f"{cfg.figure5_repeats} rounds taking turns, the ratio the median of the rounds' ratios; "
             f"of {', '.join(SLOW)}: one call, or {cfg.computations}, best of {cfg.repeats}, "
             "the ratio of the best runs")
        echo(table(["system", *SHAPES, *(f"{s}/MC" for s in SHAPES)], rows))
        echo("ratio of the best runs alone: " + "; ".join(
            f"{name} " + " / ".join(f"{best[name][s]:.3g}" if best[name][s] else "-" for s in SHAPES)
            for name in paired))
        result["figure5"] = rates
        result["figure5_over_multicontroller"] = {"paired_median": paired, "best_over_best": best}
        result["batched_calls_per_program"] = batched[0] / batched[1] if batched[1] else None
        echo(f"pathdask's calls made while one was on its way went in batches of {batched[0]} calls as "
             f"{batched[1]} programs (pathdask-unbatched: each call its own program)")

        # -- one call at a time, each result waited for --------------------------------
        result["round_trip"] = round_trips(Kernels(0.0, 1), x, cfg.round_trips)
        echo(f"\nOne call at a time (a one-gang all-reduce over {mesh.size} devices on {len(mesh.hosts)} "
             f"hosts), each result waited for: median round trip "
             f"{result['round_trip']['call_and_result_s'] * 1e3:.2f} ms; fetching a ready result alone "
             f"{result['round_trip']['fetch_ready_s'] * 1e3:.2f} ms")

        # -- 1 ms gangs: fraction of ideal --------------------------------------------
        one_ms = _rates(client, workers, x, 1e-3, cfg.computations, cfg, systems=("pathdask",),
                        shapes=("Chained",))["pathdask"]["Chained"]
        result["chained_1ms"] = {"rate": one_ms, "fraction_of_ideal": (one_ms or 0) * 1e-3}

        # -- Figure 6: sweep of the modelled computation time ---------------------------
        sweep: dict[str, dict[float, float | None]] = {}
        for cost in cfg.costs:
            k = max(8, min(cfg.computations, int(1.0 / cost)))
            r = _rates(client, workers, x, cost, k, cfg, shapes=("OpByOp", "Chained"),
                       systems=("dask", "pathdask", "multi-controller"))
            for name, by_shape in r.items():
                for shape, rate in by_shape.items():
                    sweep.setdefault(f"{name} {shape}", {})[cost] = rate
        reference = sweep["multi-controller OpByOp"]
        reach = {name: next((c for c in cfg.costs if (v.get(c) or 0) >= 0.95 * (reference[c] or math.inf)), None)
                 for name, v in sweep.items()}
        echo("\nFigure 6 analogue: computations/s by modelled computation time (s)")
        echo(table(["system", *(f"{c:g}" for c in cfg.costs), "95% of MC at"],
                   [[name, *(v[c] for c in cfg.costs), reach[name]] for name, v in sweep.items()]))
        result["figure6"] = {"rates": {n: {str(c): r for c, r in v.items()} for n, v in sweep.items()},
                             "reaches_95pct_of_multicontroller_at_s": reach}

        # -- Figure 7: pipeline stages ----------------------------------------------------
        pipes: dict[str, dict[int, float]] = {"parallel": {}, "sequential": {}}
        for s in cfg.stages:
            if s > topology.num_devices:
                continue
            for mode in pipes:
                pipes[mode][s] = _pipeline(client, s, cfg, mode)
        echo(f"\nFigure 7 analogue: pipeline of {cfg.microbatches} microbatches, {cfg.stage_cost * 1e3:g} ms "
             "stages on distinct devices: computations/s")
        echo(table(["stages", "parallel", "sequential", "parallel/sequential"],
                   [[s, pipes["parallel"][s], pipes["sequential"][s],
                     pipes["parallel"][s] / pipes["sequential"][s]] for s in pipes["parallel"]]))
        result["figure7"] = {m: {str(s): v for s, v in r.items()} for m, r in pipes.items()}

        client.close()

    # -- security: the same workload on a system with TLS everywhere ---------------------------
    result["security"] = _secure_rates(cfg, topology, processes, rates["pathdask"], echo)

    # -- peers ------------------------------------------------------------------------------
    result["ray"] = {"skipped": "not requested (--no-ray)"}
    if cfg.ray:
        try:
            from .ray_peers import run_ray_isolated as run_ray

            result["ray"] = {"0ms": run_ray(steps=cfg.computations, participants=mesh.size),
                             "1ms": run_ray(steps=cfg.computations, participants=mesh.size, compute_s=1e-3)}
            echo("\nRay " + result["ray"]["0ms"]["ray_version"] + ": steps/s " + ", ".join(
                f"{k} {v:,.0f} (1 ms: {result['ray']['1ms'][k]:,.0f})"
                for k, v in result["ray"]["0ms"].items() if k != "ray_version"))
        except ImportError as e:
            echo(f"\nRay: skipped ({e})")
            result["ray"] = {"skipped": str(e)}

    pd_chained = rates["pathdask"]["Chained"]
    result["ratios"] = {
        "pathdask_chained_over_dask_opbyop": _ratio(pd_chained, rates["dask"]["OpByOp"]),
        "pathdask_chained_over_multicontroller_fused": _ratio(pd_chained, rates["multi-controller"]["Fused"]),
        "pathdask_chained_1ms_fraction_of_ideal": result["chained_1ms"]["fraction_of_ideal"],
        "pipeline_parallel_over_sequential": {
            str(s): pipes["parallel"][s] / pipes["sequential"][s] for s in pipes["parallel"]},
        # Plain Dask may never reach 95% within the sweep: then it is at least this far behind.
        "dask_over_pathdask_95pct_cost": _ratio(reach.get("dask OpByOp") or cfg.costs[-1] * 10,
                                                reach.get("pathdask Chained")),
        "dask_reaches_95pct_within_sweep": reach.get("dask OpByOp") is not None,
        "tls_over_plain_chained": result["security"].get("over_plain", {}).get("Chained"),
        # Figure 5's ratios: the median of the rounds' ratios (see _rates)
        "pathdask_opbyop_over_multicontroller": over_mc["pathdask"]["OpByOp"],
        "pathdask_unbatched_opbyop_over_multicontroller": over_mc["pathdask-unbatched"]["OpByOp"],
        "pathdask_chained_over_multicontroller": over_mc["pathdask"]["Chained"],
        "pathdask_fused_over_multicontroller": over_mc["pathdask"]["Fused"],
        "round_trip_ms": result["round_trip"]["call_and_result_s"] * 1e3,
    }
    result["idle_gap_median_s"] = median(gaps)
    ray_cg = result.get("ray", {}).get("0ms", {}).get("ray_compiled_graph") if cfg.ray else None
    if ray_cg:
        result["ratios"]["pathdask_chained_over_ray_compiled_graph"] = _ratio(pd_chained, ray_cg)
    echo("\nRatios: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in result["ratios"].items()))
    echo(f"median device idle gap between back-to-back gangs: "
         f"{(result['idle_gap_median_s'] or 0) * 1e6:.1f} us")

    html = save_plots(f"{out}/dispatch.html", "pathdask bench dispatch", [
        {"title": "Figure 6: throughput by computation size", "x_label": "modelled computation (s)",
         "y_label": "computations/s", "log_x": True,
         "series": {n: (list(cfg.costs), [v[c] for c in cfg.costs]) for n, v in sweep.items()}},
        {"title": "Figure 7: pipeline throughput", "x_label": "stages", "y_label": "computations/s",
         "series": {m: (list(r), list(r.values())) for m, r in pipes.items()}},
    ], trace)
    write_json(f"{out}/dispatch.json", result)
    echo(f"wrote {out}/dispatch.json and {html}")
    return result


def _secure_rates(cfg: Config, topology: Topology, processes: bool, plain: dict[str, float | None],
                  echo: Echo) -> dict[str, Any]:
    """pathdask's rates on a fresh system whose Dask comms and host transport use TLS."""
    if not cfg.security:
        return {"skipped": "not requested"}
    try:
        secure = LocalSystem(topology, processes=processes, dashboard_address=None, security=True).start()
    except ImportError as e:  # Security.temporary() needs cryptography
        echo(f"\nTLS: skipped ({e})")
        return {"skipped": str(e)}
    with secure:
        client = secure.client(name="bench-tls")
        mesh = client.mesh({"x": topology.devices_per_island}, island=0)
        x = client.put(np.zeros(mesh.size), mesh, P("x"))
        x.result()
        _place(client, mesh, cfg)
        rates = _rates(client, [d.address for d in mesh.devices], x, 0.0, cfg.computations, cfg,
                       systems=("pathdask",), shapes=("OpByOp", "Chained"), repeats=cfg.figure5_repeats,
                       series=cfg.figure5_series)["pathdask"]  # as Figure 5's, to be held against them
        client.close()
    ratios = {shape: _ratio(rates[shape], plain.get(shape)) for shape in rates}
    echo("\nWith TLS (Dask comms and the host transport): computations/s, and ratio to without")
    echo(table(["shape", "TLS", "plain", "TLS/plain"], [[s, rates[s], plain.get(s), ratios[s]] for s in rates]))
    return {"rates": rates, "over_plain": ratios}


def _place(client: Client, mesh: Any, cfg: Config) -> dict[str, int] | None:
    """The hosts' processes on CPUs of their own (the mesh's first), if ``cfg`` asks."""
    if not cfg.pin_hosts:
        return None
    hosts = list(mesh.hosts)
    others = sorted(set(client.dask.scheduler_info()["workers"]) - set(hosts))
    return hosts_on_own_cpus(client.dask, hosts + others)


def _placed(placement: dict[str, int] | None) -> str:
    if placement is None:
        return "host processes not pinned"
    return "each host process pinned to a CPU: " + ", ".join(f"{h} on {c}" for h, c in placement.items())


def _check(values: np.ndarray, k: int) -> None:
    """Every shard starts at 0 and gains exactly 1 per computation."""
    if not np.allclose(values, k):
        raise AssertionError(f"benchmark computed {values}, expected {k} on every shard")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None
