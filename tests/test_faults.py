"""Failures stay contained: a bad gang fails its own program, nothing hangs."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


def test_mismatched_collectives_fail_at_once_with_what_differed(system):
    with system.client(name="faulty") as client:
        mesh = client.mesh({"x": 4})

        @pw.function(in_specs=P("x"), out_specs=P("x"))
        def lopsided(b):
            if pw.axis_index("x") == 0:  # only one device calls the collective
                return pw.psum(b, "x")
            return b

        x = client.put(np.ones(4), mesh, P("x"))
        start = time.monotonic()
        with pytest.raises(pw.GangAbortedError, match=r"called different collectives: device \d returned "
                           r"from the body after 0 collective\(s\), while device 0 called collective #1"):
            lopsided(x).result(timeout=30)
        assert time.monotonic() - start < 10  # not the 120 s collective timeout
        # the devices are free again
        ok = pw.function(lambda b: pw.psum(b, "x"), in_specs=P("x"), out_specs=P())
        np.testing.assert_array_equal(ok(x).result(timeout=30), [4.0])
        del x
    assert_clean(system)


def test_a_peer_that_never_comes_times_out_instead_of_hanging():
    with dask.config.set({"pathdask.collective-timeout": "1s"}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name="slow") as client:
            # two hosts: a body that blocks for real holds the other devices of its host
            mesh = client.mesh({"x": 2}, placement="spread")
            @pw.function(in_specs=P("x"), out_specs=P())
            def late(b):
                if pw.axis_index("x") == 1:
                    time.sleep(3)  # a peer far slower than the collective timeout
                return pw.psum(b, "x")

            x = client.put(np.ones(2), mesh, P("x"))
            with pytest.raises(pw.GangAbortedError, match=r"waited 1s in collective #0.*never reached it"):
                late(x).result(timeout=30)
            del x
        assert_clean(system)


def test_unknown_dispatch_mode(client):
    mesh = client.mesh({"x": 2})
    with dask.config.set({"pathdask.dispatch": "telepathic"}), \
            pytest.raises(ValueError, match="'parallel' or 'sequential'"):
        client.put(np.ones(2), mesh, P("x"))


def test_slice_errors(client):
    with pytest.raises(pw.SliceTooLargeError, match=r"needs 8 devices but an island has only 4"):
        client.mesh({"x": 8})
    with pytest.raises(pw.SliceTooLargeError, match="Island 5 does not exist"):
        client.mesh({"x": 2}, island=5)
    with pytest.raises(pw.ShardingError, match="positive int"):
        client.mesh({"x": -1})


def test_meshes_spread_load(system, client):
    a, b = client.mesh({"x": 2}, island=0), client.mesh({"x": 2}, island=0)
    assert set(a.device_ids).isdisjoint(b.device_ids)
    slices = {d["id"]: d["slices"] for d in system.devices()}
    assert all(len(slices[d]) == 1 for d in (*a.device_ids, *b.device_ids))


@pw.function(in_specs=P("x"), out_specs=P("x"), cost=0.05)
def slow_step(b):
    return pw.pmean(b, "x") + 1.0


def chain(n):
    @pw.program
    def prog(x):
        for _ in range(n):
            x = slow_step(x)
        return x
    return prog


@pytest.mark.slow
def test_killed_worker_fails_only_the_programs_on_its_devices():
    import os
    import signal


    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        client = system.client(name="survivor")
        m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"x": 4}, island=1)
        x0, x1 = client.put(np.zeros(4), m0, P("x")), client.put(np.zeros(4), m1, P("x"))
        doomed, fine = chain(60)(x0), chain(10)(x1)  # 3 s on island 0, 0.5 s on island 1
        victim = m0.devices[-1].address
        pid = client.dask.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)  # a worker we started, by its PID
        start = time.monotonic()
        with pytest.raises(pw.DeviceLostError, match="left the cluster|is gone"):
            doomed.result(timeout=10)
        assert time.monotonic() - start < 10
        np.testing.assert_array_equal(fine.result(timeout=30), np.full(4, 10.0))
        # the nanny restarts the worker; it takes the free host again and its devices come back
        client.dask.sync(client.dask.scheduler.pathdask_wait_hosts)
        assert len(system.devices()) == SMALL.num_devices
        del doomed, fine, x0, x1
        client.close()
        assert_clean(system)


CLIENT_SCRIPT = """
import sys, numpy as np, pathdask as pw
from pathdask import P
c = pw.connect(sys.argv[1], name="doomed")
mesh = c.mesh({"x": 4}, island=0)
step = pw.function(lambda b: pw.pmean(b, "x") + 1.0, in_specs=P("x"), out_specs=P("x"), cost=0.05)
xs = [c.put(np.ones((4, 256)), mesh, P("x")) for _ in range(8)]
xs[-1].result()
ys = [step(x) for x in xs for _ in range(10)]  # 4 s of queued gangs
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_killed_client_is_garbage_collected(tmp_path):
    import subprocess
    import sys


    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        script = tmp_path / "client.py"
        script.write_text(CLIENT_SCRIPT)
        proc = subprocess.Popen([sys.executable, str(script), system.scheduler_address],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            other = system.client(name="other")
            mesh = other.mesh({"x": 4}, island=0)  # the same devices as the doomed client
            y = chain(3)(other.put(np.zeros(4), mesh, P("x")))
            assert any(s["bytes_in_use"] for s in system.device_stats()["devices"].values())
            proc.kill()
            proc.wait(timeout=10)
            start = time.monotonic()
            np.testing.assert_array_equal(y.result(timeout=30), np.full(4, 3.0))
            del y
            other.close()
            stats = system.wait_idle(timeout="5s")  # buffers freed, pending gangs dropped
            assert time.monotonic() - start < 10
            assert all(s["bytes_in_use"] == 0 for s in stats["devices"].values())
            assert all(not d["slices"] for d in system.devices())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert_clean(system)


def test_placement_hints(system, client):
    packed = client.mesh({"x": 2}, island=0, placement="pack")
    assert len({d.address for d in packed.devices}) == 1  # one host: same-host links
    spread = client.mesh({"x": 2}, island=1, placement="spread")
    assert len({d.address for d in spread.devices}) == 2
    exact = client.mesh({"x": 2}, devices=[3, 2])
    assert exact.device_ids == (3, 2)
    avoid = client.mesh({"x": 2}, island=0, exclude=[0, 1])
    assert set(avoid.device_ids) == {2, 3}
    with pytest.raises(pw.SliceTooLargeError, match="span islands"):
        client.mesh({"x": 2}, devices=[0, 4])
    with pytest.raises(pw.SliceTooLargeError, match="not live"):
        client.mesh({"x": 2}, devices=[0, 99])
    with pytest.raises(ValueError, match="'pack' or 'spread'"):
        client.mesh({"x": 2}, placement="random")
