"""Failures stay contained: a bad gang fails its own program, nothing hangs."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


def test_mismatched_collectives_time_out_instead_of_hanging():
    with dask.config.set({"pathdask.collective-timeout": "1s"}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name="faulty") as client:
            mesh = client.mesh({"x": 4})

            @pw.function(in_specs=P("x"), out_specs=P("x"))
            def lopsided(b):
                if pw.axis_index("x") == 0:  # only one device calls the collective
                    return pw.psum(b, "x")
                return b

            x = client.put(np.ones(4), mesh, P("x"))
            with pytest.raises(pw.GangAbortedError, match=r"never reached it.*same collectives"):
                lopsided(x).result(timeout=30)
            # the devices are free again
            ok = pw.function(lambda b: pw.psum(b, "x"), in_specs=P("x"), out_specs=P())
            np.testing.assert_array_equal(ok(x).result(timeout=30), [4.0])
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
