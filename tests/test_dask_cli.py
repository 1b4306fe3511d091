"""The scale-out recipe of ``cluster/README.md``, run for real.

A ``dask scheduler`` and two ``dask worker`` subprocesses are started with the
plain dask CLI and pathdask's preload module on 127.0.0.1; a pathdask client
then connects to them by address, as it would to a cluster on many machines.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from distributed import Client as DaskClient

import pathdask as pw
from pathdask import P
from pathdask.deploy import dask_command, stop_processes

REPO = Path(__file__).resolve().parents[1]

TOPOLOGY = """\
topology:
  islands: 1
  hosts_per_island: 2
  devices_per_host: 2
  hbm: 64 MiB
"""


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class Processes:
    """The subprocesses this test started, each with its log file; stopped by handle only."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = dict(os.environ)
        # pathdask's own log lines (which island/host each worker got) at INFO, as the README says.
        self.env["DASK_LOGGING__PATHDASK"] = "info"
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), self.env.get("PYTHONPATH")]))
        self.env.pop("DASK_SCHEDULER_ADDRESS", None)
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=REPO, env={**self.env, **(env or {})})
        self.procs.append((name, proc, log))
        return proc

    def check_alive(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                pytest.fail(f"`{name}` exited with {proc.returncode}; its log ends:\n{tail(log)}")

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{tail(log)}" for name, _, log in self.procs)

    def stop(self) -> None:
        stop_processes([(name, p) for name, p, _ in self.procs])


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.stop()


def wait_for_scheduler_file(path: Path, procs: Processes, timeout: float = 60.0) -> str:
    """The scheduler's address, once it has written its scheduler file (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            return str(json.loads(path.read_text())["address"])
        except (OSError, ValueError, KeyError):  # not there yet, or not yet flushed
            time.sleep(0.05)
    pytest.fail(f"no scheduler file after {timeout}s\n{procs.logs()}")


def wait_hosts(admin: DaskClient, n: int, procs: Processes, timeout: float = 60.0) -> int:
    """Wait on the scheduler plugin until ``n`` hosts have registered, checking that the subprocesses live."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(admin.sync(admin.scheduler.pathdask_wait_hosts, n=n, timeout="2s"))
        except TimeoutError:
            procs.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"{n} pathdask hosts did not register in {timeout}s\n{procs.logs()}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dask_cli_scale_out(tmp_path: Path, procs: Processes) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    sched_file = tmp_path / "scheduler.json"

    procs.start("scheduler", dask_command("scheduler") + [
        "--host", "127.0.0.1", "--port", "0",
        "--no-dashboard", "--dashboard-address", "127.0.0.1:0",  # its HTTP server binds anyway
        "--scheduler-file", str(sched_file),
        "--preload", "pathdask.preload", "--pathdask-topology", str(topo),
    ])

    def worker(host: int, *, scheduler_file: bool) -> None:
        argv = dask_command("worker")
        if scheduler_file:
            # With --scheduler-file there is no positional address, and click would take
            # `--pathdask-host N` as that address; so this form names the host in the Dask config.
            argv += ["--scheduler-file", str(sched_file)]
            env = {"DASK_PATHDASK__WORKER__HOST": str(host)}
            preload = ["--preload", "pathdask.preload"]
        else:
            argv += [address]
            env = {}
            preload = ["--preload", "pathdask.preload", "--pathdask-host", str(host)]
        procs.start(f"worker-host{host}", argv + [
            "--host", "127.0.0.1", "--nthreads", "2", "--nworkers", "1", "--no-dashboard",
            "--name", f"host{host}", "--local-directory", str(tmp_path / f"host{host}"),
            "--death-timeout", "60",
        ] + preload, env=env)

    # Host 1 joins first and alone, so getting host 1 proves the request was honoured
    # (without one the scheduler hands out the first free host, host 0). It finds the
    # scheduler through the scheduler file, so it starts right away.
    worker(1, scheduler_file=True)
    address = wait_for_scheduler_file(sched_file, procs)
    assert address.startswith("tcp://127.0.0.1:")
    admin = DaskClient(address, set_as_default=False, timeout=60)
    client: pw.Client | None = None
    try:
        assert wait_hosts(admin, 1, procs) >= 1
        worker(0, scheduler_file=False)  # the README's form: address and --pathdask-host
        admin.wait_for_workers(2, timeout=60)
        assert wait_hosts(admin, 2, procs) == 2
        procs.check_alive()
        by_name = {w["name"]: a for a, w in admin.scheduler_info(n_workers=-1)["workers"].items()}
        assert set(by_name) == {"host0", "host1"}

        client = pw.connect(address, name="cli-test", weight=2)
        assert client.topology.num_hosts == 2

        # Which island, host and devices each worker holds.
        devices = sorted(client.devices(), key=lambda d: d["id"])
        assert [d["id"] for d in devices] == [0, 1, 2, 3]
        for d in devices:
            assert (d["island"], d["host"], d["index"]) == (0, d["id"] // 2, d["id"] % 2)
            assert d["address"] == by_name[f"host{d['host']}"]
            assert d["state"] == "live"
        assert len({d["address"] for d in devices}) == 2
        assert all(d["address"].startswith("tcp://127.0.0.1:") for d in devices)

        # The same, in the scheduler's log (pathdask at INFO via DASK_LOGGING__PATHDASK).
        sched_log = (tmp_path / "scheduler.log").read_text(errors="replace")
        for h in (0, 1):
            assert f"pathdask: {by_name[f'host{h}']} is island 0 host {h}" in sched_log, procs.logs()

        # A program with a collective across both worker processes, against NumPy.
        mesh = client.mesh({"x": 4})
        assert len(set(mesh.hosts)) == 2
        data = np.arange(24, dtype=np.float64).reshape(8, 3)
        x = client.put(data, mesh, P("x", None))

        @pw.function(in_specs=(P("x", None),), out_specs=P("x", None))
        def scale(a):
            return 2.0 * a + 1.0

        @pw.function(in_specs=(P("x", None),), out_specs=P(None, None))
        def total(a):
            return pw.psum(a, "x")

        @pw.program
        def step(a):
            return total(scale(a))

        y = step(x)
        expected = (2.0 * data + 1.0).reshape(4, 2, 3).sum(axis=0)
        np.testing.assert_allclose(y.result(timeout=60), expected)
        np.testing.assert_allclose(x.result(timeout=60), data)

        stats = client.device_stats()
        assert stats["links"]["ici"]["bytes"] > 0  # the psum really crossed hosts

        del x, y
        gc.collect()
        idle = client.wait_idle(timeout="10s")
        assert sorted(idle["devices"]) == [0, 1, 2, 3]
        for dev, s in idle["devices"].items():
            assert s["bytes_in_use"] == 0, (dev, s)
            assert s["buffers"] == 0, (dev, s)
            assert s["pending_programs"] == 0, (dev, s)
        assert idle["programs"] == 0
        procs.check_alive()
    finally:
        if client is not None:
            client.close()
        admin.close()
