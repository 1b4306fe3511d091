"""Elastic training: a killed host fails what it held, the loop re-meshes and resumes, and a new
worker in the lost host's place brings its devices back to the pool. Real worker processes."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.demo_elastic import run_elastic_demo

from .conftest import SMALL, assert_clean


@pytest.mark.slow
def test_the_elastic_demo_recovers_from_a_killed_host_with_the_same_final_loss():
    lines: list[str] = []
    report = run_elastic_demo(SMALL, steps=9, progress=False, echo=lines.append)
    assert report["ok"], lines
    (rec,) = report["recoveries"]
    assert rec["lost_devices"] and not set(rec["lost_devices"]) & set(rec["devices"])
    assert rec["resumed_from_step"] == 0 and rec["seconds"] > 0  # killed before step 4, checkpoint at 0
    np.testing.assert_allclose(report["losses"], report["reference"], rtol=1e-9)
    assert any("host lost at step 4" in line for line in lines), lines


@pytest.mark.slow
def test_a_new_worker_in_a_lost_hosts_place_adds_its_devices_back():
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        admin = system._admin
        assert admin is not None
        with system.client(name="elastic") as client:
            victim = next(d for d in client.devices() if d["island"] == 1)
            ids = [d["id"] for d in client.devices() if d["address"] == victim["address"]]
            pid = client.dask.run(os.getpid, workers=[victim["address"]])[victim["address"]]
            os.kill(pid, signal.SIGKILL)  # the nanny starts a new worker process in its place
            admin.sync(admin.scheduler.pathdask_wait_host_gone, address=victim["address"], callback_timeout=30)
            admin.sync(admin.scheduler.pathdask_wait_hosts, timeout="60s")
            assert client.lost_devices() == []
            back = {d["id"]: d["address"] for d in client.devices() if d["id"] in ids}
            assert sorted(back) == ids and victim["address"] not in back.values()  # a new process
            mesh = client.mesh({"x": 2}, devices=ids)
            y = pw.function(lambda b: pw.psum(b, "x"), in_specs=P("x"), out_specs=P())(
                client.put(np.arange(4.0), mesh, P("x")))
            np.testing.assert_array_equal(y.result(timeout=60), [2.0, 4.0])
            del y
        assert_clean(system)


@pytest.mark.slow
def test_recover_moves_arrays_with_surviving_copies_and_names_the_lost_ones():
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        with system.client(name="elastic") as client:
            mesh = client.mesh({"x": 4}, island=0)
            data = np.arange(16.0).reshape(4, 4)
            replicated = client.put(data, mesh, P())
            sharded = client.put(data, mesh, P("x"))
            half = client.put(data, client.mesh({"x": 2, "y": 2}, devices=list(mesh.device_ids)), P(None, "y"))
            for a in (replicated, sharded, half):
                a.result()
            victim = mesh.hosts[-1]
            pid = client.dask.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
            admin = system._admin
            assert admin is not None
            admin.sync(admin.scheduler.pathdask_wait_host_gone, address=victim, callback_timeout=30)
            new = client.mesh({"x": 2}, island=1)
            with pytest.raises(pw.ArrayLostError, match=r"'sharded' \(blocks \[\(2, 0\), \(3, 0\)\]"):
                client.recover({"replicated": replicated, "sharded": sharded}, new)
            back = client.recover({"replicated": replicated}, new)
            back.update(client.recover({"half": half}, client.mesh({"x": 2, "y": 2}, island=1)))
            assert back["replicated"].mesh is new and back["half"].spec == P(None, "y")
            np.testing.assert_array_equal(back["replicated"].result(), data)
            np.testing.assert_array_equal(back["half"].result(), data)
            del replicated, sharded, half, back
