"""The dashboard's pages and API on a scheduler started by the dask CLI with pathdask's preload."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from distributed import Client as DaskClient

from pathdask.dashboard.views import VIEWS

from .test_dask_cli import (  # noqa: F401  (procs: the fixture)
    TOPOLOGY,
    Processes,
    dask_command,
    procs,
    wait_for_scheduler_file,
    wait_hosts,
)


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_preload_serves_the_dashboard(tmp_path: Path, procs: Processes) -> None:  # noqa: F811
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    sched_file = tmp_path / "scheduler.json"
    procs.start("scheduler", dask_command("scheduler") + [
        "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
        "--scheduler-file", str(sched_file), "--preload", "pathdask.preload", "--pathdask-topology", str(topo),
    ])
    address = wait_for_scheduler_file(sched_file, procs)
    port = json.loads(sched_file.read_text())["services"]["dashboard"]
    root = f"http://127.0.0.1:{port}"
    procs.start("worker-host0", dask_command("worker") + [
        "--scheduler-file", str(sched_file), "--host", "127.0.0.1", "--nthreads", "2", "--no-dashboard",
        "--name", "host0", "--local-directory", str(tmp_path / "host0"), "--preload", "pathdask.preload",
    ], env={"DASK_PATHDASK__WORKER__HOST": "0"})

    with DaskClient(address, set_as_default=False, timeout=60) as admin:
        wait_hosts(admin, 1, procs)  # the worker's host runtime registered with the plugin
    hosts = json.loads(get(f"{root}/pathdask/api/resources")[1])["islands"][0]["hosts"]
    assert hosts[0]["address"] is not None, procs.logs()
    assert [d["live"] for d in hosts[0]["devices"]] == [True, True]
    assert hosts[1]["address"] is None  # host 1 of the topology has no worker
    for view in VIEWS:
        status, body = get(f"{root}/pathdask/{view}")
        assert status == 200 and b"Bokeh" in body, view
        status, body = get(f"{root}/pathdask/api/{view}")
        assert status == 200 and isinstance(json.loads(body), dict), view
    assert b'href="pathdask/timeline"' in get(f"{root}/status")[1]
    memory = json.loads(get(f"{root}/pathdask/api/memory")[1])
    assert [d["device"] for d in memory["devices"]] == [0, 1]
