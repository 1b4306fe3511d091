"""A silent host (its process hung: SIGSTOP, no FIN) is declared lost within ``pathdask.host-timeout``.

The programs that use it fail with ``DeviceLostError``; programs on the other
island run on undelayed; ``diagnose()`` names the silent host while it waits;
its nanny then restarts the worker, which rejoins as the same host. The same
over a real network partition is in ``test_netns.py``.
"""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.deploy import CliSystem

from .conftest import SMALL
from .silence import until, wait_out

TIMEOUT = 6.0


@pw.function(in_specs=P("x"), out_specs=P("x"), cost=0.01)
def step(b):
    return pw.pmean(b, "x") + 1.0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_hung_host_is_lost_within_the_timeout_and_rejoins(monkeypatch):
    monkeypatch.setenv("DASK_PATHDASK__HOST_TIMEOUT", f"{TIMEOUT}s")
    with CliSystem(SMALL) as system:
        client = system.client(name="liveness")
        m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"x": 4}, island=1)
        x0, x1 = client.put(np.zeros(4), m0, P("x")), client.put(np.zeros(4), m1, P("x"))
        np.testing.assert_array_equal(step(x0).result(timeout=30), np.ones(4))
        victim = m0.devices[-1].address
        pid = client.dask.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGSTOP)  # a worker this test started: hung, its sockets open
        try:
            out = wait_out(system, step, x0, x1, victim, TIMEOUT)
            assert isinstance(out.error, pw.DeviceLostError), out.error
            assert re.search(r"silent for \d+\.\ds, past pathdask.host-timeout", str(out.error)), out.error
            assert out.took < TIMEOUT + 3, out.took
            assert out.slowest < 1.0, out.slowest
            assert out.silent is not None and victim in out.silent and out.silent[victim]["island"] == 0, out.silent
            # the nanny restarts the hung worker; the new one takes the free host again
            until(lambda: len(system.devices()) == SMALL.num_devices, 90, "the host's rejoin")
            again = client.mesh({"x": 4}, island=0)
            assert len(set(again.hosts)) == 2
            x = client.put(np.zeros(4), again, P("x"))
            np.testing.assert_array_equal(step(x).result(timeout=30), np.ones(4))
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


class Stutter:
    """Pause a process for ``pause`` seconds out of every ``period`` (SIGSTOP, then SIGCONT),
    from a thread, until stopped: every message to or from it waits up to ``pause``, as on
    a slow link, but it never falls silent for long."""

    def __init__(self, pid: int, pause: float, period: float) -> None:
        import threading

        self.pid, self.pause, self.period = pid, pause, period
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.done.wait(self.pause)
            os.kill(self.pid, signal.SIGCONT)
            self.done.wait(self.period - self.pause)

    def __enter__(self) -> Stutter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        os.kill(self.pid, signal.SIGCONT)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_host_is_not_lost_and_the_order_holds(monkeypatch):
    """A host that answers late (paused 50 ms out of every 100 ms: its messages wait up to
    50 ms each way) for twice the timeout is never declared lost, and programs in flight on
    it and its peer, five at a time, keep one order (each result counts every program)."""
    monkeypatch.setenv("DASK_PATHDASK__HOST_TIMEOUT", f"{TIMEOUT}s")
    one_island = pw.Topology(islands=1, hosts_per_island=2, devices_per_host=1)
    with CliSystem(one_island) as system:
        client = system.client(name="slow")
        mesh = client.mesh({"x": 2})
        slow = mesh.devices[0].address
        pid = client.dask.run(os.getpid, workers=[slow])[slow]
        y, n = client.put(np.zeros(2), mesh, P("x")), 0
        with Stutter(pid, pause=0.05, period=0.1):
            start = time.monotonic()
            while time.monotonic() - start < 2 * TIMEOUT:  # past the timeout: never declared lost
                ys = [y := step(y) for _ in range(5)]  # five programs in flight, in one order
                n += len(ys)
                np.testing.assert_array_equal(y.result(timeout=60), np.full(2, float(n)))
            assert not system.diagnose().silent
        assert len(client.devices()) == one_island.num_devices
        assert n >= 10
