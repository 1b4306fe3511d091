"""The dashboard's record, JSON API, pages and traces, on a real LocalCluster with its dashboard on."""

from __future__ import annotations

import gc
import json
import time
import urllib.request
from collections import deque
from collections.abc import Iterator

import dask
import numpy as np
import pytest
import xarray as xr

import pathdask as pw
from pathdask import P
from pathdask.bench.dashboard import Tenant, Workload, step
from pathdask.core.bounded import newest
from pathdask.dashboard.record import ActivityRecord
from pathdask.dashboard.views import VIEWS

from .conftest import SMALL, assert_clean

TENANTS = (Tenant("alice", 2, 0), Tenant("bob", 1, 1))


def get(root: str, path: str) -> tuple[int, bytes, str]:
    with urllib.request.urlopen(f"{root}/{path}", timeout=30) as r:
        return r.status, r.read(), r.headers.get("Content-Type", "")


def api(root: str, view: str, query: str = "") -> dict:
    status, body, kind = get(root, f"pathdask/api/{view}{query}")
    assert status == 200 and kind.startswith("application/json"), (status, kind)
    return json.loads(body)


@pytest.fixture(scope="module")
def dashboard() -> Iterator[tuple[pw.LocalSystem, str]]:
    with pw.LocalSystem(SMALL, processes=False) as system:
        assert system.dashboard_link is not None
        yield system, system.dashboard_link.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def busy(dashboard: tuple[pw.LocalSystem, str]) -> Iterator[tuple[pw.LocalSystem, str, Workload]]:
    """Two tenants calling a program on their own island, while the test reads."""
    system, root = dashboard
    work = Workload(system, TENANTS).start()
    assert work.ready.wait(60)
    system.trace()  # waits for what runs now to end, and pulls it in
    try:
        yield system, root, work
    finally:
        work.stop()


def test_timeline_api_has_rows_for_every_device_that_ran(busy):
    system, root, _ = busy
    view = api(root, "timeline")
    gangs = view["gangs"]
    assert view["count"] == len(gangs["device"]) > 0
    names = {view["clients"][c] for c in gangs["client"]}
    assert {"alice", "bob"} <= names
    for d in range(8):  # alice's mesh is island 0 (devices 0-3), bob's island 1 (4-7)
        assert gangs["device"].count(d) > 0, d
    assert all(e >= s for s, e in zip(gangs["start"], gangs["end"]))
    assert abs(max(gangs["end"]) - time.time()) < 60  # wall-clock seconds, not a perf_counter
    assert {"scale", "total"} <= set(gangs["gang"])
    later = api(root, "timeline", f"?since={max(gangs['end'])}&limit=3")
    assert later["count"] <= 3
    assert all(e >= max(gangs["end"]) for e in later["gangs"]["end"])


def test_memory_per_client_adds_up_to_the_store(busy):
    system, root, _ = busy
    view = api(root, "memory")
    assert [d["device"] for d in view["devices"]] == list(range(8))
    ids = {name: cid for cid, name in view["clients"].items()}
    stats = system.device_stats()["devices"]
    for dev in view["devices"]:
        assert sum(dev["by_client"].values()) + dev["in_flight"] == dev["bytes_in_use"]
        assert dev["in_flight"] >= 0
        assert dev["capacity"] == stats[dev["device"]]["capacity"]
        assert dev["peak"] >= dev["bytes_in_use"]
        owner, other = ("alice", "bob") if dev["device"] < 4 else ("bob", "alice")
        assert dev["by_client"].get(ids[owner], 0) >= 2 * 4 * 8  # its put's block: 2 x 4 float64
        assert ids[other] not in dev["by_client"]  # the other tenant has nothing on this island


def test_queue_lists_clients_with_weights_and_shares(busy):
    _, root, _ = busy
    view = api(root, "queue")
    assert view["policy"] == "fifo"
    rows = {r["name"]: r for r in view["clients"]}
    assert rows["alice"]["weight"] == 2.0 and rows["bob"]["weight"] == 1.0
    assert rows["alice"]["done"] > 0 and rows["bob"]["done"] > 0
    assert rows["alice"]["target_share"] == pytest.approx(2 / 3)
    assert rows["bob"]["target_share"] == pytest.approx(1 / 3)
    assert sum(r["measured_share"] for r in rows.values()) == pytest.approx(1.0)
    assert all(r["measured_share"] > 0 for r in rows.values())


def test_resources_lists_every_device_and_slice(busy):
    system, root, _ = busy
    view = api(root, "resources")
    devices = [d for i in view["islands"] for h in i["hosts"] for d in h["devices"]]
    assert sorted(d["id"] for d in devices) == list(range(8))
    assert all(d["live"] for d in devices)
    addresses = {h["address"] for i in view["islands"] for h in i["hosts"]}
    assert addresses == {d["address"] for d in system.devices()}
    owners = {d["id"]: d["owners"] for d in devices}
    assert all(owners[d] == ["alice"] for d in range(4)) and all(owners[d] == ["bob"] for d in range(4, 8))
    assert sorted(s["name"] for s in view["slices"]) == ["alice", "bob"]


def test_links_count_bytes_per_class_and_pair(busy):
    _, root, work = busy
    api(root, "links")
    work.wait(0.6)  # one more pull: rates need two samples
    view = api(root, "links")
    assert view["totals"]["ici"] > 0  # each psum crosses the two hosts of its island
    assert view["totals"]["dcn"] == 0  # no mesh spans islands
    assert view["rates"]["time"] and max(view["rates"]["ici"]) > 0
    for p in view["pairs"]:
        assert p["src"] // 4 == p["dst"] // 4 and p["src"] != p["dst"] and p["bytes"] > 0


def test_pages_are_served_and_in_the_more_menu(dashboard):
    _, root = dashboard
    for view in VIEWS:
        status, body, kind = get(root, f"pathdask/{view}")
        assert status == 200 and kind.startswith("text/html")
        assert b"Bokeh" in body and b'<base href="/">' in body, view
    _, status_page, _ = get(root, "status")
    for view in VIEWS:
        assert f'href="pathdask/{view}"'.encode() in status_page
    status, _, kind = get(root, "pathdask/statics/css/base.css")  # Dask's styles, from a page one level down
    assert status == 200 and "css" in kind
    with pytest.raises(urllib.error.HTTPError, match="404"):
        get(root, "pathdask/api/nothing")
    with pytest.raises(urllib.error.HTTPError, match="since must be a number"):
        get(root, "pathdask/api/timeline?since=yesterday")


def test_trace_matches_what_ran(dashboard):
    system, _ = dashboard
    client = system.client(name="tracer", weight=1)
    try:
        mesh = client.mesh({"x": 4}, island=0)
        x = client.put(np.ones((8, 4)), mesh, P("x", None))
        ys = [step(x) for _ in range(3)]
        for y in ys:
            np.testing.assert_allclose(y.result(), np.full((2, 4), 8.0))
        trace = system.trace()
        assert isinstance(trace, xr.Dataset)
        assert set(trace.dims) == {"device", "event"}
        assert list(trace.device.values) == list(range(8))
        mine = trace.where(trace.client == "tracer")
        runs = (mine.name == "step").sum("event")
        for d in mesh.device_ids:
            assert int(runs.sel(device=d)) == 6, d  # 3 calls x 2 gangs on each of its 4 devices
        steps = trace.where((trace.client == "tracer") & (trace.name == "step"), drop=True)
        assert set(np.unique(steps.gang.values[steps.gang.values != ""])) == {"scale", "total"}
        assert bool(((steps.end >= steps.start) | steps.start.isnull()).all())
        scale = steps.where(steps.gang == "scale")
        total = steps.where(steps.gang == "total")
        assert float(scale.bytes_in.sum()) == float(scale.bytes_out.sum()) == 0  # no exchange
        assert float(total.bytes_in.sum()) > 0
        assert float(total.bytes_in.sum()) == float(total.bytes_out.sum())  # what leaves arrives
        # padding: devices with fewer gangs than the longest row end in NaT / NaN / ""
        counts = trace.start.notnull().sum("event")
        short = int(np.argmin(counts.values))
        if int(counts[short]) < trace.sizes["event"]:
            last = trace.isel(device=short, event=-1)
            assert last.start.isnull() and np.isnan(float(last.bytes_in)) and last.gang == ""
        # starts are in order on each device
        starts = trace.start.values.astype("int64")
        for row, n in enumerate(counts.values):
            assert (np.diff(starts[row, :n]) >= 0).all()
        fig = trace.pathdask.plot()
        (renderer,) = [r for r in fig.renderers if hasattr(r, "data_source")]
        assert len(renderer.data_source.data["left"]) == int(counts.sum())
        assert set(client.trace().client.values.ravel()) >= {"tracer"}
    finally:
        del x, ys
        client.close()
        gc.collect()


def test_record_keeps_only_the_newest():
    log: deque[int] = deque(maxlen=5)
    for i in range(12):
        log.append(i)
    assert newest(log, 12, 9) == [9, 10, 11]
    assert newest(log, 12, 0) == [7, 8, 9, 10, 11]  # older ones are gone
    assert newest(log, 12, 12) == []
    assert newest(log, 12, 40) == [7, 8, 9, 10, 11]  # a cursor from before a restart reads all

    rec = ActivityRecord(max_gangs=10, max_samples=3)
    for n in range(4):
        reply = {"devices": {0: {"count": 6 * (n + 1), "gangs": [(n + i, n + i + 0.5, "p", "g", "c", 0, 0, "step")
                                                                 for i in range(6)]}},
                 "memory": {0: {"bytes_in_use": 0, "capacity": 1, "peak": 0, "buffers": 0, "by_client": {}}},
                 "links": {"ici": {"bytes": n, "transfers": n}}, "pairs": []}
        rec.add({"tcp://h": reply}, now=float(n))
    assert rec.total == 24 and len(rec.gangs) == 10 and len(rec.links) == 3
    assert rec.cursor_message() == {"tcp://h": [(0, 24)]}
    gangs, cursor = rec.after(20)
    assert len(gangs) == 4 and cursor == 24 and gangs[-1][1] == 3 + 5


def test_record_is_bounded_on_a_running_system():
    with dask.config.set({"pathdask.dashboard.gangs": 40}), \
            pw.LocalSystem(pw.Topology(islands=1, hosts_per_island=1, devices_per_host=2), processes=False,
                           dashboard_address=None) as system:
        client = system.client(name="many")
        mesh = client.mesh({"x": 2})
        x = client.put(np.ones((4, 4)), mesh, P("x", None))
        for _ in range(30):  # 30 calls x 2 gangs x 2 devices = 120 gangs, more than the cap
            step(x).result()
        trace = system.trace()
        assert int(trace.start.count()) == 40
        assert int((trace.name == "step").sum()) == 40  # the newest are kept: the puts dropped out
        # the devices' own records are plain tuples, which full collections need not scan
        gc.collect()
        assert system.cluster is not None
        streams = [s for w in system.cluster.workers.values() for s in w.plugins["pathdask"].streams.values()]
        assert sum(len(s.timeline) for s in streams) > 0
        assert not any(gc.is_tracked(r) for s in streams for r in s.timeline)
        del x
        client.close()
        assert_clean(system)
