"""Shard shapes, index maps and resharding plans, exactly; no cluster needed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pathdask as pw
from pathdask import P
from pathdask.sharding import Sharding, reshard_plan
from pathdask.testing import mesh_shapes, sharded_layouts, specs_for
from pathdask.topology import DeviceId, DeviceInfo


def fake_mesh(shape: dict[str, int], offset: int = 0) -> pw.Mesh:
    n = int(np.prod(list(shape.values())))
    devs = [DeviceInfo(DeviceId(offset + i), 0, (offset + i) // 2, (offset + i) % 2, f"h{(offset + i) // 2}")
            for i in range(n)]
    return pw.Mesh.create(shape, devs)


def test_shard_shapes_and_indices():
    mesh = fake_mesh({"data": 2, "model": 2})
    s = Sharding((8, 4), mesh, P("data", None))
    assert s.shard_shape == (4, 4)
    # data-major positions: (0,0),(0,1),(1,0),(1,1); replicated over model
    assert s.indices() == [(slice(0, 4), slice(0, 4))] * 2 + [(slice(4, 8), slice(0, 4))] * 2
    s2 = Sharding((8, 6), mesh, P(("model", "data"), None))
    assert s2.shard_shape == (2, 6)
    assert [ix[0].start for ix in s2.indices()] == [0, 4, 2, 6]  # model is major in the tuple


def test_replicated_and_scalar():
    mesh = fake_mesh({"x": 4})
    s = Sharding((), mesh, P())
    assert s.shard_shape == () and s.split(np.float64(3.0)) == [3.0] * 4


def test_errors_are_typed_and_name_things():
    mesh = fake_mesh({"data": 2, "model": 2})
    with pytest.raises(pw.ShardingError, match=r"Unknown mesh axis 'batch'.*\['data', 'model'\]"):
        Sharding((8, 4), mesh, P("batch"))
    with pytest.raises(pw.ShardingError, match=r"Dimension 0 of shape \(7, 4\).*'data'.*2 equal parts"):
        Sharding((7, 4), mesh, P("data"))
    with pytest.raises(pw.ShardingError, match="more than once"):
        P("data", "data")
    with pytest.raises(pw.ShardingError, match="3 entries"):
        Sharding((8, 4), mesh, P(None, None, "data"))
    with pytest.raises(pw.ShardingError, match="positive int"):
        pw.Mesh.create({"data": 0}, [])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_split_assemble_identity(data):
    shape_m = data.draw(mesh_shapes(max_devices=8))
    mesh = fake_mesh(shape_m)
    spec, shape = data.draw(sharded_layouts(shape_m))
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    s = Sharding(shape, mesh, spec)
    blocks = s.split(x)
    assert all(b.shape == s.shard_shape for b in blocks)
    np.testing.assert_array_equal(s.assemble(dict(enumerate(blocks)), x.dtype), x)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_reshard_plan_moves_every_element_once(data):
    m1, m2 = data.draw(mesh_shapes()), data.draw(mesh_shapes())
    mesh1, mesh2 = fake_mesh(m1), fake_mesh(m2, offset=data.draw(st.integers(0, 4)))
    spec1, shape = data.draw(sharded_layouts(m1))
    # a second spec that divides the same shape
    spec2 = data.draw(specs_for(shape, m2))
    s1, s2 = Sharding(shape, mesh1, spec1), Sharding(shape, mesh2, spec2)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    src_blocks = s1.split(x)
    out = {t: np.full(s2.shard_shape, -1) for t in range(mesh2.size)}
    for pc in reshard_plan(s1, s2):
        assert (out[pc.dst][pc.dst_index] == -1).all(), "an element is written twice"
        out[pc.dst][pc.dst_index] = src_blocks[pc.src][pc.src_index]
    for t in range(mesh2.size):
        np.testing.assert_array_equal(out[t], x[s2.index(t)])
