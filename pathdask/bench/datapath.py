"""``pathdask bench datapath``: how fast real bytes move, beside what the machine can do.

On one island of 2 hosts x 2 devices (one worker process per host), for each
array size it times, in GB/s of the array's bytes:

- ``put``: ``client.put`` of a float64 array sharded over the 4 devices, until
  the devices hold it;
- ``result``: fetching it back into one NumPy array;
- ``reshard``: a move onto the same devices in reverse order, so every block
  crosses between the two hosts;
- ``all_gather``: every device gathers the whole array (tiled ``all_gather``);

beside, in the same run, loopback TCP (two threads of this process, one socket)
and ``memcpy`` (``np.copyto``).

With processes (the default) the system is a :class:`~pathdask.deploy.CliSystem`:
the client (this process), the scheduler and each host are separate processes,
so each one's memory is its own. Around a ``put`` of the largest array, every
process's peak resident memory (``VmHWM``, reset first through
``/proc/self/clear_refs``) is read, and reported as growth over its resident
memory just before the put. Writes ``datapath.json`` and ``datapath.html``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np

from .. import P, all_gather, function
from ..deploy import CliSystem
from ..system import LocalSystem
from ..topology import Topology
from .report import save_plots, table, write_json

Echo = Callable[[str], Any]
MiB = 2**20
OPS = ("put", "result", "reshard", "all_gather")


@dataclass
class Config:
    sizes_mib: tuple[int, ...] = (1, 16, 256, 1024)
    repeats: int = 2

    @classmethod
    def small(cls) -> Config:
        return cls(sizes_mib=(1, 8), repeats=1)


def topology(largest_mib: int) -> Topology:
    """One island of 2 hosts x 2 devices, with HBM for a few copies of the largest block."""
    return Topology(islands=1, hosts_per_island=2, devices_per_host=2, hbm=max(1, largest_mib) * MiB)


def loopback_tcp(nbytes: int) -> float:
    """GB/s of one loopback TCP connection between two threads of this process."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    server = socket.create_server(("127.0.0.1", 0))
    got: list[float] = []

    def receive() -> None:
        conn, _ = server.accept()
        view, n = dst.data, 0
        while n < nbytes:
            n += conn.recv_into(view[n:], nbytes - n)
        got.append(time.perf_counter())
        conn.close()

    t = threading.Thread(target=receive)
    t.start()
    with socket.create_connection(server.getsockname()[:2]) as s:
        start = time.perf_counter()
        s.sendall(src.data)
        t.join()
    server.close()
    return nbytes / (got[0] - start) / 1e9


def memcpy(nbytes: int) -> float:
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    start = time.perf_counter()
    np.copyto(dst, src)
    return nbytes / (time.perf_counter() - start) / 1e9


def _memory(dask_worker: Any = None, dask_scheduler: Any = None, reset: bool = False) -> dict[str, int]:
    """This process's resident and peak resident bytes (``VmRSS``, ``VmHWM``; Linux, else 0).

    ``reset`` first lowers the peak to the current resident size (``clear_refs``).
    """
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
    found = {"rss": 0, "peak": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found["rss" if line.startswith("VmRSS") else "peak"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


def _memory_everywhere(client: Any, reset: bool = False) -> dict[str, dict[str, int]]:
    """``_memory`` of the client, the scheduler and each host process, by role."""
    workers = client.dask.run(_memory, reset=reset)
    return {"client": _memory(reset=reset), "scheduler": client.dask.run_on_scheduler(_memory, reset=reset),
            **{f"host {i}": workers[a] for i, a in enumerate(sorted(workers))}}


def memory_during_put(client: Any, mesh: Any, data: np.ndarray, wait: Callable[[Any], Any]) -> dict[str, Any]:
    """Each process's peak memory growth while ``data`` is put onto ``mesh`` (and waited for)."""
    before = _memory_everywhere(client, reset=True)
    x = client.put(data, mesh, P("d"))
    wait(x)
    after = _memory_everywhere(client)
    del x
    growth = {k: max(0, after[k]["peak"] - before[k]["rss"]) for k in before}
    per_host = data.nbytes / len(mesh.hosts)
    return {"array_bytes": data.nbytes, "growth_bytes": growth,
            # the client already holds the array: the goal is a peak of at most 1.2x of it
            "client_over_array": (data.nbytes + growth["client"]) / data.nbytes,
            "host_over_shards": {k: v / per_host for k, v in growth.items() if k.startswith("host")},
            "scheduler_growth_mib": growth["scheduler"] / MiB}


def run(cfg: Config, out: str = "bench-results", echo: Echo = print, processes: bool = True) -> dict[str, Any]:
    """Run the data-path benchmark; print a table, write ``datapath.json`` and ``datapath.html``."""
    largest = max(cfg.sizes_mib)
    rates: dict[str, dict[int, float]] = {op: {} for op in (*OPS, "loopback TCP", "memcpy")}
    # the all-gather holds 4 copies of the array on each device, and the check of
    # replication would hash them: turn it off, it is not the data path
    topo = topology(6 * largest)
    system: CliSystem | LocalSystem = CliSystem(topo) if processes else \
        LocalSystem(topo, processes=False, dashboard_address=None)
    with dask.config.set({"pathdask.check-replication": False}), system:
        client = system.client(name="datapath")
        mesh = client.mesh({"d": 4})
        reverse = client.mesh({"d": 4}, devices=list(reversed(mesh.device_ids)))
        head = function(lambda b: b[:1], in_specs=P("d"), out_specs=P("d"), name="head")
        ident = function(lambda b: b, in_specs=P("d"), out_specs=P("d"), name="moved")
        gather = function(lambda b: all_gather(b, "d", tiled=True)[:4], in_specs=P("d"), out_specs=P(),
                          name="gathered")
        echo(f"pathdask bench datapath: float64 arrays over {mesh.size} devices on {len(mesh.hosts)} hosts")
        # memory first, while every process is fresh: later runs leave freed pages behind
        data = np.random.default_rng(0).random(largest * MiB // 8)
        memory = memory_during_put(client, mesh, data, lambda x: head(x).result())
        del data
        for mib in cfg.sizes_mib:
            measured = _measure(client, mesh, reverse, (head, ident, gather), mib, cfg.repeats)
            for op, rate in measured.items():
                rates[op][mib] = rate
        peaks = {k: v["peak"] for k, v in _memory_everywhere(client).items()}
        client.close()

    rows = [[op, *(rates[op][m] for m in cfg.sizes_mib)] for op in rates]
    echo("GB/s by array size (MiB)")
    echo(table(["path", *map(str, cfg.sizes_mib)], rows))
    ratios = {op: {str(m): rates[op][m] / rates["loopback TCP"][m] for m in cfg.sizes_mib} for op in OPS}
    echo("\nshare of loopback TCP: " + "; ".join(
        f"{op} {ratios[op][str(largest)]:.2f}" for op in OPS) + f" (at {largest} MiB)")
    echo("peak resident memory over the run: " + ", ".join(f"{k} {v / MiB:,.0f} MiB" for k, v in peaks.items()))
    echo(f"during a {largest} MiB put, peak growth: " + ", ".join(
        f"{k} {v / MiB:,.1f} MiB" for k, v in memory["growth_bytes"].items()))
    echo(f"  client {memory['client_over_array']:.2f}x the array; hosts " + ", ".join(
        f"{v:.2f}x" for v in memory["host_over_shards"].values()) + " their shards; scheduler "
        f"+{memory['scheduler_growth_mib']:.1f} MiB" + ("" if processes else " (in this process)"))
    result = {"config": cfg.__dict__, "gb_per_s": {op: {str(m): v for m, v in r.items()} for op, r in rates.items()},
              "over_loopback_tcp": ratios, "peak_rss_bytes": peaks, "memory_during_put": memory,
              "processes": processes}
    html = save_plots(f"{out}/datapath.html", "pathdask bench datapath", [
        {"title": "data path bandwidth", "x_label": "array size (MiB)", "y_label": "GB/s", "log_x": True,
         "series": {op: (list(cfg.sizes_mib), [r[m] for m in cfg.sizes_mib]) for op, r in rates.items()}},
    ])
    write_json(f"{out}/datapath.json", result)
    echo(f"wrote {out}/datapath.json and {html}")
    return result


def _measure(client: Any, mesh: Any, reverse: Any, fns: tuple[Any, Any, Any], mib: int,
             repeats: int) -> dict[str, float]:
    """GB/s of each path for one array of ``mib`` MiB (best of ``repeats``)."""
    head, ident, gather = fns
    nbytes = mib * MiB
    data = np.random.default_rng(mib).random(nbytes // 8)

    def rate(step: Callable[[], Any]) -> float:
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        return nbytes / best / 1e9

    x = client.put(data, mesh, P("d"))
    head(x).result()
    return {
        "put": rate(lambda: head(client.put(data, mesh, P("d"))).result()),
        "result": rate(lambda: _checked(x.result(), data)),
        "reshard": rate(lambda: head(ident(x, mesh=reverse)).result()),
        "all_gather": rate(lambda: gather(x).result()),
        "loopback TCP": max(loopback_tcp(nbytes) for _ in range(repeats)),
        "memcpy": max(memcpy(nbytes) for _ in range(repeats)),
    }


def _checked(got: np.ndarray, expected: np.ndarray) -> None:
    if not np.array_equal(got, expected):
        raise AssertionError("the data path returned different bytes")
