"""pathdask's messages go at once on Dask's batched streams, with what Dask queued before them."""

import asyncio
import contextlib
import gc
from types import SimpleNamespace

import dask
import numpy as np
from dask.utils import parse_bytes
from distributed.batched import BatchedSend
from distributed.comm import connect, listen

from pathdask import P, function
from pathdask.compat import send_ahead, send_to_worker
from pathdask.protocol import Dispatch
from pathdask.streams import flush, whole_writes


async def _pair(interval: str, where: str = "inproc://") -> tuple[BatchedSend, "asyncio.Queue[object]", object]:
    got: asyncio.Queue[object] = asyncio.Queue()

    async def handle(comm):  # the other side reads batches until the stream closes
        while True:
            try:
                batch = await comm.read()
            except Exception:  # noqa: BLE001 - closed
                return
            for m in batch:
                got.put_nowait(m)

    listener = await listen(where, handle)
    stream = BatchedSend(interval=interval)
    stream.start(await connect(listener.contact_address))
    return stream, got, listener


def test_flush_sends_what_a_stream_holds_without_waiting_out_its_interval():
    async def go():
        stream, got, listener = await _pair("1h")
        stream.send("first")  # an idle stream sends at once...
        assert await asyncio.wait_for(got.get(), 10) == "first"
        stream.send("held", "too")  # ...and then holds what follows for its interval (an hour)
        await asyncio.sleep(0)
        assert got.empty()
        flush(stream)
        assert [await asyncio.wait_for(got.get(), 10) for _ in range(2)] == ["held", "too"]  # in order
        stream.send("again")
        flush(stream)
        assert await asyncio.wait_for(got.get(), 10) == "again"
        await stream.close()
        listener.stop()

    asyncio.run(go())


def test_flush_writes_the_batch_itself_in_order_once_writes_are_whole():
    async def go():
        stream, got, listener = await _pair("1h", "tcp://127.0.0.1:0")
        stream.send("first")  # Dask's own send of an idle stream: its background sender writes it
        assert await asyncio.wait_for(got.get(), 10) == "first"
        stream.send("second")
        flush(stream)  # the first flush only makes writes whole; the sender takes this batch
        assert await asyncio.wait_for(got.get(), 10) == "second"
        assert whole_writes(stream) and not stream.comm.allow_offload
        big = b"x" * (parse_bytes(dask.config.get("distributed.comm.offload")) + 1)  # was written from a thread
        stream.send("third", big)
        flush(stream)
        assert stream.buffer == [] and stream.batch_count == 3  # written here, not by the sender
        stream.send("fourth")
        flush(stream)
        assert [await asyncio.wait_for(got.get(), 10) for _ in range(3)] == ["third", big, "fourth"]
        await stream.close()
        listener.stop()

    asyncio.run(go())


def test_a_worker_whose_comm_closed_is_told_nothing_and_reported_gone():
    async def go():
        stream, got, listener = await _pair("1h", "tcp://127.0.0.1:0")
        scheduler = SimpleNamespace(stream_comms={"w": stream})
        assert send_to_worker(scheduler, "w", {"op": "first"}) and send_ahead(scheduler, "w", [{"op": "ahead"}])
        assert [await asyncio.wait_for(got.get(), 10) for _ in range(2)] == [{"op": "first"}, {"op": "ahead"}]
        stream.comm.abort()  # the worker left; Dask removes its stream a moment later
        assert not send_to_worker(scheduler, "w", {"op": "late"}) and not send_ahead(scheduler, "w", [{"op": "late"}])
        assert not send_to_worker(SimpleNamespace(stream_comms={}), "w", {"op": "none"})
        listener.stop()

    asyncio.run(go())


def test_flush_leaves_empty_unstarted_and_missing_streams_alone():
    flush(None)
    idle = BatchedSend(interval="1h")
    flush(idle)  # not started: nothing to send, nothing raised
    idle.send("queued")
    flush(idle)
    assert idle.buffer == ["queued"]  # sent once the stream starts, as Dask would


def test_a_waiting_client_keeps_getting_results_with_releases_riding_along(system, client):
    """Calls that each wait for their result, releasing the previous one: every release reaches
    the hosts (their stores empty, while the client is still open) though none goes on its own."""
    mesh = client.mesh({"x": 4})
    inc = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="inc")
    y = client.put(np.zeros(4), mesh, P("x"))
    for i in range(20):
        y = inc(y)
        np.testing.assert_array_equal(y.result(), np.full(4, i + 1.0))
    del y
    gc.collect()
    stats = system.wait_idle(timeout="15s")  # raises unless every buffer was freed
    assert all(s["buffers"] == 0 for s in stats["devices"].values())


def test_a_burst_of_calls_reaches_the_hosts_from_its_first_call_on(system, client, unbatched):
    """The scheduler sends a burst's first call to its hosts at once, and the rest in slices of
    its work (``CALL_SLICE``), instead of all of them once the last is taken in; every call runs
    once, in order."""
    assert system.cluster is not None
    sizes: list[int] = []
    handlers = {}
    for worker in system.cluster.workers.values():
        rt = worker.plugins["pathdask"]
        handlers[rt] = inner = rt.handlers[Dispatch]

        def counted(msg, _inner=inner):
            sizes.append(len(msg.calls))
            return _inner(msg)

        rt.handlers[Dispatch] = counted
    try:
        mesh = client.mesh({"x": 2}, island=0)  # one host: one dispatch per slice
        inc = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="inc")
        y = client.put(np.zeros(2), mesh, P("x"))
        y.result()
        sizes.clear()
        for _ in range(100):  # made faster than taken in: they travel as one message
            y = inc(y)
        np.testing.assert_array_equal(y.result(), np.full(2, 100.0))
        assert sum(sizes) == 100
        assert sizes[0] == 1 and len(sizes) > 1, sizes
    finally:
        for rt, inner in handlers.items():
            rt.handlers[Dispatch] = inner


def test_a_one_host_programs_ending_rides_with_the_next_batch_and_a_spanning_ones_goes_at_once(system, client):
    """Under fifo nothing waits for an ending, but a host lost before a spanning program's ending
    arrives fails the program on every host: only endings of programs that ran on one host alone
    wait for the host's next batch."""
    import time

    from pathdask.protocol import ProgramDone

    assert system.cluster is not None
    told: dict[str, list[bool]] = {}
    tells = {}
    for worker in system.cluster.workers.values():
        rt = worker.plugins["pathdask"]
        assert rt.prompt_endings is False  # fifo
        tells[rt] = inner = rt.tell

        def tell(msg, now=True, _inner=inner):
            if isinstance(msg, ProgramDone):
                told.setdefault(msg.pid, []).append(now)
            return _inner(msg, now)

        rt.tell = tell
    try:
        inc = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="inc")
        for shape, hosts in (({"x": 2}, 1), ({"x": 4}, 2)):  # one host's two devices; two hosts
            mesh = client.mesh(shape, island=0)
            assert len(mesh.hosts) == hosts
            y = inc(client.put(np.zeros(mesh.size), mesh, P("x")))
            np.testing.assert_array_equal(y.result(), np.ones(mesh.size))
            deadline = time.monotonic() + 15
            while len(told.get(y.ref.pid, [])) < hosts:  # the hosts' event loops take endings up
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert told[y.ref.pid] == [hosts > 1] * hosts
            del y
    finally:
        for rt, inner in tells.items():
            rt.tell = inner


@contextlib.contextmanager
def _call_paths(system):
    """Count the calls the plugin takes each way in: handed over (``call_now``), or on the stream."""
    from pathdask.protocol import Calls

    plugin = system.cluster.scheduler.plugins["pathdask"]
    seen = {"handed": 0, "stream": 0}
    now, streamed = plugin.call_now, plugin.handlers[Calls]

    def call_now(client, msg):
        seen["handed"] += len(msg.calls)
        return now(client, msg)

    async def call(client, msg):
        seen["stream"] += len(msg.calls)
        return await streamed(client, msg)

    plugin.call_now, plugin.handlers[Calls] = call_now, call
    try:
        yield seen
    finally:
        plugin.call_now, plugin.handlers[Calls] = now, streamed


def _counting_from_a_put(client, seen):
    """An increment on one host's devices, and an array put there; the count starts after it."""
    mesh = client.mesh({"x": 2}, island=0)
    inc = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="inc")
    y = client.put(np.zeros(2), mesh, P("x"))
    y.result()
    seen.update(handed=0, stream=0)
    return inc, y


def test_an_embedded_client_hands_a_waiting_call_to_the_plugin(system, client):
    """A client on its scheduler's event loop hands a lone call to the plugin when the scheduler
    handled everything on its stream, which then holds only releases; results stay right."""
    with _call_paths(system) as seen:
        inc, y = _counting_from_a_put(client, seen)
        for i in range(30):  # each waited for: the stream is settled at the next call
            y = inc(y)
            np.testing.assert_array_equal(y.result(), np.full(2, i + 1.0))
        assert seen["handed"] >= 25 and seen["handed"] + seen["stream"] == 30, seen


def test_a_client_of_its_own_loop_sends_calls_on_the_stream(system):
    """A client with an event loop of its own is not embedded: every call goes on its stream."""
    import pathdask as pw

    with _call_paths(system) as seen, pw.Client(system.client_address, name="own-loop") as other:
        assert other._dispatcher._embedded is None
        inc, y = _counting_from_a_put(other, seen)
        for _ in range(5):
            y = inc(y)
            y.result()
        np.testing.assert_array_equal(y.result(), np.full(2, 5.0))
        assert seen == {"handed": 0, "stream": 5}, seen
        del y


def test_calls_stay_in_order_while_they_switch_between_the_two_ways(system, client, unbatched):
    """Lone calls and bursts, mixed: a call handed over never overtakes one on the stream (each
    reads the last one's result, so one out of order would read a buffer not computed yet)."""
    with _call_paths(system) as seen:
        inc, y = _counting_from_a_put(client, seen)
        total = 0
        for burst in (1, 40, 1, 1, 25, 1, 60, 1):
            for _ in range(burst):
                y = inc(y)
            total += burst
            if burst == 1:
                np.testing.assert_array_equal(y.result(), np.full(2, float(total)))
        np.testing.assert_array_equal(y.result(), np.full(2, float(total)))
        assert seen["handed"] > 0 and seen["stream"] > 0 and seen["handed"] + seen["stream"] == total, seen
