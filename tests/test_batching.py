"""Opportunistic batching (client/batching.py): calls made while one is on its way go as one
program; what nothing holds gets no Dask key; every held array is an output."""

from __future__ import annotations

import gc

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.client.batching import _pieces
from pathdask.errors import ClientClosedError

from .conftest import SMALL, assert_clean

add_one = pw.function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), name="add_one")
mean_add = pw.function(lambda b: pw.pmean(b, "x") + 1.0, in_specs=P("x"), out_specs=P("x"), name="mean_add")


def _boom(b):
    if np.any(b):  # its inference runs on zeros
        raise ValueError("boom")
    return b


boom = pw.function(_boom, in_specs=P("x"), out_specs=P("x"), name="boom")


@pytest.fixture(autouse=True)
def batching():
    """Batching on for every test here, whatever the defaults."""
    with dask.config.set({"pathdask.batch.enabled": True}):
        yield


def _scheduler_keys(client: pw.Client) -> int:
    return client.dask.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def test_pieces_are_powers_of_two_largest_first_then_the_few_left():
    assert _pieces(37) == [32, 5]
    assert _pieces(64) == [64]
    assert _pieces(1) == [1]
    assert _pieces(15) == [15]
    assert _pieces(127) == [64, 32, 16, 15]


def test_a_loop_goes_as_one_program_and_its_dropped_values_get_no_keys(client):
    mesh = client.mesh({"x": 4})
    x = client.put(np.arange(4.0), mesh, P("x"))
    keys = _scheduler_keys(client)
    batcher = client._batcher
    calls, programs = batcher.batched_calls, batcher.batch_programs
    with batcher.holding():
        y = x
        for _ in range(16):
            y = mean_add(y)
        assert y._batch is not None  # pending: nothing went yet
    np.testing.assert_allclose(y.result(), np.full(4, 1.5 + 16))
    assert (batcher.batched_calls - calls, batcher.batch_programs - programs) == (16, 1)
    assert _scheduler_keys(client) - keys == len(y.__dask_keys__())  # only the held array has keys


def test_every_held_array_is_an_output(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.arange(2.0), mesh, P("x"))
    with client._batcher.holding():
        ys = [add_one(x)]
        for _ in range(6):
            ys.append(add_one(ys[-1]))
    for i, y in enumerate(ys):
        np.testing.assert_array_equal(y.result(), np.arange(2.0) + i + 1)
        assert y.status == "ready"
        assert dask.compute(y)[0].tolist() == (np.arange(2.0) + i + 1).tolist()


def test_a_batch_that_cannot_go_whole_goes_in_power_of_two_pieces(client):
    """The batcher sends the largest power-of-two head while the rest waits; a value crossing
    the cut, which nothing holds, is made by the head all the same."""
    mesh = client.mesh({"x": 2})
    x = client.put(np.zeros(2), mesh, P("x"))
    batcher = client._batcher
    programs = batcher.batch_programs
    with batcher.holding():
        y = x
        for i in range(21):
            y = add_one(y)
            if i == 3:
                fourth = y
        with batcher._lock:
            head = batcher._take_head()
        assert len(head.calls) == 16 and len(batcher._open.calls) == 5
        assert fourth._batch is head and y._batch is batcher._open and y._slot == (4, 0)
    batcher._send(head)
    assert fourth._batch is None
    np.testing.assert_array_equal(y.result(), np.full(2, 21.0))
    np.testing.assert_array_equal(fourth.result(), np.full(2, 4.0))
    assert batcher.batch_programs - programs == 2


def test_a_deleted_pending_array_is_no_output_and_others_still_are(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.ones(2), mesh, P("x"))
    with client._batcher.holding():
        a = add_one(x)
        b = add_one(a)
        a.delete()
        c = add_one(x)
    np.testing.assert_array_equal(b.result(), np.full(2, 3.0))
    np.testing.assert_array_equal(c.result(), np.full(2, 2.0))
    with pytest.raises(RuntimeError, match="deleted"):
        a.result()


def test_a_failing_call_fails_only_what_depends_on_it(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.ones(2), mesh, P("x"))
    with client._batcher.holding():
        bad = add_one(boom(x))
        good = add_one(x)
    with pytest.raises(ValueError, match="boom"):
        bad.result()
    np.testing.assert_array_equal(good.result(), np.full(2, 2.0))


def test_calls_on_other_devices_do_not_join_the_batch(client):
    m1, m2 = client.mesh({"x": 2}), client.mesh({"x": 2})
    assert set(m1.device_ids).isdisjoint(m2.device_ids)
    x1 = client.put(np.zeros(2), m1, P("x"))
    x2 = client.put(np.zeros(2), m2, P("x"))
    batcher = client._batcher
    programs = batcher.batch_programs
    with batcher.holding():
        a = add_one(add_one(x1))
        b = add_one(x2)  # the open batch (on m1) goes first
        c = add_one(a.to(m2))  # a move reads m1 and m2: its own batch
    np.testing.assert_array_equal(a.result(), np.full(2, 2.0))
    np.testing.assert_array_equal(b.result(), np.full(2, 1.0))
    np.testing.assert_array_equal(c.result(), np.full(2, 3.0))
    assert batcher.batch_programs - programs == 4


def test_batching_off_sends_each_call_alone(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.zeros(2), mesh, P("x"))
    batcher = client._batcher
    calls = batcher.batched_calls
    with dask.config.set({"pathdask.batch.enabled": False}), batcher.holding():
        y = add_one(add_one(x))
        assert y._batch is None
    np.testing.assert_array_equal(y.result(), np.full(2, 2.0))
    assert batcher.batched_calls == calls


def test_a_full_batch_goes_without_waiting(client):
    mesh = client.mesh({"x": 2})
    x = client.put(np.zeros(2), mesh, P("x"))
    with dask.config.set({"pathdask.batch.max-gangs": 4}), client._batcher.holding():
        ys = [x]
        for _ in range(7):
            ys.append(add_one(ys[-1]))
        assert ys[4]._batch is None  # the first four went when the batch was full
        assert ys[5]._batch is not None
    np.testing.assert_array_equal(ys[-1].result(), np.full(2, 7.0))


def test_closing_the_client_fails_its_pending_arrays(system):
    c = system.client(name="closing")
    mesh = c.mesh({"x": 2})
    x = c.put(np.zeros(2), mesh, P("x"))
    with c._batcher.holding():
        y = add_one(x)
        c.close()
    with pytest.raises(ClientClosedError):
        y.result()
    del x, y
    gc.collect()
    assert_clean(system)


def test_an_unheld_loop_in_worker_processes_is_batched_and_right():
    """Nothing held open: the calls made while the first is on its way wait in the batch."""
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        with system.client(name="procs") as client:
            mesh = client.mesh({"x": 4})
            x = client.put(np.zeros(4), mesh, P("x"))
            for _ in range(3):
                y = x
                for _ in range(64):
                    y = mean_add(y)
                np.testing.assert_allclose(y.result(), np.full(4, 64.0))
            assert client._batcher.batched_calls > 0
            del x, y
        assert_clean(system)


def test_a_stored_cause_raised_many_times_still_crosses_processes_with_its_type():
    """Every reader raises a dropped program's stored cause again, and each raise adds to its
    traceback; with tblib's pickling installed for its class (as distributed installs it),
    pickling that traceback overflowed the stack and the error arrived as a RuntimeError."""
    import pickle

    import tblib.pickling_support

    from pathdask.errors import DeviceLostError
    from pathdask.worker.dataplane import picklable

    cause = DeviceLostError("host h left the cluster while this program used it")
    tblib.pickling_support.install(cause)

    def read():
        raise cause

    for _ in range(2000):
        with pytest.raises(DeviceLostError):
            read()
    sent = pickle.loads(pickle.dumps(picklable(cause)))
    assert type(sent) is DeviceLostError and "left the cluster" in str(sent)
