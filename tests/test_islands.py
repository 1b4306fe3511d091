"""Islands: the link model, explicit moves between meshes and islands, and overlap of moves."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.client.lowering import defer_receives, lower
from pathdask.ops import KernelOp, OutSpec, Ref, ReshardOp
from pathdask.sharding import Sharding
from pathdask.topology import device_info
from pathdask.worker.links import LinkModel

from .conftest import SMALL

# Round numbers: 1 byte/s links with no latency, so a transfer of n bytes takes n seconds.
UNIT = pw.Topology(islands=2, hosts_per_island=2, devices_per_host=2,
                   same_host={"bandwidth": 4, "latency": 0}, ici={"bandwidth": 1, "latency": 0},
                   dcn={"bandwidth": 1, "latency": 0})


def dev(i: int):
    return device_info(UNIT, i)


def send(sender: LinkModel, receiver: LinkModel, src: int, dst: int, nbytes: int, at: float) -> float:
    """One transfer through both sides of the model; returns its arrival."""
    ready = sender.depart(dev(src), dev(dst), nbytes, at)
    return receiver.arrival(src, dev(dst), nbytes, ready)


def test_ici_contention_is_per_device_port():
    """Devices 0,1 on host 0; 2,3 on host 1 (island 0). Two pieces into one device queue at its
    port; two pieces into two devices do not; two pieces out of one device queue at its port."""
    h0, h1 = LinkModel(UNIT), LinkModel(UNIT)
    assert send(h0, h1, 0, 2, 10, 0.0) == 10
    assert send(h0, h1, 1, 2, 10, 0.0) == 20  # device 2's ICI port is busy until 10
    h0, h1 = LinkModel(UNIT), LinkModel(UNIT)
    assert send(h0, h1, 0, 2, 10, 0.0) == 10
    assert send(h0, h1, 1, 3, 10, 0.0) == 10  # other ports: in parallel
    h0, h1 = LinkModel(UNIT), LinkModel(UNIT)
    assert send(h0, h1, 0, 2, 10, 0.0) == 10
    assert send(h0, h1, 0, 3, 10, 0.0) == 20  # device 0's own port sends one at a time
    stats = h1.stats()["ici"]
    assert stats["bytes"] == 20 and stats["transfers"] == 2 and stats["busy_s"] == 20
    assert stats["longest_queue"] == 0  # each receive port had one transfer
    assert h0.ports[("ici-out", 0)].longest_queue == 1


def test_recent_transfers_are_named_but_not_tracked_by_the_garbage_collector():
    """The log keeps plain tuples, which a collection untracks (a NamedTuple it never would), so
    a long log adds nothing to the pauses of full collections; ``recent`` names them."""
    import gc

    h0, h1 = LinkModel(UNIT), LinkModel(UNIT)
    send(h0, h1, 0, 2, 10, 0.0)
    gc.collect()
    assert not any(gc.is_tracked(t) for t in h1.transfers)
    (t,) = h1.recent()
    assert (t.src, t.dst, t.link, t.nbytes, t.end) == (0, 2, "ici", 10, 10)


def test_dcn_bandwidth_belongs_to_the_host_nic_with_separate_directions():
    """Host 0 (devices 0,1, island 0) and host 2 (devices 4,5, island 1)."""
    h0, h2 = LinkModel(UNIT), LinkModel(UNIT)
    assert send(h0, h2, 0, 4, 10, 0.0) == 10
    assert send(h0, h2, 1, 5, 10, 0.0) == 20  # both devices share host 0's NIC
    h0, h2 = LinkModel(UNIT), LinkModel(UNIT)
    assert send(h0, h2, 0, 4, 10, 0.0) == 10
    assert send(h2, h0, 5, 1, 10, 0.0) == 10  # the other direction has its own port
    nic = h0.nics()["0/0"]
    assert nic["send"]["bytes"] == 10 and nic["recv"]["bytes"] == 10
    assert h2.nics()["1/0"]["recv"]["busy_s"] == 10


def test_same_host_moves_are_memory_copies_and_local_ones_are_free():
    h0 = LinkModel(UNIT)
    assert send(h0, h0, 0, 1, 8, 0.0) == 2  # 4 bytes/s copy into device 1
    assert send(h0, h0, 0, 0, 8, 0.0) == 0  # the device itself: nothing moves
    assert h0.stats()["same_host"]["bytes"] == 8 and h0.stats()["ici"]["bytes"] == 0


def test_scale_times_modelled_bytes_and_counts_real_ones():
    h0, h1 = LinkModel(UNIT), LinkModel(UNIT)
    assert send_scaled(h0, h1, 10, 3.0) == 30
    stats = h1.stats()["ici"]
    assert stats["bytes"] == 10 and stats["modelled_bytes"] == 30


def send_scaled(h0: LinkModel, h1: LinkModel, nbytes: int, scale: float) -> float:
    ready = h0.depart(dev(0), dev(2), nbytes, 0.0, scale)
    return h1.arrival(0, dev(2), nbytes, ready, scale)


# -- explicit moves on a real system ----------------------------------------------
SHAPES = ({"x": 1}, {"x": 2}, {"x": 4}, {"a": 2, "b": 2})


def _spec(rng: random.Random, mesh: pw.Mesh) -> pw.PartitionSpec:
    axes = [a for a, _ in mesh.axes]
    rng.shuffle(axes)
    dims: list = [None, None]
    for a in axes[: rng.randint(0, len(axes))]:
        d = rng.randrange(2)
        dims[d] = a if dims[d] is None else (*((dims[d],) if isinstance(dims[d], str) else dims[d]), a)
    return P(*dims)


def minimum_bytes(src: Sharding, dst: Sharding, itemsize: int) -> int:
    """Bytes the target devices need that they do not already hold themselves."""
    held = {d.id: src.index(p) for p, d in enumerate(src.mesh.devices)}
    total = 0
    for p, d in enumerate(dst.mesh.devices):
        need = dst.index(p)
        size = math.prod(s.stop - s.start for s in need)
        own = held.get(d.id)
        if own is not None:
            overlap = [max(0, min(a.stop, b.stop) - max(a.start, b.start)) for a, b in zip(need, own)]
            size -= math.prod(overlap)
        total += size
    return total * itemsize


@pytest.mark.slow
def test_moves_between_random_meshes_and_specs_are_exact_and_minimal(system, client):
    """Property: for random (mesh, spec) pairs, in one island or across two, ``x.to`` gives the
    same values, and the bytes that crossed links equal the minimum the targets need."""
    rng = random.Random(2026)
    meshes = [client.mesh(s, island=i, placement=pl) for s in SHAPES for i in (0, 1) for pl in ("pack", "spread")]
    data = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    for case in range(24):
        a_mesh, b_mesh = rng.choice(meshes), rng.choice(meshes)
        a_spec, b_spec = _spec(rng, a_mesh), _spec(rng, b_mesh)
        x = client.put(data, a_mesh, a_spec)
        x.result()
        before = system.device_stats()["links"]
        y = x.to(b_mesh, b_spec)
        np.testing.assert_array_equal(y.result(), data, err_msg=f"case {case}")
        assert (y.mesh, y.spec) == (b_mesh, b_spec)
        del x, y
        # a result comes from one replica of each block; every device is done once nothing is held
        system.wait_idle(timeout="15s")
        after = system.device_stats()["links"]
        moved = sum(after[c]["bytes"] - before[c]["bytes"] for c in ("same_host", "ici", "dcn"))
        expected = minimum_bytes(Sharding(data.shape, a_mesh, a_spec), Sharding(data.shape, b_mesh, b_spec), 4)
        assert moved == expected, (case, a_mesh, a_spec, b_mesh, b_spec)


def test_a_dcn_move_goes_straight_from_holders_to_the_devices_that_need_them(system, client):
    a, b = client.mesh({"x": 4}, island=0), client.mesh({"x": 2, "y": 2}, island=1)
    data = np.arange(64.0).reshape(8, 8)
    x = client.put(data, a, P("x", None))
    client.reset_observations()
    y = x.to(b, P("y", "x"))
    np.testing.assert_array_equal(y.result(), data)
    log = client.transfers()
    dcn = log.where(log.link == "dcn", drop=True)
    assert dcn.sizes["transfer"] > 0
    assert set(dcn.src.values.astype(int)) <= set(a.device_ids)  # from a device that holds the piece
    assert set(dcn.dst.values.astype(int)) <= set(b.device_ids)  # to one that needs it: no relay
    assert int(dcn["bytes"].sum()) == data.nbytes  # every byte crossed DCN once
    stats = system.device_stats()
    assert stats["links"]["dcn"]["busy_s"] > 0
    assert any(n.get("send", {}).get("bytes") for n in stats["nics"].values())
    assert any(n.get("recv", {}).get("bytes") for n in stats["nics"].values())
    del x, y


def test_to_checks_its_arguments_and_keeps_a_same_placement(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.ones(4), mesh, P("x"))
    assert x.to(mesh) is x
    with pytest.raises(TypeError, match="Mesh"):
        x.to({"x": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="PartitionSpec"):
        x.to(mesh, ("x",))  # type: ignore[arg-type]
    with pytest.raises(pw.ShardingError):
        x.to(client.mesh({"x": 4}), P("x", "x"))
    del x


# -- receives wait for their first reader ----------------------------------------
@pw.function(in_specs=P("x"), out_specs=P("x"), cost=0.2)
def slow(b):
    return b * 2


@pw.function(in_specs=(P("x"), P("x")), out_specs=P("x"))
def add(a, b):
    return a + b


def test_a_receive_waits_for_its_first_reader_so_the_move_overlaps_work(system, client):
    """Island 0 sends its result to island 1, whose devices first run their own slow kernel:
    the receive is placed after it, and the transfer's modelled time falls inside it."""
    m0, m1 = client.mesh({"x": 2}, island=0), client.mesh({"x": 2}, island=1)

    @pw.program
    def step(a, b):
        moved = a.to(m1, model_nbytes=1e9)  # 40 ms over a 25 GB/s NIC
        return add(slow(b), moved)

    a = client.put(np.arange(4.0), m0, P("x"))
    b = client.put(np.ones(4), m1, P("x"))
    prog = step.trace(a, b)
    for plan in lower(prog).values():
        for d, ops in plan.ops.items():
            if d in m1.device_ids:
                kinds = [(type(op).__name__, plan.gangs[op.gang].name) for op in ops]
                assert kinds == [("KernelOp", "slow"), ("ReshardOp", "reshard"), ("KernelOp", "add")]
    client.reset_observations()
    out = step(a, b)
    np.testing.assert_array_equal(out.result(), np.arange(4.0) + 2)
    trace, log = client.trace(), client.transfers()
    dcn = log.where(log.link == "dcn", drop=True)
    kernels = trace.where(trace.gang == "slow", drop=True)
    assert dcn.sizes["transfer"] == 2
    assert (dcn.end.values.max() - dcn.start.values.min()) / np.timedelta64(1, "ms") >= 40
    start, end = kernels.start.values, kernels.end.values
    assert start[~np.isnat(start)].min() < dcn.end.values.max() < end[~np.isnat(end)].max()  # during `slow`
    fig = trace.pathdask.plot(color_by=lambda gang: gang.upper(), transfers=log)  # the Figure 12 kind of plot
    labels = fig.yaxis.major_label_overrides
    assert sorted(v for v in labels.values() if v.startswith("DCN")) == [f"DCN into device {d}" for d in m1.device_ids]
    assert {"SLOW", "ADD", "RESHARD"} <= set(fig.renderers[0].data_source.data["client"])  # colour labels
    assert len(fig.renderers[1].data_source.data["dst"]) == 2  # the two DCN transfers
    del a, b, out


def test_deferring_splits_a_device_that_sends_and_receives():
    """The send part stays where the move is; the receive goes before its reader."""
    peer = device_info(SMALL, 1)
    move = ReshardOp(0, Ref("v", 0), ((peer, (slice(0, 1),)),), ((1, (slice(0, 1),)),), OutSpec(5, (1,), "<f8"))
    other = KernelOp(1, 0, (), ())
    reader = KernelOp(2, 0, (Ref("v", 5),), ())
    ops = defer_receives([move, other, reader])
    assert ops == [ReshardOp(0, Ref("v", 0), move.sends, (), None), other,
                   ReshardOp(0, None, (), move.recvs, move.output), reader]
    assert defer_receives([move, other]) == [ops[0], other, ops[2]]  # no reader: at the end
