"""``pathdask bench roundtrip``: where the round trip of a waiting call goes.

A training loop that reads its loss each step waits for every call. Here one
call at a time runs and is waited for (``y = step(y); y.result()``), on the
embedded system with worker processes. The round trips reported are timed with
the stopwatch (:mod:`pathdask.stopwatch`) off; as many calls again run with it
on in every process, and their marks give the median time at which a call
reached each station of its path (client, scheduler, hosts, devices, back), and
so the median cost of every step between two stations. In the same run, on the
same cluster, plain Dask's ``client.submit(f, x).result()`` is timed as the
reference the round trip is held against. The three take turns, block by block
(:data:`ROUNDS`), so that each sees the same moments of a noisy machine.

Two calls are timed: a one-device gang (one host), and the all-reduce of
``bench dispatch`` over one island's devices (its hosts exchange pieces). For a
station that several hosts pass, the last host counts: the call waits for it.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import P, function, pmean, stopwatch
from ..system import LocalSystem, default_topology
from ..topology import Topology
from .dispatch import _host_pacing
from .report import median, table, timed, write_json

Echo = Callable[[str], Any]

#: rounds of the measures taking turns (:func:`run`)
ROUNDS = 5

#: stations that hosts pass: the last host to pass one is the one the call waits for
HOST_STATIONS = frozenset({"ordered", "dispatched", "run", "ran", "served"})


@dataclass
class Config:
    #: calls timed per kind, one at a time, each waited for
    calls: int = 300
    #: of which the first are not counted (connections, caches)
    warmup: int = 20

    @classmethod
    def small(cls) -> Config:
        return cls(calls=30, warmup=5)


def _inc(x: int) -> int:
    return x + 1


def _marks_everywhere(dask_client: Any) -> dict[int, list[tuple[float, str, str]]]:
    """Every process's marks, by process id (the scheduler may share this process)."""
    def mine() -> tuple[int, list[tuple[float, str, str]]]:
        return os.getpid(), stopwatch.marks()

    found = dict([mine(), dask_client.run_on_scheduler(mine)])
    found.update(dict(dask_client.run(mine).values()))
    return found


def stations(marks: dict[int, list[tuple[float, str, str]]], pids: set[str]) -> dict[str, list[float]]:
    """Per station, the seconds after ``call`` at which each of ``pids`` passed it."""
    when: dict[str, dict[str, float]] = defaultdict(dict)
    for found in marks.values():
        for t, station, pid in found:
            if pid not in pids:
                continue
            seen = when[pid].get(station)
            if seen is None or (t > seen if station in HOST_STATIONS else t < seen):
                when[pid][station] = t
    out: dict[str, list[float]] = defaultdict(list)
    for times in when.values():
        if "call" in times and "result" in times:
            for station, t in times.items():
                out[station].append(t - times["call"])
    return out


def breakdown(offsets: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Stations in path order with the median time since ``call`` and the step from the one before."""
    rows, before = [], 0.0
    for station in sorted((s for s in stopwatch.STATIONS if offsets.get(s)), key=lambda s: median(offsets[s]) or 0):
        at = median(offsets[station]) or 0.0
        rows.append({"station": station, "at_ms": at * 1e3, "step_ms": (at - before) * 1e3,
                     "calls": len(offsets[station])})
        before = at
    return rows


def _time_calls(step: Any, x: Any, n: int) -> tuple[Any, set[str], list[float]]:
    """``n`` waiting calls of ``step``, each reading the last one's output: the last output,
    the calls' program ids and their round trips in seconds."""
    pids, seconds = set(), []
    for _ in range(n):
        start = time.perf_counter()
        x = step(x)
        x.result()
        seconds.append(time.perf_counter() - start)
        pids.add(x.ref.pid)
    return x, pids, seconds


class _Stopwatches:
    """The stopwatch in every process of a system (client, scheduler, hosts), on or off."""

    def __init__(self, dask_client: Any) -> None:
        self.dask = dask_client

    def __enter__(self) -> _Stopwatches:
        self.dask.run(stopwatch.enable)
        self.dask.run_on_scheduler(stopwatch.enable)
        stopwatch.enable()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.dask.run(stopwatch.disable)
        self.dask.run_on_scheduler(stopwatch.disable)
        stopwatch.disable()


def run(cfg: Config, topology: Topology | None = None, out: str = "bench-results", echo: Echo = print
        ) -> dict[str, Any]:
    """Run the round-trip benchmark; print its tables and write ``roundtrip.json``.

    The calls go in :data:`ROUNDS` rounds, so that every measure sees the same moments of
    a noisy machine: in each, a block of each kind's calls timed with the stopwatch off
    (the round trips reported), a block with it on (the stations), and a block of plain
    Dask's ``submit().result()``.
    """
    topology = topology or default_topology()
    result: dict[str, Any] = {"config": cfg.__dict__, "topology": topology.to_dict()}
    with LocalSystem(topology, processes=True, dashboard_address=None) as system:
        client = system.client(name="bench-roundtrip")
        dask_client = client.dask
        island = client.mesh({"x": topology.devices_per_island})
        one = client.mesh({"x": 1})
        kinds = {
            "one device": (one, function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="add")),
            f"all-reduce, {island.size} devices on {len(island.hosts)} hosts":
                (island, function(lambda b: pmean(b, "x") + 1.0, in_specs=P("x"), out_specs=P("x"),
                                  name="allreduce_add")),
        }
        echo(f"pathdask bench roundtrip: {cfg.calls - cfg.warmup} waiting calls of each kind, and as many "
             f"with the stopwatch on, worker processes ({topology.describe()})")
        last = {name: client.put(np.zeros(mesh.size), mesh, P("x")) for name, (mesh, _) in kinds.items()}
        for name, (_, step) in kinds.items():  # warm: traces, plans on the hosts, connections
            last[name] = _time_calls(step, last[name], cfg.warmup)[0]
        dask_client.submit(_inc, 1, pure=False).result()
        block = max(1, (cfg.calls - cfg.warmup) // ROUNDS)
        seconds: dict[str, list[float]] = {name: [] for name in kinds}
        watched: dict[str, set[str]] = {name: set() for name in kinds}
        watched_seconds: dict[str, list[float]] = {name: [] for name in kinds}
        marks: dict[int, list[tuple[float, str, str]]] = defaultdict(list)
        dask_seconds: list[float] = []
        for _ in range(ROUNDS):
            for name, (_, step) in kinds.items():
                last[name], _pids, took = _time_calls(step, last[name], block)
                seconds[name] += took
            with _Stopwatches(dask_client):
                for name, (_, step) in kinds.items():
                    last[name], pids, took = _time_calls(step, last[name], block)
                    watched[name] |= pids
                    watched_seconds[name] += took
                for pid, found in _marks_everywhere(dask_client).items():
                    marks[pid] += found
            # plain Dask with Dask's own stream intervals (pathdask batches Dask's messages longer
            # on its hosts)
            dask_client.run(_host_pacing, True)
            try:
                dask_seconds += [timed(lambda: dask_client.submit(_inc, 1, pure=False).result())
                                 for _ in range(block)]
            finally:
                dask_client.run(_host_pacing, False)
        client.close()
    dask_s = median(dask_seconds)
    result["dask_submit_result_ms"] = dask_s * 1e3 if dask_s else None
    result["kinds"] = {}
    for name in kinds:
        rows = breakdown(stations(marks, watched[name]))
        rt, rt_watched = median(seconds[name]), median(watched_seconds[name])
        result["kinds"][name] = {"round_trip_ms": rt * 1e3 if rt else None, "stations": rows,
                                 "round_trip_watched_ms": rt_watched * 1e3 if rt_watched else None,
                                 "ratio_to_dask": rt / dask_s if rt and dask_s else None}
        echo(f"\n{name}: median round trip {rt * 1e3 if rt else float('nan'):.2f} ms "
             f"({rt_watched * 1e3 if rt_watched else float('nan'):.2f} ms with the stopwatch on); where it goes "
             "(stopwatch on: median ms after the call was made, and since the station before)")
        echo(table(["station", "at ms", "step ms"], [[r["station"], r["at_ms"], r["step_ms"]] for r in rows]))
    echo(f"\nplain Dask, client.submit(f, 1).result(): median {result['dask_submit_result_ms']:.2f} ms")
    echo(table(["call", "round trip ms", "/ Dask submit().result()"],
               [[n, k["round_trip_ms"], k["ratio_to_dask"]] for n, k in result["kinds"].items()]))
    path = os.path.join(out, "roundtrip.json")
    write_json(path, result)
    echo(f"\nwrote {path}")
    return result
