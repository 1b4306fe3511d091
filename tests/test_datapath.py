"""Data goes from the client to the hosts directly: a put's blocks never pass the scheduler."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pathdask import P


def _graph_bytes(dask_scheduler) -> int:
    """What the scheduler holds of every task it knows (their run specs, pickled), in bytes."""
    from distributed.protocol.pickle import dumps

    return sum(len(dumps(ts.run_spec)) for ts in dask_scheduler.tasks.values())


@pytest.mark.slow
def test_a_64_mib_put_adds_almost_nothing_to_the_scheduler(system, client):
    mesh = client.mesh({"d": 4})
    data = np.random.default_rng(0).normal(size=(8 * 2**20 // 8, 8))  # 64 MiB
    assert data.nbytes == 64 * 2**20
    before = client.dask.run_on_scheduler(_graph_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Dask's "Sending large graph" warning would fail the test
        x = client.put(data, mesh, P("d"))
        during = client.dask.run_on_scheduler(_graph_bytes)
        np.testing.assert_array_equal(x.result(timeout=60), data)
    assert during - before < 2**20, f"the scheduler holds {during - before} bytes more for a 64 MiB put"
    replicated = client.put(data[:1024], mesh, P())  # one copy per host, not per device
    np.testing.assert_array_equal(replicated.result(timeout=60), data[:1024])
    del x, replicated


@pytest.mark.parametrize(("value", "inline"), [
    (np.arange(6.0).reshape(2, 3), True),
    (np.array(7, dtype=np.int16), True),
    (np.array([0, 1, 2], dtype="datetime64[s]"), True),
    (np.zeros(1 << 14), False),  # 128 KiB: over INLINE_BYTES, Dask's frames
    (np.zeros(3, dtype=[("a", "f4"), ("b", "i8")]), False),  # structured: Dask's serialization
])
def test_fetched_blocks_round_trip_through_a_reply(value, inline):
    """Small plain blocks travel inside the fetch reply as bytes; others as Dask-serialized frames.
    Both come back equal, with their dtype and shape, through Dask's own message encoding."""
    from distributed.protocol import dumps, loads

    from pathdask.gather import decode_block, encode_block

    encoded = encode_block(value)
    assert (isinstance(encoded, tuple) and encoded[0] == "inline") == inline
    back = decode_block(loads(dumps({"values": [encoded]}))["values"][0])
    assert back.dtype == value.dtype and back.shape == value.shape
    np.testing.assert_array_equal(back, value)


def test_a_local_systems_clients_reach_its_scheduler_in_process(system, client):
    """Clients of a LocalSystem talk to its scheduler without a socket; its hosts use TCP."""
    assert system.client_address.startswith("inproc://")
    assert client.dask.scheduler.address == system.client_address
    assert system.scheduler_address.startswith("tcp://")
    assert all(a.startswith("tcp://") for a in client.dask.scheduler_info()["workers"])


def _fetches_waiting(dask_worker) -> int:
    return dask_worker.plugins["pathdask"].store.fetches_waiting()


def test_results_come_over_the_hosts_sockets_and_a_host_lets_an_abandoned_fetch_go(system, client):
    """``result()`` asks the hosts on their socket transports, keeps the connections for the
    next fetch, and a fetch that timed out stops its hosts' waiting long before its program ends."""
    import time

    import pathdask as pw

    mesh = client.mesh({"x": 4}, island=0)
    x = client.put(np.arange(4.0), mesh, P("x"))
    np.testing.assert_array_equal(x.result(), np.arange(4.0))
    assert client._hosts._sockets is not None and all(client._hosts._sockets.idle[a] for a in mesh.hosts)
    y = pw.function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=4.0)(x)
    with pytest.raises(TimeoutError, match=r"not ready within 0.2s"):
        y.result(timeout=0.2)
    deadline = time.monotonic() + 3.0  # the hosts look at the connection every transport.POLL_S
    while sum(client.dask.run(_fetches_waiting).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(client.dask.run(_fetches_waiting).values()) == 0
    assert y.status == "pending"  # let go before its program ended
    np.testing.assert_array_equal(y.result(timeout=30), np.arange(4.0) + 1.0)
    del x, y


def test_a_client_that_cannot_reach_the_hosts_sockets_fetches_over_dask_comms(system, client, caplog):
    """Where a host is in the cluster but its transport refuses this client (a firewall that
    lets only Dask's ports through), results come over Dask's comms, with a warning."""
    mesh = client.mesh({"x": 4}, island=0)
    x = client.put(np.arange(4.0), mesh, P("x"))
    sockets = client._hosts._sockets
    assert sockets is not None
    sockets.close()  # no idle connection left to reuse
    sockets.closed, sockets.addresses = False, {}
    sockets.lookup = lambda host: "127.0.0.1:1"  # nothing listens there: refused
    with caplog.at_level("WARNING", logger="pathdask.client"):
        np.testing.assert_array_equal(x.result(timeout=30), np.arange(4.0))
    assert client._hosts._sockets is None
    assert "cannot be reached from this client" in caplog.text
    np.testing.assert_array_equal(x.result(timeout=30), np.arange(4.0))
    del x


def test_a_fetch_asks_the_scheduler_whether_its_hosts_left(system, client):
    """A fetch still waiting asks the scheduler, in one message, whether the hosts it waits for
    left (a host whose machine is gone may never close its connection): then DeviceLostError."""
    import pathdask as pw

    mesh = client.mesh({"x": 4}, island=0)
    host = mesh.hosts[0]
    assert client._hosts.hosts_gone([host, "tcp://127.0.0.1:1"]) == ["tcp://127.0.0.1:1"]
    x = client.put(np.arange(4.0), mesh, P("x"))
    y = pw.function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=3.0)(x)
    sockets = client._hosts._sockets
    assert sockets is not None
    asked: list[list[str]] = []
    sockets.gone = lambda hosts: asked.append(hosts) or hosts  # as if they had all left
    with pytest.raises(pw.DeviceLostError, match="left the cluster"):
        y.result(timeout=30)
    assert asked == [sorted(mesh.hosts)]
    sockets.gone = client._hosts.hosts_gone
    np.testing.assert_array_equal(y.result(timeout=30), np.arange(4.0) + 1.0)
    del x, y
