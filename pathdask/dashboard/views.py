"""What each dashboard page shows, as plain JSON-able data.

The JSON API returns these as they are; the Bokeh pages turn the same data
into plot columns, so that a page and its route never disagree.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ..topology import LINK_CLASSES, Topology
from .record import ActivityRecord, columns

if TYPE_CHECKING:
    from ..core.order import IslandScheduler
    from ..scheduler.resources import ResourceManager


class Observed(Protocol):
    """What the views read of the scheduler plugin (``PathwaysScheduler`` is one)."""

    topology: Topology
    resources: ResourceManager
    clients: dict[str, dict[str, Any]]

    @property
    def order(self) -> IslandScheduler: ...

VIEWS = ("timeline", "memory", "links", "queue", "resources")


def timeline(record: ActivityRecord, since: float | None = None, limit: int | None = None) -> dict[str, Any]:
    """Recorded gangs as columns (``device``, ``start``, ``end`` in wall-clock seconds, ``program``,
    ``gang``, ``client``, ``bytes_in``, ``bytes_out``, ``name``), ended at or after ``since``;
    the newest ``limit`` of them."""
    gangs = list(record.gangs) if since is None else record.since(since)
    if limit is not None:
        gangs = gangs[len(gangs) - limit:] if limit > 0 else []
    return {"now": time.time(), "updated": record.updated, "devices": record.devices(),
            "clients": dict(record.names), "recorded": len(record.gangs), "count": len(gangs),
            "gangs": columns(gangs)}


def memory(record: ActivityRecord) -> dict[str, Any]:
    """Per device: bytes in use, capacity and peak; stored bytes per client; bytes allocated by
    running gangs and not stored yet (``in_flight``), so that the parts add up to the whole."""
    devices = []
    for d, m in sorted(record.memory.items()):
        by_client = {str(c): int(n) for c, n in m.get("by_client", {}).items()}
        devices.append({"device": d, "address": record.hosts.get(d), "capacity": m["capacity"],
                        "bytes_in_use": m["bytes_in_use"], "peak": m["peak"], "buffers": m["buffers"],
                        "by_client": by_client, "in_flight": m["bytes_in_use"] - sum(by_client.values())})
    return {"updated": record.updated, "clients": dict(record.names), "devices": devices}


def links(record: ActivityRecord) -> dict[str, Any]:
    """Bytes per second per link class between consecutive pulls; bytes per device pair."""
    samples = list(record.links)
    rates: dict[str, list[float]] = {"time": [], **{c: [] for c in LINK_CLASSES}}
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        dt = t1 - t0
        if dt <= 0:
            continue
        rates["time"].append(t1)
        for c in LINK_CLASSES:
            rates[c].append(max(0.0, (b.get(c, 0) - a.get(c, 0)) / dt))
    totals = samples[-1][1] if samples else dict.fromkeys(LINK_CLASSES, 0)
    return {"updated": record.updated, "classes": list(LINK_CLASSES), "rates": rates, "totals": totals,
            "devices": record.devices(),
            "pairs": [{"src": s, "dst": d, "bytes": n} for (s, d), n in sorted(record.pairs.items())]}


def queue(plugin: Observed, record: ActivityRecord, window: float) -> dict[str, Any]:
    """Per client: programs waiting, slotted and done; its weight, its target share (its weight
    over the weights of the clients with work, queued or run in the last ``window`` seconds),
    and its measured share of the device time used in that window."""
    now = time.time()
    busy: dict[str, float] = {}
    for g in record.since(now - window):
        busy[g[5]] = busy.get(g[5], 0.0) + g[2] - max(g[1], now - window)
    total_busy = sum(busy.values())
    counts = plugin.order.by_client()
    rows = []
    for cid, info in plugin.clients.items():
        c = counts.get(cid, {"waiting": 0, "slotted": 0})
        rows.append({"client": cid, "name": info.get("name", cid), "weight": float(info.get("weight", 1.0)),
                     "waiting": c["waiting"], "slotted": c["slotted"], "done": plugin.order.done.get(cid, 0),
                     "busy_s": busy.get(cid, 0.0),
                     "measured_share": busy.get(cid, 0.0) / total_busy if total_busy else 0.0})
    active = [r for r in rows if r["waiting"] or r["slotted"] or r["busy_s"]]
    weights = sum(r["weight"] for r in active)
    for r in rows:
        r["target_share"] = r["weight"] / weights if r in active and weights else 0.0
    return {"policy": plugin.order.policy.name, "window_s": window, "clients": rows}


def resources(plugin: Observed) -> dict[str, Any]:
    """Islands > hosts > devices of the topology, which worker holds each host, and the slices
    (meshes) on each device with their owners."""
    topo, rm = plugin.topology, plugin.resources
    by_slot = {(h.island, h.host): h for h in rm.hosts.values()}
    names = {cid: info.get("name", cid) for cid, info in plugin.clients.items()}
    on_device: dict[int, list[str]] = {}
    for sl in rm.slices.values():
        for d in sl.devices:
            on_device.setdefault(d, []).append(sl.id)
    islands = []
    for i in range(topo.islands):
        hosts = []
        for h in range(topo.hosts_per_island):
            rec = by_slot.get((i, h))
            devices = []
            for dev in topo.devices_of_host(i, h):
                ids = on_device.get(dev.id, [])
                clients = sorted({rm.slices[s].client for s in ids})
                devices.append({"id": dev.id, "index": dev.index, "live": rec is not None, "slices": ids,
                                "clients": clients, "owners": [names.get(c, c) for c in clients]})
            hosts.append({"host": h, "address": rec.address if rec else None, "devices": devices})
        islands.append({"island": i, "hosts": hosts})
    slices = [{"id": s.id, "client": s.client, "name": names.get(s.client, s.client), "shape": s.shape,
               "devices": s.devices} for s in rm.slices.values()]
    return {"topology": topo.describe(), "islands": islands, "slices": slices}
