"""Asynchronous checkpoints: ``client.checkpoint`` returns at once, the devices run on while the
hosts write, and the buffers being written stay alive until written."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.worker import storage

from .conftest import assert_clean

step = pw.function(lambda b: b * 2.0 + 1.0, in_specs=P("d"), out_specs=P("d"))


@pytest.fixture
def gate(monkeypatch):
    """Hosts' chunk writes wait until ``gate.set()``; ``gate.entered`` is set by the first."""
    opened, entered = threading.Event(), threading.Event()
    store = storage._store

    def gated(*chunk):
        entered.set()
        assert opened.wait(30), "the test never opened the gate"
        return store(*chunk)

    monkeypatch.setattr(storage, "_store", gated)
    opened.entered = entered
    yield opened
    opened.set()


def test_devices_run_the_next_programs_while_the_hosts_write(system, client, tmp_path, gate):
    mesh = client.mesh({"d": 4})
    w0 = np.arange(16.0).reshape(8, 2)
    w = client.put(w0, mesh, P("d"))
    saved = client.checkpoint(tmp_path / "w.zarr", {"w": w})
    assert gate.entered.wait(30)  # the hosts are writing, and cannot finish
    w = step(step(w))  # the loop moves on: the array being written is dropped here
    np.testing.assert_array_equal(w.result(timeout=30), (w0 * 2 + 1) * 2 + 1)
    assert not saved.done() and "pending" in repr(saved)
    assert not os.path.lexists(tmp_path / "w.zarr")
    gate.set()
    assert saved.result(timeout=30) == ["w"] and "committed" in repr(saved)
    np.testing.assert_array_equal(client.resume(tmp_path / "w.zarr")["w"].result(), w0)  # as it was
    del w
    assert_clean(system)


def test_a_deleted_array_is_freed_once_written(system, client, tmp_path, gate):
    w = client.put(np.ones((4, 2)), client.mesh({"d": 2}), P("d"))
    w.result()
    saved = client.checkpoint(tmp_path / "w.zarr", {"w": w})
    assert gate.entered.wait(30)
    w.delete()
    assert sum(s["bytes_in_use"] for s in system.device_stats()["devices"].values()) == 64  # still held
    gate.set()
    saved.result(timeout=30)
    assert_clean(system)  # and freed after
    np.testing.assert_array_equal(client.resume(tmp_path / "w.zarr")["w"].result(), np.ones((4, 2)))


def test_checkpoints_to_one_path_commit_in_the_order_asked(client, tmp_path, gate):
    mesh = client.mesh({"d": 2})
    path = tmp_path / "w.zarr"
    futures = [client.checkpoint(path, {"w": client.put(np.full(4, float(i)), mesh, P("d"))}) for i in (1, 2, 3)]
    assert not any(f.done() for f in futures)
    ended = []
    for f in futures:
        f.add_done_callback(ended.append)
    gate.set()
    assert [f.result(timeout=30) for f in futures] == [["w"]] * 3
    assert ended == futures
    np.testing.assert_array_equal(client.resume(path)["w"].result(), np.full(4, 3.0))


def test_a_failed_array_fails_its_checkpoint_and_commits_nothing(client, tmp_path):
    mesh = client.mesh({"d": 2})
    path = tmp_path / "w.zarr"
    client.checkpoint(path, {"w": client.put(np.ones(4), mesh, P("d"))}).result()

    @pw.function(in_specs=P("d"), out_specs=P("d"))
    def boom(b):
        if pw.axis_index("d") == 1 and b.sum() > -1:  # on a device, not while shapes are inferred
            raise ZeroDivisionError("bad step")
        return b

    saved = client.checkpoint(path, {"w": boom(client.put(np.ones(4), mesh, P("d")))})
    with pytest.raises(ZeroDivisionError, match="bad step"):
        saved.result(timeout=30)
    assert isinstance(saved.exception(), ZeroDivisionError) and "error" in repr(saved)
    np.testing.assert_array_equal(client.resume(path)["w"].result(), np.ones(4))


def test_a_checkpoint_can_be_awaited_and_waited_for_with_a_timeout(client, tmp_path, gate):
    saved = client.checkpoint(tmp_path / "w.zarr", {"w": client.put(np.ones(4), client.mesh({"d": 2}), P("d"))})
    with pytest.raises(TimeoutError, match="not committed after 0.1 s"):
        saved.result(timeout="100ms")
    gate.set()

    async def wait():
        return await saved

    assert asyncio.run(wait()) == ["w"]


def test_close_waits_for_the_checkpoints_in_flight(system, tmp_path, gate):
    client = system.client(name="closing")
    saved = client.checkpoint(tmp_path / "w.zarr", {"w": client.put(np.ones(4), client.mesh({"d": 2}), P("d"))})
    assert gate.entered.wait(30)
    threading.Timer(0.2, gate.set).start()  # closing must wait for the write, however long it takes
    client.close()
    assert saved.done() and saved.result() == ["w"]
    assert_clean(system)
