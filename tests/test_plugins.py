"""The plugins install every handler the protocol names, on the scheduler and each worker, and a
message the protocol does not know is answered with a typed error, never dropped silently."""

from __future__ import annotations

import pytest

from pathdask import protocol
from pathdask.errors import ProtocolError
from pathdask.protocol import HOST, KINDS, RPC, SCHEDULER, STREAM_OP


def _rpc_ops(receiver: str) -> set[str]:
    return {c.op for c in KINDS.values() if c.route.receiver == receiver and c.route.channel == RPC}


def test_every_handler_is_installed(system, client):
    on_scheduler = client.dask.run_on_scheduler(
        lambda dask_scheduler: (sorted(h for h in dask_scheduler.handlers if h.startswith("pathdask")),
                                sorted(h for h in dask_scheduler.stream_handlers if h.startswith("pathdask")),
                                sorted(dask_scheduler.plugins)))
    handlers, stream_ops, plugins = on_scheduler
    assert set(handlers) == _rpc_ops(SCHEDULER)
    assert stream_ops == [STREAM_OP]
    assert "pathdask" in plugins
    per_worker = client.dask.run(
        lambda dask_worker: (sorted(h for h in dask_worker.handlers if h.startswith("pathdask")),
                             sorted(h for h in dask_worker.stream_handlers if h.startswith("pathdask")),
                             "pathdask" in dask_worker.plugins))
    assert len(per_worker) == system.topology.num_hosts
    for handlers, ops, installed in per_worker.values():
        assert set(handlers) == _rpc_ops(HOST) | {protocol.PEER_STREAM_OP}
        assert set(ops) == {STREAM_OP, *protocol.PEER_OPS.values()}
        assert installed


def test_an_unknown_or_malformed_message_gets_a_typed_error_naming_it_and_its_sender(system, client):
    with pytest.raises(ProtocolError, match=r"malformed pathdask message 'allocate-mesh'.*expected the fields"):
        client.dask.sync(client.dask.scheduler.pathdask_allocate_mesh, client=client.id, shap={"x": 1})
    # on a stream there is no one to raise to: the scheduler logs it and says so as a Dask event
    client.dask._send_to_scheduler({"op": STREAM_OP, "kind": "no-such-message", "x": 1})
    event = client.dask.sync(_next_event, client.dask)
    assert "unknown pathdask message 'no-such-message'" in event["error"]
    assert client.id in event["error"]
    client.dask._send_to_scheduler({"op": STREAM_OP, "kind": "order", "programs": []})
    event = client.dask.sync(_next_event, client.dask, 2)
    assert "'order'" in event["error"] and "is for the host, not the scheduler" in event["error"]


async def _next_event(dask_client, n: int = 1) -> dict:
    """The ``n``-th protocol-error event on the scheduler, once it is there."""
    import asyncio

    for _ in range(500):
        events = await dask_client.scheduler.events(topic=protocol.PROTOCOL_ERROR_TOPIC)
        if len(events) >= n:
            return events[n - 1][1]
        await asyncio.sleep(0.01)
    raise AssertionError("no pathdask-protocol-error event came")
