"""Programs as Dask graphs, ShardedArrays as Dask collections, and HTML reprs."""

from __future__ import annotations

import gc
import importlib.util
import shutil
from html.parser import HTMLParser

import dask
import distributed
import numpy as np
import pytest
from distributed import SchedulerPlugin

import pathdask as pw
from pathdask import P
from pathdask.client.calls import build_call
from pathdask.client.graph import layered_graph
from pathdask.client.lowering import fuse, lower
from pathdask.ops import KernelOp, ReshardOp

COST = 1e-4


@pw.function(in_specs=P("x", None), out_specs=P("x", None), cost=COST)
def scale(b):
    return b * 2.0


@pw.function(in_specs=P("q", "p"), out_specs=(P("q", "p"), P()))
def shift_and_total(b):
    return b + 1.0, pw.psum(b.sum(), ("p", "q"))


@pytest.fixture
def meshes(client):
    """A mesh on each island, and a program that runs on both."""
    m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"p": 2, "q": 2}, island=1)

    @pw.program
    def pipeline(x):
        """scale on island 0, then a move to island 1 (a reshard gang) and a two-output gang."""
        return shift_and_total(scale(x), mesh=m1)

    return m0, m1, pipeline


def test_layered_graph_has_one_layer_per_gang(client, meshes):
    m0, m1, pipeline = meshes
    x = client.put(np.arange(32.0).reshape(8, 4), m0, P("x", None))
    prog = pipeline.trace(x)
    g = pipeline.dask_graph(x)
    assert g is layered_graph(prog)  # built once per traced program
    assert [g.name for g in prog.gangs] == ["scale", "reshard", "shift_and_total"]
    assert list(g.layers) == ["scale-0", "reshard-1", "shift_and_total-2"]
    assert g.dependencies == {"scale-0": set(), "reshard-1": {"scale-0"}, "shift_and_total-2": {"reshard-1"}}
    for gang in prog.gangs:
        layer = g.layers[f"{gang.name}-{gang.index}"]
        devices = sorted({d.id for d in gang.mesh.devices} | (set(m0.device_ids) if gang.kind == "reshard" else set()))
        assert sorted(k[1] for k in layer) == devices  # one task per shard (device)
        a = layer.annotations
        assert (a["gang"], a["kind"], a["order"]) == (gang.name, gang.kind, gang.index)
        assert sorted(a["devices"]) == devices
        assert set(a["hosts"]) == {d.address for d in (*m0.devices, *m1.devices) if d.id in devices}
        assert a["mesh"] == dict(gang.mesh.axes)
        assert a["cost"] == (COST if gang.name == "scale" else 0.0)
    # a kernel reads its own device's shard of the earlier gang
    scale_tasks, last = g.layers["scale-0"], g.layers["shift_and_total-2"]
    assert all(not t.dependencies for t in scale_tasks.values())  # it reads only the argument
    for (_, dev), task in last.items():
        assert task.dependencies == {("reshard-1", dev)}
    # a reshard target reads the shards of the source devices it receives from
    for (_, dev), task in g.layers["reshard-1"].items():
        op = task.func.op
        assert isinstance(op, ReshardOp)
        senders = {s for s, _ in op.recvs} | ({dev} if op.sends else set())
        assert task.dependencies == {("scale-0", s) for s in senders}
        assert task.dependencies  # every member either sends or receives
    assert g.__dask_keys__() == [("shift_and_total-2", d) for d in m1.device_ids]
    x.delete()


class GraphLog(SchedulerPlugin):
    """The keys of each graph the scheduler receives."""

    def __init__(self) -> None:
        self.graphs: list[list] = []

    def update_graph(self, scheduler, *, keys, tasks, **kwargs):
        self.graphs.append(sorted(map(str, tasks)))


def test_submitted_graph_is_the_fusion_of_the_layered_graph(system, client, meshes):
    m0, _, pipeline = meshes
    x = client.put(np.ones((8, 4)), m0, P("x", None))
    x.result()
    g = pipeline.dask_graph(x)
    plans = lower(g.program)
    # the fusion pass: per host, per device, the ops of that device's tasks in layer order
    for addr, plan in plans.items():
        for dev, ops in plan.ops.items():
            mine = [t.func.op for layer in g.layers.values() for (_, d), t in layer.items() if d == dev]
            assert ops == tuple(mine)
            assert all(isinstance(op, (KernelOp, ReshardOp)) for op in ops)
        assert all(d.address == addr for spec in plan.gangs.values() for d in spec.members if d.id in plan.ops)
    refused = fuse(g)  # the pass is deterministic: fusing again gives the same ops
    assert {a: p.ops for a, p in refused.items()} == {a: p.ops for a, p in plans.items()}
    hosts = {d.address for layer in g.layers.values() for t in layer.values() for d in [t.func.device]}
    assert set(plans) == hosts

    client.dask.register_plugin(GraphLog(), name="graph-log")
    try:
        y, total = pipeline(x)
        np.testing.assert_array_equal(y.result(), np.full((8, 4), 3.0))
        assert total.result() == 64.0
        received = client.dask.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["graph-log"].graphs)
        pid = y._pid
        made = client.dask.run_on_scheduler(lambda dask_scheduler: sorted(
            (str(k), ts.state, ts.run_spec is None) for k, ts in dask_scheduler.tasks.items()
            if isinstance(k, tuple) and pid in k))
    finally:
        client.dask.unregister_scheduler_plugin("graph-log")
    call, keys, _ = build_call(y._pid, plans, (x.key,))
    assert received == []  # a call is no graph: the scheduler made exactly its output keys
    assert made == sorted((str(k), "memory", True) for k in keys)
    assert len(keys) == len({j for p in plans.values() for j in p.owned})  # one key per output, whatever its hosts
    assert call["hosts"] == list(plans) and {p.id for p in plans.values()} == {call["plan"]}  # one plan id for all
    del y, total, x


def test_the_layered_graph_is_never_run_shard_by_shard(client, meshes):
    m0, _, pipeline = meshes
    x = client.put(np.ones((8, 4)), m0, P("x", None))
    g = pipeline.dask_graph(x)
    with pytest.raises(pw.UnfusedGraphError, match="call the program itself"):
        dask.compute(g)
    task = next(iter(g.layers["scale-0"].values()))
    with pytest.raises(pw.UnfusedGraphError, match="scale-0@"):
        task()
    x.delete()


def test_function_call_graph_and_graph_repr(client, meshes):
    m0, _, pipeline = meshes
    x = client.put(np.ones((8, 4)), m0, P("x", None))
    g = scale.dask_graph(x)
    assert list(g.layers) == ["scale-0"] and len(g) == 4
    text = pipeline.dask_graph(x)._repr_html_()
    check_html(text)
    for name in ("scale", "reshard", "shift_and_total", "devices"):
        assert name in text
    x.delete()


@pytest.mark.skipif(importlib.util.find_spec("graphviz") is None or shutil.which("dot") is None,
                    reason="dask.visualize needs graphviz")
def test_dask_visualize_draws_the_layered_graph(client, meshes, tmp_path):
    m0, _, pipeline = meshes
    x = client.put(np.ones((8, 4)), m0, P("x", None))
    out = tmp_path / "program.svg"
    g = pipeline.dask_graph(x)
    dask.visualize(g, filename=str(out))
    labels = out.read_text().count(">reshard</text>")
    assert labels == len(g.layers["reshard-1"])  # one node per shard task
    x.delete()


# -- ShardedArray as a Dask collection ------------------------------------------------

def test_dask_compute_persist_and_wait(client, meshes):
    m0, _, pipeline = meshes
    data = np.arange(32.0).reshape(8, 4)
    x = client.put(data, m0, P("x", None))
    y = scale(x)
    assert dask.is_dask_collection(y)
    assert y.__dask_scheduler__ == client.dask.get  # never Dask's local schedulers
    assert dask.base.tokenize(y) == dask.base.tokenize(y) != dask.base.tokenize(x)
    (got,) = dask.compute(y)  # the collection's own scheduler: the pathdask client's Dask client
    np.testing.assert_array_equal(got, data * 2)
    np.testing.assert_array_equal(client.dask.compute(y).result(), data * 2)
    (z,) = dask.persist(y)
    assert isinstance(z, pw.ShardedArray) and z is not y
    assert z.__dask_keys__() == y.__dask_keys__()
    assert (z.shape, z.dtype, z.mesh, z.spec) == (y.shape, y.dtype, y.mesh, y.spec)
    with client.dask.as_current():
        done, not_done = distributed.wait(z)
        assert {f.key for f in done} == set(y.__dask_keys__()) and not not_done
        a, b = dask.compute(z, x)  # under the client as the default scheduler
    np.testing.assert_array_equal(a, data * 2)
    np.testing.assert_array_equal(b, data)
    y.delete()  # the persisted copy still owns the buffers
    np.testing.assert_array_equal(z.result(), data * 2)
    del x, y, z
    gc.collect()


def test_dask_compute_raises_the_kernel_error(client, meshes):
    m0, _, pipeline = meshes

    @pw.function(in_specs=P("x", None), out_specs=P("x", None))
    def fail(b):
        raise ZeroDivisionError("boom in a kernel")

    x = client.put(np.ones((8, 4)), m0, P("x", None))
    with pytest.raises(ZeroDivisionError, match="boom in a kernel"):
        dask.compute(fail(x))
    x.delete()


def test_dask_compute_on_a_closed_client_is_typed(system):
    other = system.client(name="gone")
    mesh = other.mesh({"x": 2})
    x = other.put(np.ones(2), mesh, P("x"))
    other.close()
    with pytest.raises(pw.ClientClosedError, match="Keep the client open"):
        dask.compute(x)
    with pytest.raises(pw.ClientClosedError):
        x.__dask_scheduler__  # noqa: B018


# -- HTML reprs --------------------------------------------------------------------------

VOID = {"br", "hr", "img", "input", "meta", "link", "col", "area", "base", "wbr"}


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_html(text: str) -> str:
    """``text`` is a balanced HTML fragment; returns its visible text."""
    p = _Checker()
    p.feed(text)
    p.close()
    assert not p.stack, f"unclosed tags {p.stack}"
    return " ".join(p.text)


def test_mesh_and_array_reprs_show_devices_and_hosts(client, meshes):
    m0, m1, pipeline = meshes
    text = check_html(m1._repr_html_())
    for d in m1.devices:
        assert f"device {d.id}" in text and f"i{d.island}h{d.host}" in text and d.address in text
    assert "p: 2, q: 2" in text and "island" in text
    x = client.put(np.ones((4, 6)), m1, P("q", "p"))
    x.result()
    text = check_html(x._repr_html_())
    for d in m1.devices:
        assert f"d{d.id}" in text.split()
    assert "(4, 6)" in text and "float64" in text and "P('q', 'p')" in text
    assert "status ready" in " ".join(text.split())
    # a replicated array: each block names every device holding it
    r = client.put(np.ones(4), m1, P("q"))
    text = check_html(r._repr_html_())
    holders = [[m1.device_ids[p] for p in ps] for ps in r.sharding.positions_by_block().values()]
    assert len(holders) == 2 and all(len(h) == 2 for h in holders)
    for a, b in holders:
        assert f"d{a},d{b}" in text.split()
    assert repr(x).startswith("ShardedArray(shape=(4, 6)")
    x.delete()
    r.delete()


def test_program_and_system_reprs(system, client, meshes):
    m0, m1, pipeline = meshes

    @pw.program
    def fresh(x):
        return scale(x)

    text = check_html(fresh._repr_html_())
    assert "not yet" in text and "traced for 0 signature(s)" in repr(fresh)
    x = client.put(np.ones((8, 4)), m0, P("x", None))
    y = pipeline(x)
    text = check_html(pipeline._repr_html_())
    assert "pipeline" in text and "gangs 3" in " ".join(text.split())
    for name in ("scale", "reshard", "shift_and_total"):
        assert name in text
    assert " ".join(str(i) for i in m1.device_ids) in text
    assert "traced for 1 signature(s)" in repr(pipeline)
    check_html(pipeline.trace(x)._repr_html_())
    text = check_html(system._repr_html_())
    assert client.name in text and client.id in text
    assert system.scheduler_address in text and "2 island(s)" in text
    assert "tcp://" in repr(system) and "2x2x2" in repr(system)
    off = pw.LocalSystem(system.topology)
    assert "not started" in check_html(off._repr_html_()) and "not started" in repr(off)
    del x, y
