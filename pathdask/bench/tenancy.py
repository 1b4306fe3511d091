"""``pathdask bench tenancy``: the paper's Figures 8 and 9 at our scale.

- **Figure 9**: 4 clients with weights 1:1:1:1, then 1:2:4:8, keep small
  gang-scheduled programs in flight on the same devices under proportional
  share. Each client's share of device time is measured from the system's
  trace (``client.trace()``), over the interval in which every client had work queued.
- **Figure 8**: 1 to 16 concurrent clients each run small programs one after
  another (each waits for its result, as an interactive client would). The
  aggregate computations/s show what time-multiplexing costs, and that clients
  that cannot saturate the devices alone do so together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import P, function, pmean, program
from ..dashboard.trace import gangs_of
from ..system import LocalSystem, default_topology
from ..topology import Topology
from .report import save_plots, table, window, write_json

Echo = Callable[[str], Any]


@dataclass
class Config:
    weights: tuple[tuple[float, ...], ...] = ((1, 1, 1, 1), (1, 2, 4, 8))
    share_seconds: float = 4.0
    gang_cost: float = 1e-3
    gangs_per_program: int = 4
    inflight: int = 4
    clients: tuple[int, ...] = (1, 2, 4, 8, 16)
    process_clients: tuple[int, ...] = (4, 8)
    costs: tuple[float, ...] = (5e-5, 5e-4, 2e-3)
    throughput_seconds: float = 2.0

    @classmethod
    def small(cls) -> Config:
        return cls(weights=((1, 1), (1, 3)), share_seconds=1.0, clients=(1, 2), process_clients=(2,),
                   costs=(5e-4,), throughput_seconds=0.5)


def _programs(cost: float, gangs: int) -> Any:
    step = function(lambda b: pmean(b, "x") + 1.0, in_specs=P("x"), out_specs=P("x"), cost=cost,
                    name="tenant_step")

    @program
    def prog(x: Any) -> Any:
        for _ in range(gangs):
            x = step(x)
        return x

    return prog


def _warm_up(client: Any, devices: int, prog: Any) -> Any:
    """The tenant's input on the first ``devices`` devices of island 0 (every tenant on the same
    ones, as Figure 8's clients share one island: the resource manager would spread smaller
    meshes over the least-loaded devices), with ``prog`` traced and cached already, so that
    the measurement starts with the first real call."""
    mesh = client.mesh({"x": devices}, devices=list(range(devices)))  # island 0's devices come first
    x = client.put(np.zeros(mesh.size), mesh, P("x"))
    prog(x).result()
    return x


def _shares(system: LocalSystem, cfg: Config, weights: tuple[float, ...], echo: Echo) -> dict[str, Any]:
    """Run one client per weight until ``share_seconds`` pass; device-time share per client."""
    clients = [system.client(name=f"w{w:g}-{i}", weight=w) for i, w in enumerate(weights)]
    prog = _programs(cfg.gang_cost, cfg.gangs_per_program)
    stop = threading.Event()
    errors: list[BaseException] = []
    ready = threading.Barrier(len(clients) + 1)

    def tenant(c: Any) -> None:
        try:
            x = _warm_up(c, system.topology.devices_per_island, prog)
            ready.wait()
            inflight = [prog(x) for _ in range(cfg.inflight)]
            while not stop.is_set():
                inflight.pop(0).result()
                inflight.append(prog(x))
            for y in inflight:
                y.result()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=tenant, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    ready.wait()
    start = time.time()  # wall clock, as a trace's times are
    time.sleep(cfg.share_seconds)  # the measurement window: the tenants work meanwhile
    end = time.time()
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    trace = window(clients[0].trace(), start)
    busy: dict[str, float] = {c.id: 0.0 for c in clients}
    ops: dict[str, int] = {c.id: 0 for c in clients}
    gangs = gangs_of(trace)
    for s, e, client in zip(gangs["start"], gangs["end"], gangs["client"]):
        if client in busy and s < end:
            busy[client] += min(e, end) - s
            ops[client] += 1
    total = sum(busy.values()) or 1.0
    share = [busy[c.id] / total for c in clients]
    expected = [w / sum(weights) for w in weights]
    out = {
        "weights": list(weights),
        "share": share,
        # of the gangs begun: each one's modelled time (all are alike), without the real
        # spans' delays of one process's threads
        "ops_share": [ops[c.id] / (sum(ops.values()) or 1) for c in clients],
        "expected": expected,
        "relative_error": [abs(s - x) / x for s, x in zip(share, expected)],
        "trace": window(trace, until=start + 0.2),
    }
    for c in clients:
        c.close()
    return out


def _throughput(system: LocalSystem, n: int, cost: float, seconds: float, inflight: int = 1,
                devices: int | None = None) -> float:
    """Aggregate gangs/s of ``n`` clients that each keep ``inflight`` programs outstanding
    (1: each waits for every result before the next call), all on the same ``devices`` devices
    (by default an island's)."""
    clients = [system.client(name=f"t{i}") for i in range(n)]
    prog = _programs(cost, 1)
    counts = [0] * n
    barrier = threading.Barrier(n + 1)
    stop = threading.Event()

    def tenant(i: int) -> None:
        c = clients[i]
        x = _warm_up(c, devices or system.topology.devices_per_island, prog)
        barrier.wait()
        pending = [prog(x) for _ in range(inflight - 1)]
        while not stop.is_set():
            pending.append(prog(x))
            pending.pop(0).result()
            counts[i] += 1
        for y in pending:
            y.result()

    threads = [threading.Thread(target=tenant, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for c in clients:
        c.close()
    return sum(counts) / elapsed


def _tenant_process(address: str, devices: int, cost: float, seconds: float, ready: Any, go: Any,
                    results: Any) -> None:
    """One client in its own process: connects, warms up, then runs until ``seconds`` pass."""
    from ..client.client import connect

    with connect(address, name="proc-tenant") as c:
        prog = _programs(cost, 1)
        x = _warm_up(c, devices, prog)
        ready.put(True)
        go.wait()
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            prog(x).result()
            count += 1
        results.put(count)


def _throughput_processes(system: LocalSystem, n: int, cost: float, seconds: float) -> float:
    """Aggregate gangs/s of ``n`` clients in ``n`` processes, each waiting for every result.

    Clients in one process share one Dask client event loop and one GIL; in their
    own processes they are as independent as the paper's clients.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_tenant_process, args=(system.scheduler_address, system.topology.devices_per_island,
                                                       cost, seconds, ready, go, results)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        total = sum(results.get(timeout=seconds + 120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()  # one of ours, by its handle
    return total / seconds


def run(cfg: Config, topology: Topology | None = None, out: str = "bench-results", echo: Echo = print,
        processes: bool = True) -> dict[str, Any]:
    """Run the tenancy benchmark; print tables, write ``tenancy.json`` and ``tenancy.html``."""
    topology = topology or default_topology()
    result: dict[str, Any] = {"config": cfg.__dict__}
    with LocalSystem(topology, processes=processes, dashboard_address=None, policy="proportional") as system:
        echo(f"pathdask bench tenancy: proportional share on {topology.devices_per_island} devices "
             f"({topology.describe()})")
        shares = [_shares(system, cfg, w, echo) for w in cfg.weights]
        echo("\nFigure 9 analogue: share of device time by client weight")
        echo(table(["weights", "measured share", "expected share", "max relative error"],
                   [[":".join(f"{w:g}" for w in s["weights"]), " ".join(f"{x:.3f}" for x in s["share"]),
                     " ".join(f"{x:.3f}" for x in s["expected"]), max(s["relative_error"])] for s in shares]))
        result["figure9"] = [{k: v for k, v in s.items() if k != "trace"} for s in shares]

        rates: dict[float, dict[int, float]] = {}
        procs: dict[float, dict[int, float]] = {}
        pipelined: dict[float, float] = {}
        for cost in cfg.costs:
            rates[cost] = {n: _throughput(system, n, cost, cfg.throughput_seconds) for n in cfg.clients}
            procs[cost] = {n: _throughput_processes(system, n, cost, cfg.throughput_seconds)
                           for n in cfg.process_clients}
            pipelined[cost] = _throughput(system, 1, cost, cfg.throughput_seconds, inflight=cfg.inflight)
        echo("\nFigure 8 analogue: aggregate gangs/s of N clients that each wait for their results (threads "
             f"of this process, or one process each), and of one client that keeps {cfg.inflight} in flight")
        echo(table(["modelled gang (s)", *(f"{n} clients" for n in cfg.clients),
                    *(f"{n} procs" for n in cfg.process_clients), "1 pipelined", "best / 1 client",
                    "best / 1 pipelined"],
                   [[f"{c:g}", *r.values(), *procs[c].values(), pipelined[c],
                     max(*r.values(), *procs[c].values()) / r[cfg.clients[0]],
                     max(*r.values(), *procs[c].values()) / pipelined[c]] for c, r in rates.items()]))
        result["figure8"] = {str(c): {str(n): v for n, v in r.items()} for c, r in rates.items()}
        result["figure8_processes"] = {str(c): {str(n): v for n, v in r.items()} for c, r in procs.items()}
        result["figure8_one_client_pipelined"] = {str(c): v for c, v in pipelined.items()}
    result["ratios"] = {
        "max_share_relative_error": {":".join(f"{w:g}" for w in s["weights"]): max(s["relative_error"])
                                     for s in shares},
        "aggregate_over_single_client": {str(c): max(*r.values(), *procs[c].values()) / r[cfg.clients[0]]
                                         for c, r in rates.items()},
        "aggregate_over_single_pipelined_client": {str(c): max(*r.values(), *procs[c].values()) / pipelined[c]
                                                   for c, r in rates.items()},
    }
    last = shares[-1]
    html = save_plots(f"{out}/tenancy.html", "pathdask bench tenancy", [
        {"title": "Figure 8: aggregate throughput by number of clients", "x_label": "clients",
         "y_label": "gangs/s", "series": {f"{c:g} s gangs": (list(r), list(r.values())) for c, r in rates.items()}},
    ], last["trace"])
    write_json(f"{out}/tenancy.json", result)
    echo(f"wrote {out}/tenancy.json and {html}")
    return result
