"""A fetch's answer is written by the thread that settles its values, with no hand-off."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

from pathdask.errors import GangAbortedError
from pathdask.worker.frames import connect, read_answer, write_message
from pathdask.worker.store import BufferFreedError, BufferStore
from pathdask.worker.transport import REQUEST, Answer, SocketTransport

TOKEN = b"t" * 32


@pytest.fixture
def store():
    loop = asyncio.new_event_loop()
    yield BufferStore({0: 1 << 20}, loop)
    loop.close()


def _watch(store, key=("p", 0)):
    told, threads = [], []

    def then(value, error):
        told.append((value, error))
        threads.append(threading.current_thread())

    return told, threads, store.when_settled(key, 0, then)


def test_a_watch_is_told_by_the_thread_that_stores_the_value(store):
    told, threads, _ = _watch(store)  # before the buffer is even declared
    store.declare(("p", 0), 0, owned=True)
    assert told == [] and store.fetches_waiting() == 1
    store.allocate(0, 8, lambda: None)
    putter = threading.Thread(target=store.put, args=(("p", 0), 0, np.arange(1.0), 8))
    putter.start()
    putter.join()
    assert threads == [putter] and told[0][1] is None
    np.testing.assert_array_equal(told[0][0], np.arange(1.0))
    assert store.fetches_waiting() == 0
    later, _, _ = _watch(store)  # settled already: told at once, on this thread
    np.testing.assert_array_equal(later[0][0], np.arange(1.0))


def test_a_watch_learns_of_a_drop_a_failure_or_a_free(store):
    cause = GangAbortedError("dropped")
    dropped, _, _ = _watch(store, ("gone", 0))
    store.drop_program("gone", cause)
    assert dropped == [(None, cause)]

    store.declare(("p", 0), 0, owned=True)
    freed, _, _ = _watch(store)
    store.release(("p", 0), 0)  # its key went before it was computed
    assert freed[0][0] is None and isinstance(freed[0][1], BufferFreedError)

    store.declare(("q", 0), 0, owned=True)
    failed, _, _ = _watch(store, ("q", 0))
    store.fail(("q", 0), 0, ValueError("body failed"))
    assert isinstance(failed[0][1], ValueError)


def test_a_stopped_watch_is_never_told(store):
    told, _, stop = _watch(store)
    stop()
    assert store.fetches_waiting() == 0
    store.declare(("p", 0), 0, owned=True)
    store.allocate(0, 8, lambda: None)
    store.put(("p", 0), 0, np.arange(1.0), 8)
    assert told == []


@pytest.fixture
def transport():
    waiting: list[tuple[object, Answer]] = []
    stopped: list[object] = []

    def serve(request, answer):
        waiting.append((request, answer))
        return lambda: stopped.append(request)

    t = SocketTransport("127.0.0.1", lambda m: None, lambda meta, n: memoryview(bytearray(n)), TOKEN,
                        serve=serve)
    yield t, waiting, stopped
    t.close()


def _until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("size", [3, 1 << 18])  # small: written by the giver; large: by another thread
def test_an_answer_given_later_from_any_thread_reaches_the_asker(transport, size):
    t, waiting, stopped = transport
    sock = connect(t.address, TOKEN, None, 5)
    try:
        write_message(sock, (REQUEST, ("fetch", [1])))
        _until(lambda: waiting)
        value = np.arange(size, dtype=np.float64)
        giver = threading.Thread(target=lambda: waiting[0][1].give(("values", [value]), large=size > 3))
        giver.start()
        giver.join()
        kind, got = read_answer(sock)
        assert kind == "values"
        np.testing.assert_array_equal(got[0], value)
        assert not waiting[0][1].give(("values", []))  # one answer per request
        write_message(sock, (REQUEST, ("fetch", [2])))  # the next request, on the same connection
        _until(lambda: len(waiting) == 2)
        waiting[1][1].give(("error", ValueError("no")))
        kind, error = read_answer(sock)
        assert kind == "error" and isinstance(error, ValueError)
    finally:
        sock.close()
    assert stopped == []


def test_an_asker_that_hangs_up_stops_the_wait_at_once(transport):
    t, waiting, stopped = transport
    sock = connect(t.address, TOKEN, None, 5)
    write_message(sock, (REQUEST, ("fetch", [1])))
    _until(lambda: waiting)
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    _until(lambda: stopped == [("fetch", [1])])
    assert not waiting[0][1].give(("values", []))  # nobody to answer any more
