"""``CliSystem``: a pathdask system started with the plain ``dask`` CLI, every part its own process.

It runs the scale-out recipe of ``cluster/README.md`` on this machine, on
127.0.0.1: ``dask scheduler --preload pathdask.preload`` and one ``dask worker
--preload pathdask.preload --pathdask-host N`` per host. Unlike
:class:`~pathdask.LocalSystem`, whose scheduler lives in the calling process,
here the client, the scheduler and each host are separate processes, so each
one's memory and CPU can be measured on its own (``pathdask bench datapath``
does), and what works here works on a cluster of machines.

Examples
--------
>>> with CliSystem(Topology(islands=1, hosts_per_island=2)) as system:  # doctest: +SKIP
...     client = system.client(name="alice")
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Self

import yaml

from .protocol import WaitHosts
from .systems import System
from .topology import Topology

__all__ = ["CliSystem", "ProcessGroup", "dask_command", "stop_processes"]


def dask_command(sub: str) -> list[str]:
    """``dask <sub>``: the ``dask`` script next to this Python, else on PATH, else ``-m``."""
    script = Path(sys.executable).parent / "dask"
    if script.exists():
        return [str(script), sub]
    found = shutil.which("dask")
    return [found, sub] if found else [sys.executable, "-m", f"distributed.cli.dask_{sub}"]


def stop_processes(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    """Stop a dask-CLI cluster's processes by handle: the workers first (SIGTERM lets each
    nanny close its worker), then the scheduler; stopping both at once can leave a worker
    hung for the nanny's kill timeout. A process that does not stop in 20 s is killed."""
    for group in ([p for n, p in procs if n != "scheduler"], [p for n, p in procs if n == "scheduler"]):
        for proc in group:
            if proc.poll() is None:
                proc.terminate()
        for proc in group:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)



class ProcessGroup:
    """Processes started by handle, each logging to ``<workdir>/<name>.log``, stopped in order.

    Parameters
    ----------
    workdir : Path
        Where the logs go.
    timeout : float
        Seconds :meth:`wait` waits for something to come up.
    env : dict, optional
        Extra environment for every process.
    """

    def __init__(self, workdir: Path, timeout: float, env: dict[str, str] | None = None) -> None:
        self.workdir, self.timeout, self.env = workdir, timeout, dict(env or {})
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def spawn(self, name: str, argv: list[str]) -> None:
        """Start ``argv`` as ``name``, in its own session (a Ctrl-C reaches only this process,
        which then stops them in order); a name started again appends to its log."""
        self.procs = [p for p in self.procs if p[0] != name or p[1].poll() is None]
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "DASK_LOGGING__PATHDASK": "info", **self.env}
        env.pop("DASK_SCHEDULER_ADDRESS", None)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        self.procs.append((name, proc, log))

    def wait(self, probe: Any, what: str) -> Any:
        """Call ``probe`` until it answers, checking that every process lives; bounded."""
        deadline = time.monotonic() + self.timeout
        while True:
            for name, proc, _ in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"`{name}` exited with {proc.returncode} while waiting for "
                                       f"{what}; its log ends:\n{self.log(name)}")
            try:
                return probe()
            except (OSError, ValueError, KeyError, TimeoutError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} did not come up in {self.timeout:g}s; logs:\n"
                                       f"{self.logs()}") from None
                time.sleep(0.05)

    def pid(self, name: str) -> int:
        """The process id of ``name``'s running process."""
        return next(p.pid for n, p, _ in self.procs if n == name and p.poll() is None)

    def signal(self, name: str, signum: int) -> None:
        next(p for n, p, _ in self.procs if n == name).send_signal(signum)

    def log(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` of ``name``'s log."""
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def logs(self, lines: int = 20) -> str:
        """The end of every process's log."""
        return "\n".join(f"--- {name} ---\n{self.log(name, lines)}"
                         for name in dict.fromkeys(n for n, _, _ in self.procs))

    def stop(self) -> None:
        """Stop every process (:func:`stop_processes`) and close the logs."""
        try:
            stop_processes([(n, p) for n, p, _ in self.procs])
        finally:
            for _, _, log in self.procs:
                log.close()
            self.procs.clear()

class CliSystem(System):
    """A scheduler and one worker per host, started as subprocesses with the dask CLI.

    Parameters
    ----------
    topology : Topology
        Written to a YAML file that the scheduler's preload loads.
    dashboard : bool
        Serve the Dask dashboard (on a free loopback port).
    timeout : float
        Seconds to wait for the scheduler and every host to come up.

    Processes are stopped by handle on :meth:`close` (workers first, then the
    scheduler); their logs are in :attr:`workdir`.
    """

    def __init__(self, topology: Topology, *, dashboard: bool = False, timeout: float = 60.0) -> None:
        super().__init__(topology)
        self.dashboard = dashboard
        self.timeout = timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="pathdask-cli-"))
        self.processes = ProcessGroup(self.workdir, timeout)
        self.address = ""

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        topo = self.workdir / "topology.yaml"
        topo.write_text(yaml.safe_dump({"topology": self.topology.to_dict()}))
        sched_file = self.workdir / "scheduler.json"
        dashboard = ["--dashboard-address", "127.0.0.1:0"] + ([] if self.dashboard else ["--no-dashboard"])
        self.processes.spawn("scheduler", dask_command("scheduler") + [
            "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(sched_file), *dashboard,
            "--preload", "pathdask.preload", "--pathdask-topology", str(topo),
        ])
        self.address = self.processes.wait(lambda: json.loads(sched_file.read_text())["address"], "the scheduler")
        for host in range(self.topology.num_hosts):
            self.processes.spawn(f"host{host}", dask_command("worker") + [
                self.address, "--host", "127.0.0.1", "--nthreads", str(self.topology.devices_per_host),
                "--nworkers", "1", "--no-dashboard", "--name", f"host{host}",
                "--local-directory", str(self.workdir / f"host{host}"), "--death-timeout", "60",
                "--preload", "pathdask.preload", "--pathdask-host", str(host),
            ])
        self._connect_admin(self.address)
        n = self.topology.num_hosts
        self.processes.wait(lambda: self._admin_call(WaitHosts(n, "1s")), f"{n} pathdask hosts")

    def signal_host(self, host: int, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to host ``host``'s ``dask worker`` process: SIGTERM is a planned
        departure (the worker closes gracefully), SIGKILL a crash."""
        self.processes.signal(f"host{host}", signum)

    @property
    def client_address(self) -> str:
        return self.address

    def _stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` of a process's log (``scheduler``, ``host0``, ...)."""
        return self.processes.log(name, lines)
