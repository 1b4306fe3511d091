"""``pathdask bench dispatch --netns``: dispatch over a real network stack, beside the embedded system.

The same one-gang all-reduce as ``bench dispatch`` runs on a
:class:`~pathdask.netns.NetnsSystem` (the scheduler and every host in a network
namespace of its own, joined by a bridge, each started with the dask CLI), with
a one-way delay of 0, 0.1 and 1 ms on every link, and on the embedded
``LocalSystem`` (worker processes on loopback). For each: the median round trip
of one call whose result is waited for, and calls/s with many calls in flight
(one call per computation, and one program of many gangs). A delay is set with
the kernel's ``netem``, or where it is missing on a user-space delay line per
machine (then a row with no delay on delay lines shows the line's own cost; see
also ``bench delayline``); where neither can run, that row says why and is not
measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import P
from ..netns import LinkError, NetnsSystem, Shape, delay_unavailable, kernel_has_netem
from ..system import LocalSystem, default_topology
from ..systems import System
from ..topology import Topology
from .dispatch import Config, Echo, Kernels, _rates, round_trips
from .report import table, write_json

DELAYS = (0.0, 1e-4, 1e-3)


def measure(system: System, topology: Topology, cfg: Config) -> dict[str, Any]:
    """Round trip and calls/s of pathdask on a started ``system``."""
    client = system.client(name="bench-netns")
    try:
        mesh = client.mesh({"x": topology.devices_per_island}, island=0)
        x = client.put(np.zeros(mesh.size), mesh, P("x"))
        x.result()
        rt = round_trips(Kernels(0.0, 1), x, cfg.round_trips)
        rates = _rates(client, [d.address for d in mesh.devices], x, 0.0, cfg.computations, cfg,
                       systems=("pathdask",), shapes=("OpByOp", "Chained"))["pathdask"]
        return {"round_trip_ms": (rt["call_and_result_s"] or 0.0) * 1e3,
                "fetch_ready_ms": (rt["fetch_ready_s"] or 0.0) * 1e3,
                "opbyop_per_s": rates["OpByOp"], "chained_per_s": rates["Chained"],
                "hosts": len(mesh.hosts), "devices": mesh.size}
    finally:
        client.close()


def run(cfg: Config, topology: Topology | None = None, out: str = "bench-results", echo: Echo = print,
        delays: tuple[float, ...] = DELAYS) -> dict[str, Any]:
    """Measure the embedded system and a namespaced one per delay; print, write ``dispatch-netns.json``."""
    topology = topology or default_topology()
    rows: dict[str, dict[str, Any]] = {}
    with LocalSystem(topology, processes=True, dashboard_address=None) as local:
        rows["embedded (loopback)"] = measure(local, topology, cfg)
    lines = any(delays) and not kernel_has_netem() and not delay_unavailable()
    runs = [(d, None) for d in delays] + ([(0.0, True)] if lines else [])  # and the line's own cost
    for delay, delay_line in runs:
        name = f"netns, delay {delay * 1e3:g} ms" + (" on delay lines" if delay_line else "")
        reason = delay_unavailable() if delay else None
        if reason:
            rows[name] = {"skipped": reason}
            continue
        try:
            with NetnsSystem(topology, shape=Shape(delay=delay), delay_line=delay_line) as system:
                rows[name] = measure(system, topology, cfg)
                rows[name]["link"] = "delay line" if system.network.machine("scheduler").line else (
                    "veth + netem" if delay else "veth")
        except LinkError as e:
            rows[name] = {"skipped": str(e)}
    echo(f"pathdask bench dispatch --netns: a one-gang all-reduce over the {topology.devices_per_island} "
         f"devices of island 0 ({topology.describe()}); every link's one-way delay as given")
    echo(table(["system", "link", "round trip (ms)", "ready fetch (ms)", "OpByOp calls/s", "Chained gangs/s"],
               [[n, r.get("link", "loopback"), r.get("round_trip_ms"), r.get("fetch_ready_ms"), r.get("opbyop_per_s"),
                 r.get("chained_per_s")] if "skipped" not in r else [n, "skipped: " + r["skipped"], None, None, None, None]
                for n, r in rows.items()]))
    result = {"config": cfg.__dict__, "topology": topology.to_dict(), "netem": kernel_has_netem(), "rows": rows}
    write_json(f"{out}/dispatch-netns.json", result)
    echo(f"wrote {out}/dispatch-netns.json")
    return result
