"""Suspend and resume: arrays go to zarr shard by shard, come back by name, and read with plain xarray."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pathdask as pw
from pathdask import P
from pathdask.errors import CheckpointError

from .conftest import SMALL, assert_clean


def test_suspend_then_resume_gives_the_same_arrays(system, client, tmp_path):
    mesh = client.mesh({"data": 2, "model": 2})
    rng = np.random.default_rng(0)
    w0, x0 = rng.normal(size=(8, 6)), rng.normal(size=(4, 8))
    w = client.put(w0, mesh, P("data", "model"))
    x = client.put(xr.DataArray(x0, dims=("batch", "feature"), name="x"), mesh, {"feature": "data"})
    step = pw.function(lambda a: a * 2.0 + 1.0, in_specs=P("data", "model"), out_specs=P("data", "model"))
    w = step(w)  # still running when suspend is called: suspend waits for it
    names = client.suspend(tmp_path / "state.zarr", {"w": w, "x": x})
    assert names == ["w", "x"] and w.status == "deleted"
    system.wait_idle()  # the devices are free again

    state = client.resume(tmp_path / "state.zarr", island=1)  # onto another island
    assert set(state) == {"w", "x"}
    assert state["w"].mesh.shape == {"data": 2, "model": 2} and state["w"].mesh.islands == (1,)
    assert state["w"].spec == P("data", "model") and state["w"].mesh is state["x"].mesh
    np.testing.assert_array_equal(state["w"].result(), w0 * 2.0 + 1.0)
    np.testing.assert_array_equal(step(state["w"]).result(), (w0 * 2.0 + 1.0) * 2.0 + 1.0)
    assert state["x"].to_xarray().dims == ("batch", "feature")

    ds = xr.open_zarr(tmp_path / "state.zarr")  # no pathdask needed to read it
    np.testing.assert_array_equal(ds["w"].values, w0 * 2.0 + 1.0)
    np.testing.assert_array_equal(ds["x"].values, x0)
    assert ds["x"].dims == ("batch", "feature")
    del state
    assert_clean(system)


def test_a_replicated_array_is_written_once(system, client, tmp_path):
    mesh = client.mesh({"d": 4})
    b = client.put(np.arange(5.0), mesh, P())
    client.suspend(tmp_path / "b.zarr", {"b": b}, release=False)
    assert b.status == "ready"
    np.testing.assert_array_equal(client.resume(tmp_path / "b.zarr")["b"].result(), np.arange(5.0))
    assert xr.open_zarr(tmp_path / "b.zarr")["b"].encoding["chunks"] == (5,)


def test_resume_of_a_path_without_a_checkpoint_is_a_typed_error(client, tmp_path):
    with pytest.raises(CheckpointError, match="No pathdask checkpoint"):
        client.resume(tmp_path / "nothing.zarr")


def test_suspend_of_a_failed_array_raises_its_error(client, tmp_path):
    mesh = client.mesh({"d": 2})

    @pw.function(in_specs=P("d"), out_specs=P("d"))
    def boom(b):
        if pw.axis_index("d") == 1 and b.sum() > -1:
            raise ZeroDivisionError("bad step on one device")
        return b

    bad = boom(client.put(np.ones(4), mesh, P("d")))
    with pytest.raises(ZeroDivisionError, match="bad step on one device"):
        client.suspend(tmp_path / "bad.zarr", {"y": bad})


@pytest.mark.slow
def test_a_training_run_suspended_and_resumed_matches_an_uninterrupted_one(tmp_path):
    """With worker processes: train 6 steps; or train 3, suspend, close the client, resume in a
    new client on the other island, train 3 more. The weights and losses are bit-identical."""
    from graphs import mlp

    from .conftest import SMALL

    prob = mlp.make_problem(seed=3)
    step = mlp.make_train_step(lr=0.5)

    def train(client, arrays, steps):
        losses = []
        for _ in range(steps):
            arrays["w1"], arrays["w2"], loss = step(arrays["x"], arrays["y"], arrays["w1"], arrays["w2"])
            losses.append(float(loss.result()))
        return losses

    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        with system.client(name="straight") as client:
            mesh = client.mesh(dict(mlp.MESH_SHAPE))
            specs = {"x": mlp.BATCH, "y": mlp.BATCH, "w1": mlp.W1, "w2": mlp.W2}
            arrays = {k: client.put(prob[k], mesh, s) for k, s in specs.items()}
            straight = train(client, arrays, 6)
            w1, w2 = arrays["w1"].result(), arrays["w2"].result()
            del arrays
        with system.client(name="first half") as client:
            mesh = client.mesh(dict(mlp.MESH_SHAPE), island=0)
            arrays = {k: client.put(prob[k], mesh, s) for k, s in specs.items()}
            first = train(client, arrays, 3)
            client.suspend(tmp_path / "run.zarr", arrays)
            del arrays
        with system.client(name="second half") as client:
            arrays = client.resume(tmp_path / "run.zarr", island=1)
            second = train(client, arrays, 3)
            assert first + second == straight
            np.testing.assert_array_equal(arrays["w1"].result(), w1)
            np.testing.assert_array_equal(arrays["w2"].result(), w2)
            del arrays
        assert_clean(system)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_host_leaving_on_sigterm_first_suspends_the_clients_that_opted_in(tmp_path):
    """A dask-CLI cluster of 3 hosts; SIGTERM to a host that holds shards: the opted-in client
    suspends before the host goes, and resumes onto the hosts that remain."""
    from pathdask.deploy import CliSystem

    topo = pw.Topology(islands=1, hosts_per_island=3, devices_per_host=2, hbm="64 MiB")
    with CliSystem(topo) as system:
        client = system.client(name="guarded")
        bystander = system.client(name="bystander")  # did not opt in: not asked
        mesh = client.mesh({"d": 4}, devices=[0, 1, 2, 3])
        w0 = np.arange(32.0).reshape(8, 4)
        state = {"w": client.put(w0, mesh, P("d"))}
        guard = client.suspend_on_interruption(tmp_path / "guard.zarr", lambda: state)
        bystander.suspend_on_interruption(tmp_path / "other.zarr", {})
        system.signal_host(1)  # devices 2 and 3
        assert guard.wait(60), system.log("host1")
        (record,) = guard.records
        assert record["arrays"] == ["w"] and record["error"] is None
        assert state["w"].status == "deleted"
        restored = client.resume(tmp_path / "guard.zarr")
        assert not {2, 3} & set(restored["w"].mesh.device_ids)
        np.testing.assert_array_equal(restored["w"].result(timeout=60), w0)
        assert not (tmp_path / "other.zarr").exists()


@pytest.mark.slow
def test_a_retired_host_first_suspends_the_clients_that_opted_in(tmp_path):
    """retire_workers closes a host gracefully: the opted-in client suspends before it goes."""
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        client = system.client(name="guarded")
        mesh = client.mesh({"d": 2}, island=1)
        state = {"b": client.put(np.arange(6.0), mesh, P("d"))}
        state["b"].result()
        guard = client.suspend_on_interruption(tmp_path / "retire.zarr", state)
        client.dask.retire_workers([mesh.hosts[-1]], close_workers=True, remove=True)
        assert guard.wait(60)
        assert guard.records[0]["arrays"] == ["b"] and guard.records[0]["error"] is None
        np.testing.assert_array_equal(xr.open_zarr(tmp_path / "retire.zarr")["b"].values, np.arange(6.0))
        client.close()
