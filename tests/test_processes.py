"""The same runtime with one worker process per host: real comms between hosts."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


@pytest.fixture(scope="module")
def psystem():
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as s:
        yield s


@pw.function(in_specs=(P("data", "model"), P("model", None)), out_specs=P("data", None))
def layer(x, w):
    return pw.psum(x @ w, "model")


def test_program_across_processes(psystem):
    with psystem.client(name="proc") as client:
        mesh = client.mesh({"data": 2, "model": 2})
        rng = np.random.default_rng(3)
        x, w = rng.normal(size=(8, 4)), rng.normal(size=(4, 4))
        xa = client.put(x, mesh, P("data", None))
        wa = client.put(w, mesh, P(None, "model"))  # moved to P("model", None) by the program

        @pw.program
        def two_layers(x, w):
            return layer(layer(x, w), w)

        y = two_layers(xa, wa)
        np.testing.assert_allclose(y.result(), x @ w @ w)
        other = client.mesh({"r": 4}, island=1)
        z = pw.function(lambda b: b * 2, in_specs=P("r"), out_specs=P("r"))(y, mesh=other)
        np.testing.assert_allclose(z.result(), 2 * (x @ w @ w))
        # dask.compute's finalize runs in a worker process and gathers from the others
        np.testing.assert_allclose(dask.compute(z)[0], 2 * (x @ w @ w))
        stats = client.device_stats()
        assert stats["links"]["dcn"]["bytes"] > 0 and stats["links"]["same_host"]["bytes"] > 0
        assert {d["address"] for d in client.devices()} == set(psystem.cluster.scheduler_info["workers"])
        del xa, wa, y, z
    assert_clean(psystem)


def test_client_close_frees_everything(psystem):
    client = psystem.client(name="leaver")
    mesh = client.mesh({"x": 4})
    arrays = [client.put(np.ones((16, 16)), mesh, P("x")) for _ in range(5)]
    arrays[-1].result()
    assert any(s["bytes_in_use"] for s in psystem.device_stats()["devices"].values())
    client.close()  # without deleting the arrays first
    assert_clean(psystem)
    assert all(not d["slices"] for d in psystem.devices())
