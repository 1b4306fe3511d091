"""Both host-to-host data paths move real bytes and give the same results."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


@pytest.mark.parametrize("chunk", ["8MiB", "1000B"])
@pytest.mark.parametrize(("transport", "in_process"), [("socket", False), ("dask", False), ("socket", True)])
def test_transports(transport, in_process, chunk):
    """With a tiny ``pathdask.transfer-chunk``, every piece between hosts streams in chunks, and
    a strided piece (a column slice) is cut inside its rows."""
    with dask.config.set({"pathdask.transport": transport, "pathdask.transfer-chunk": chunk,
                          "pathdask.in-process-peers": in_process}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name=transport) as client:
            m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"x": 4}, island=1)
            rng = np.random.default_rng(5)
            x = rng.normal(size=(8, 1000))  # pieces big enough to go out of band
            a = client.put(x, m0, P("x"))
            gathered = pw.function(lambda b: pw.all_gather(b, "x", tiled=True), in_specs=P("x"),
                                   out_specs=P())(a)
            np.testing.assert_array_equal(gathered.result(), x)
            moved = pw.function(lambda b: b, in_specs=P(None, "x"), out_specs=P(None, "x"))(a, mesh=m1)
            np.testing.assert_array_equal(moved.result(), x)
            links = system.device_stats()["links"]
            assert links["dcn"]["bytes"] == x.nbytes
            assert links["ici"]["bytes"] > 0 and links["same_host"]["bytes"] > 0
            del a, gathered, moved
            partial = client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].reassembly.partial)
            assert all(not p for p in partial.values()), partial
        assert_clean(system)


def _shared_buffers(dask_worker) -> list[tuple[int, int]]:
    """Pairs of devices of this host whose stored buffers share memory."""
    bufs = [(k[2], b.value) for k, b in dask_worker.plugins["pathdask"].store.buffers.items()
            if b.value is not None]
    return [(d1, d2) for i, (d1, v1) in enumerate(bufs) for d2, v2 in bufs[i + 1:]
            if d1 != d2 and np.shares_memory(v1, v2)]


def test_a_same_host_move_shares_the_immutable_block(system, client):
    """Moving a block to another device of the same host copies nothing (buffers are read-only)."""
    host = [d for d in system.devices() if d["island"] == 0 and d["host"] == 0]
    a, b = (d["id"] for d in host)
    src, dst = client.mesh({"x": 2}, devices=[a, b]), client.mesh({"x": 2}, devices=[b, a])
    x = client.put(np.arange(64.0).reshape(8, 8), src, P("x"))
    moved = pw.function(lambda blk: blk, in_specs=P("x"), out_specs=P("x"))(x, mesh=dst)
    np.testing.assert_array_equal(moved.result(), np.arange(64.0).reshape(8, 8))
    shared = [p for pairs in client.dask.run(_shared_buffers).values() for p in pairs]
    assert sorted(map(sorted, shared)) == [[a, b], [a, b]], shared  # each block is on both devices
    del x, moved


def _peers(dask_worker) -> tuple[str, dict[str, str]]:
    peers = dask_worker.plugins["pathdask"].peers
    with peers._lock:
        return peers.address, dict(peers.addresses)


def test_hosts_learn_each_others_transport_when_they_join():
    """Each host's transport address reaches every other host with its registration, so a
    device never asks a peer, which may be dead, before its first piece; a host that has not
    heard of one asks the scheduler."""
    with dask.config.set({"pathdask.in-process-peers": False}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name="peers") as client:
            # a program with no piece between hosts on every host: its dispatch comes on the
            # scheduler's stream after the announcements, so each host has read them by its end
            n = SMALL.devices_per_island
            add = pw.function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"))
            for island in range(SMALL.islands):
                m = client.mesh({"x": n}, island=island)
                np.testing.assert_array_equal(add(client.put(np.zeros(n), m, P("x"))).result(), np.ones(n))
            known = client.dask.run(_peers)
            own = {addr: transport for addr, (transport, _) in known.items()}
            assert len(own) == SMALL.num_hosts and all(own.values())
            for addr, (_, table) in known.items():
                assert table == {a: t for a, t in own.items() if a != addr}

            mesh = client.mesh({"x": 4}, island=0)
            first = sorted(mesh.hosts)[0]
            client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].peers.addresses.clear(),
                            workers=[first])
            x = client.put(np.arange(4.0), mesh, P("x"))
            total = pw.function(lambda b: pw.psum(b, "x"), in_specs=P("x"), out_specs=P("x"))(x)
            np.testing.assert_array_equal(total.result(), np.full(4, 6.0))
            _, table = client.dask.run(_peers, workers=[first])[first]
            assert table == {a: own[a] for a in mesh.hosts if a != first}
            del x, total
        assert_clean(system)
