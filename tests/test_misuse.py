"""Misuse gets a typed, actionable error at once; nothing is silently wrong; the system stays usable."""

from __future__ import annotations

import logging

import dask
import numpy as np
import pytest
import xarray as xr

import pathdask as pw
from pathdask import P

from .conftest import assert_clean


def test_a_replicated_output_that_differs_is_an_error(client):
    mesh = client.mesh({"d": 4})
    x = client.put(np.arange(4.0), mesh, P("d"))

    @pw.function(in_specs=P("d"), out_specs=P())
    def position(b):
        return np.float64(pw.axis_index("d"))

    y = position(x)
    with pytest.raises(pw.ReplicationError, match=r"output 0 is declared replicated along mesh axes \['d'\]"):
        y.result(timeout=30)
    assert y.status == "error"
    total = pw.function(lambda b: pw.psum(b, "d"), in_specs=P("d"), out_specs=P())(x)
    np.testing.assert_array_equal(total.result(timeout=30), [6.0])  # really replicated: fine
    assert total.status == "ready"
    with dask.config.set({"pathdask.check-replication": False}):
        assert position(x).result(timeout=30).shape == ()  # the check is a switch


def test_a_replicated_check_covers_partial_axes(client):
    mesh = client.mesh({"a": 2, "b": 2})
    x = client.put(np.arange(4.0).reshape(2, 2), mesh, P("a", "b"))

    @pw.function(in_specs=P("a", "b"), out_specs=P("a"))
    def rows(b):  # replicated along "b" only after the psum over "b"
        return pw.psum(b, "b")[:, 0]

    np.testing.assert_array_equal(rows(x).result(timeout=30), [1.0, 5.0])

    @pw.function(in_specs=P("a", "b"), out_specs=P("a"))
    def unreduced(b):
        return b[:, 0]

    with pytest.raises(pw.ReplicationError, match=r"mesh axes \['b'\]"):
        unreduced(x).result(timeout=30)


@pytest.mark.parametrize("value, what", [("hello", r"a str \('hello'\)"), ([1.0], r"a list \(\[1.0\]\)"),
                                         (np.array(["a"]), "an array of dtype <U1")])
def test_non_numeric_outputs_say_what_came_back(client, value, what):
    mesh = client.mesh({"d": 2})
    x = client.put(np.ones(2), mesh, P("d"))
    bad = pw.function(lambda b: value, in_specs=P("d"), out_specs=P(), name="bad")
    with pytest.raises(pw.KernelOutputError, match=f"Function 'bad' output 0 must be a numeric.*{what}"):
        bad(x)


def test_meshes_belong_to_their_client(system, client):
    other = system.client(name="other")
    try:
        mesh = client.mesh({"d": 2})
        with pytest.raises(pw.MeshError, match=r"belongs to client .* not to client 'other'"):
            other.put(np.ones(2), mesh, P("d"))
        mine = other.mesh({"d": 2})
        x = other.put(np.ones(2), mine, P("d"))
        with pytest.raises(pw.MeshError, match="belongs to client"):
            pw.function(lambda b: b, in_specs=P("d"), out_specs=P("d"))(x, mesh=mesh)
        del x
    finally:
        other.close()


def test_a_mesh_of_another_system_fails_at_once(client):
    with pw.LocalSystem(pw.Topology(islands=1, hosts_per_island=1, devices_per_host=2),
                        processes=False, dashboard_address=None) as elsewhere:
        with elsewhere.client(name="elsewhere") as foreign:
            mesh = foreign.mesh({"d": 2})
            with pytest.raises(pw.MeshError, match="perhaps of another system"):
                client.put(np.ones(2), mesh, P("d"))


def test_arrays_of_a_closed_client(system):
    c = system.client(name="short-lived")
    x = c.put(np.ones(2), c.mesh({"d": 2}), P("d"))
    x.result(timeout=30)
    c.close()
    assert x.status == "closed"
    with pytest.raises(pw.ClientClosedError, match="'short-lived' that made this array is closed"):
        x.result()
    with pytest.raises(pw.ClientClosedError, match="is closed; open a new one"):
        c.put(np.ones(2), x.mesh, P("d"))
    # a fetch still waiting when its Dask client closed asks the scheduler no more
    with pytest.raises(pw.ClientClosedError, match="closed while waiting for hosts"):
        c._hosts.hosts_gone([x.mesh.devices[0].address])
    assert_clean(system)


def test_mesh_errors_keep_their_types_across_the_scheduler(client):
    with pytest.raises(pw.SliceTooLargeError, match="an island has only 4"):
        client.mesh({"x": 8})
    with pytest.raises(ValueError, match="placement must be 'pack' or 'spread'") as info:
        client.mesh({"x": 2}, placement="anywhere")
    assert type(info.value) is ValueError


def test_a_bad_transport_setting_is_a_value_error():
    with dask.config.set({"pathdask.transport": "pigeon"}), \
            pytest.raises(ValueError, match="pathdask.transport must be 'socket' or 'dask', got 'pigeon'"):
        pw.LocalSystem(pw.Topology(islands=1, hosts_per_island=1, devices_per_host=1),
                       processes=False, dashboard_address=None).start()


def test_a_kernel_error_is_reported_once_to_its_client(client, caplog):
    mesh = client.mesh({"d": 2})
    x = client.put(np.ones(2), mesh, P("d"))

    @pw.function(in_specs=P("d"), out_specs=P("d"))
    def broken(b):
        raise ZeroDivisionError("in the body")

    with caplog.at_level(logging.ERROR):
        with pytest.raises(ZeroDivisionError, match="in the body"):
            broken(x).result(timeout=30)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_wait_idle_says_what_is_left(system, client):
    mesh = client.mesh({"d": 2})
    x = client.put(np.ones(2), mesh, P("d"))
    x.result(timeout=30)
    with pytest.raises(TimeoutError, match=r"not idle within 0.5s.*holding \(bytes, buffers, queued"):
        system.wait_idle(timeout="500ms")
    del x


def test_program_outputs_keep_xarray_labels(client):
    mesh = client.mesh({"d": 2})
    da = xr.DataArray(np.arange(8.0).reshape(4, 2), dims=("time", "space"),
                      coords={"time": [10, 20, 30, 40]}, name="t")
    x = client.put(da, mesh, {"time": "d"})
    y = pw.function(lambda b: b * 2, in_specs=P("d"), out_specs=P("d"))(x)
    out = y.to_xarray()
    assert out.dims == ("time", "space") and list(out["time"].values) == [10, 20, 30, 40]
    np.testing.assert_array_equal(out.values, da.values * 2)
    s = pw.function(lambda b: pw.psum(b.sum(0), "d"), in_specs=P("d"), out_specs=P())(x)
    labelled = s.to_xarray(dims=("space",), coords={"space": ["u", "v"]}, name="total")
    assert labelled.dims == ("space",) and labelled.name == "total" and list(labelled["space"].values) == ["u", "v"]
