"""Every collective against NumPy, on meshes that span devices of one host and two hosts."""

from __future__ import annotations

import numpy as np
import pytest

import pathdask as pw
from pathdask import P

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def mesh_clients(system):
    c = system.client(name="collectives")
    yield c, c.mesh({"a": 2, "b": 2})
    c.close()


def run(client, mesh, body, x, in_spec, out_spec):
    f = pw.function(body, in_specs=(in_spec,), out_specs=out_spec)
    xs = client.put(x, mesh, in_spec)
    return f(xs).result()


def test_psum_pmean_pmax_pmin(mesh_clients):
    client, mesh = mesh_clients
    x = RNG.normal(size=(4, 6))
    # over "a" (across hosts: a is the major axis) and over ("a", "b") (all four devices)
    np.testing.assert_allclose(run(client, mesh, lambda b: pw.psum(b, "a"), x, P("a", None), P()),
                               x[:2] + x[2:])
    np.testing.assert_allclose(run(client, mesh, lambda b: pw.pmean(b, ("a", "b")), x, P(("a", "b")), P()),
                               x.reshape(4, 1, 6).mean(axis=0))
    np.testing.assert_array_equal(run(client, mesh, lambda b: pw.pmax(b, "b"), x, P(None, "b"), P()),
                                  np.maximum(x[:, :3], x[:, 3:]))
    np.testing.assert_array_equal(run(client, mesh, lambda b: pw.pmin(b, "b"), x, P(None, "b"), P()),
                                  np.minimum(x[:, :3], x[:, 3:]))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("tiled", [False, True])
def test_all_gather(mesh_clients, axis, tiled):
    client, mesh = mesh_clients
    x = RNG.normal(size=(4, 6))
    got = run(client, mesh, lambda b: pw.all_gather(b, "a", axis=axis, tiled=tiled), x, P("a", None),
              P(*([None] * (2 if tiled else 3))))
    parts = [x[:2], x[2:]]
    want = np.concatenate(parts, axis=axis) if tiled else np.stack(parts, axis=axis)
    np.testing.assert_array_equal(got, want)


def test_all_to_all(mesh_clients):
    client, mesh = mesh_clients
    x = np.arange(4 * 8, dtype=np.int64).reshape(4, 8)

    # rows sharded over a (2 ways); each block (2, 8) splits its columns and exchanges:
    # the result is sharded by columns instead, with all rows gathered.
    got = run(client, mesh, lambda b: pw.all_to_all(b, "a", split_axis=1, concat_axis=0, tiled=True),
              x, P("a", None), P(None, "a"))
    np.testing.assert_array_equal(got, x)
    # untiled: split axis must equal the group size; it moves to concat_axis
    y = np.arange(2 * 2 * 3).reshape(2, 2, 3)
    got2 = run(client, mesh, lambda b: pw.all_to_all(b[0], "a", split_axis=0, concat_axis=0)[None],
               y, P("a", None, None), P("a", None, None))
    np.testing.assert_array_equal(got2, y.transpose(1, 0, 2))


def test_ppermute_and_axis_index(mesh_clients):
    client, mesh = mesh_clients
    x = np.arange(4.0).reshape(4, 1)
    shift = [(i, (i + 1) % 4) for i in range(4)]
    got = run(client, mesh, lambda b: pw.ppermute(b, ("a", "b"), shift), x, P(("a", "b")), P(("a", "b")))
    np.testing.assert_array_equal(got, np.roll(x, 1, axis=0))
    partial = run(client, mesh, lambda b: pw.ppermute(b, ("a", "b"), [(0, 3)]), x, P(("a", "b")), P(("a", "b")))
    np.testing.assert_array_equal(partial.ravel(), [0, 0, 0, 0])
    idx = run(client, mesh, lambda b: b * 0 + 10 * pw.axis_index("a") + pw.axis_index("b"), x,
              P(("a", "b")), P(("a", "b")))
    np.testing.assert_array_equal(idx.ravel(), [0, 1, 10, 11])
    size = run(client, mesh, lambda b: b * 0 + pw.axis_size(("a", "b")), x, P(("a", "b")), P(("a", "b")))
    assert (size == 4).all()


def test_collectives_count_link_bytes(system, mesh_clients):
    client, mesh = mesh_clients
    before = system.device_stats()["links"]
    x = np.ones((4, 1000))
    run(client, mesh, lambda b: pw.psum(b, "a"), x, P("a", None), P())  # a spans the two hosts
    after = system.device_stats()["links"]
    assert after["ici"]["bytes"] - before["ici"]["bytes"] >= 2 * 2 * 1000 * 8
    assert after["dcn"]["bytes"] == before["dcn"]["bytes"]


def test_collective_outside_a_function_is_an_error():
    with pytest.raises(RuntimeError, match="inside the body"):
        pw.psum(np.ones(2), "a")


def test_bad_collective_arguments(mesh_clients):
    client, mesh = mesh_clients
    with pytest.raises(pw.ShardingError, match="Unknown mesh axis 'z'"):
        run(client, mesh, lambda b: pw.psum(b, "z"), np.ones((4,)), P("a"), P())
    with pytest.raises(pw.ShardingError, match="partial permutation"):
        run(client, mesh, lambda b: pw.ppermute(b, "a", [(0, 1), (1, 1)]), np.ones((4,)), P("a"), P("a"))
