"""Every slotted program reaches an end on every host: failed dispatch, missing plan, dead
client, delayed order messages. Faults are injected into the live plugins, gated on events."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.faults import fail_next_call, fail_next_dispatch
from pathdask.protocol import Dispatch, Order

from .conftest import SMALL, assert_clean

ENDS_WITHIN = 10.0  # seconds: the goal for every provoked stall


@pw.function(in_specs=P("x"), out_specs=P("x"))
def plus_sum(b):
    return b + pw.psum(b, "x")


@pytest.fixture(scope="module")
def fsystem():
    # stall warnings early, so the tests can wait on the event rather than on time
    with dask.config.set({"pathdask.stall-warning": "300ms"}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as s:
        yield s


def _two_host_mesh(client: pw.Client) -> Any:
    mesh = client.mesh({"x": 4}, island=0)
    assert len(mesh.hosts) == 2
    return mesh


def _on_worker(client: pw.Client, addr: str, fn: Any) -> Any:
    return client.dask.run(fn, workers=[addr])[addr]


class StallEvents:
    """Collects ``pathdask-stall`` events as they arrive at this client."""

    def __init__(self, client: pw.Client) -> None:
        self.seen = threading.Event()
        self.events: list[dict[str, Any]] = []
        client.dask.subscribe_topic("pathdask-stall", self._on_event)

    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        self.events.append(event[1])
        self.seen.set()


def test_dispatch_failing_on_one_host_ends_the_program_on_every_host(fsystem):
    with fsystem.client(name="victim") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        bad = mesh.devices[-1].address

        _on_worker(client, bad, fail_next_dispatch)
        start = time.monotonic()
        with pytest.raises(pw.DispatchError, match="injected fault: the dispatch on host .* failed"):
            plus_sum(x).result(timeout=30)  # the other host's devices were inside its psum
        assert time.monotonic() - start < ENDS_WITHIN
        # the devices moved on: the next program runs
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        del x
    assert_clean(fsystem)


def test_a_program_reading_one_whose_dispatch_failed_fails_with_its_cause(fsystem):
    """Its reader never reads the failed program's outputs pending: it fails with the same error."""
    with fsystem.client(name="reader") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        _on_worker(client, mesh.devices[0].address, fail_next_dispatch)
        y = plus_sum(x)
        z = plus_sum(y)
        for value in (y, z):
            with pytest.raises(pw.DispatchError, match="injected fault: the dispatch on host .* failed"):
                value.result(timeout=30)
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        del x, y, z
    assert_clean(fsystem)


def test_a_call_the_scheduler_cannot_create_ends_with_a_typed_error(fsystem):
    with fsystem.client(name="uncreated") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        client.dask.run_on_scheduler(fail_next_call)
        start = time.monotonic()
        y = plus_sum(x)
        with pytest.raises(pw.DispatchError, match="injected fault: the scheduler could not create"):
            y.result(timeout=30)
        assert time.monotonic() - start < ENDS_WITHIN
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        del x, y
    assert_clean(fsystem)


def test_a_missing_plan_fails_fast_with_a_typed_error(fsystem):
    with fsystem.client(name="forgetful") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))

        @pw.program
        def prog(x):
            return plus_sum(plus_sum(x))

        np.testing.assert_array_equal(prog(x).result(timeout=30), np.full(4, 25.0))
        _on_worker(client, mesh.devices[0].address,
                   lambda dask_worker: dask_worker.plugins["pathdask"].plans._plans.clear())
        start = time.monotonic()
        with pytest.raises(pw.PlanMissingError, match="has no plan .* worker restarted"):
            prog(x).result(timeout=30)
        assert time.monotonic() - start < ENDS_WITHIN
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        del x
    assert_clean(fsystem)


def _hold_dispatch(client: pw.Client, addr: str) -> None:
    """The next call that reaches ``addr`` waits there until ``_release_dispatch``."""

    def hold(dask_worker: Any) -> None:
        rt = dask_worker.plugins["pathdask"]
        real, held = rt.handlers[Dispatch], []

        def holding(msg: Dispatch) -> None:
            rt.handlers[Dispatch] = real
            held.append(msg)

        rt.test_release = lambda: [real(msg) for msg in held]
        rt.handlers[Dispatch] = holding

    _on_worker(client, addr, hold)


def _release_dispatch(client: pw.Client, addr: str) -> None:
    _on_worker(client, addr, lambda dask_worker: dask_worker.plugins["pathdask"].test_release())


def test_a_client_closed_between_slotting_and_dispatch_leaves_nothing_waiting(fsystem):
    watcher = fsystem.client(name="watcher")
    stalls = StallEvents(watcher)
    leaver = fsystem.client(name="leaver")
    mesh = _two_host_mesh(leaver)
    x = leaver.put(np.ones(4), mesh, P("x"))
    x.result(timeout=30)
    late = mesh.devices[-1].address
    _hold_dispatch(leaver, late)
    y = plus_sum(x)  # slotted; one host dispatched it, the other holds its dispatch
    assert stalls.seen.wait(ENDS_WITHIN), "no device reported waiting"
    assert {e["state"] for e in stalls.events} <= {"pieces", "dispatch"}
    assert any(e["program"] == y._pid for e in stalls.events)
    start = time.monotonic()
    leaver.close()
    assert_clean(fsystem)  # every host ended the program; no buffer is left
    assert time.monotonic() - start < ENDS_WITHIN
    _release_dispatch(watcher, late)  # the late dispatch is refused: its client is gone
    mesh2 = _two_host_mesh(watcher)
    z = watcher.put(np.ones(4), mesh2, P("x"))
    np.testing.assert_array_equal(plus_sum(z).result(timeout=30), np.full(4, 5.0))
    del z
    watcher.close()
    assert_clean(fsystem)


def test_a_delayed_order_message_only_delays_and_a_timeout_says_what_waits(fsystem):
    with fsystem.client(name="patient") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))
        x.result(timeout=30)
        slow = mesh.devices[-1].address

        def hold_orders(dask_scheduler: Any, addr: str = slow) -> None:
            plugin = dask_scheduler.plugins["pathdask"]
            real, real_ahead, held = plugin.tell, plugin.tell_ahead, []

            def holds(to: str, msg: Any) -> bool:
                if to == addr and isinstance(msg, Order) and plugin.test_holding:
                    held.append(msg)
                    return True
                return False

            def tell(to: str, msg: Any, now: bool = True) -> bool:
                return holds(to, msg) or real(to, msg, now)

            def tell_ahead(to: str, msgs: list[Any]) -> bool:
                return real_ahead(to, [m for m in msgs if not holds(to, m)])

            def release() -> None:
                plugin.test_holding = False
                for msg in held:
                    real(addr, msg)

            plugin.test_holding, plugin.tell, plugin.tell_ahead = True, tell, tell_ahead
            plugin.test_release = release

        client.dask.run_on_scheduler(hold_orders)
        y = plus_sum(x)
        with pytest.raises(TimeoutError, match=r"not ready within 1s.*waiting for pieces from devices"):
            y.result(timeout=1)
        assert "waiting for pieces" in str(fsystem.diagnose())
        client.dask.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["pathdask"].test_release())
        np.testing.assert_array_equal(y.result(timeout=30), np.full(4, 5.0))
        client.dask.run_on_scheduler(lambda dask_scheduler: [delattr(dask_scheduler.plugins["pathdask"], name)
                                                             for name in ("tell", "tell_ahead")])
        del x, y
    assert_clean(fsystem)


def _doomed_client(address: str, started: Any) -> None:
    """A client in its own process that keeps long programs in flight until it is killed."""
    client = pw.connect(address, name="doomed")
    mesh = client.mesh({"x": 4}, island=0)
    slow = pw.function(lambda b: b + pw.psum(b, "x"), in_specs=P("x"), out_specs=P("x"), cost=0.2)
    x = client.put(np.ones(4), mesh, P("x"))
    inflight = [slow(x) for _ in range(8)]
    started.set()
    for y in inflight:
        y.result(timeout=60)


@pytest.mark.slow
def test_a_killed_client_process_leaves_nothing_waiting(fsystem):
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_doomed_client, args=(fsystem.scheduler_address, started), daemon=True)
    proc.start()
    try:
        assert started.wait(60), "the client process did not start"
        os.kill(proc.pid, signal.SIGKILL)  # a process we started, by its PID
        start = time.monotonic()
        assert_clean(fsystem)
        assert time.monotonic() - start < ENDS_WITHIN
    finally:
        proc.join(10)
    with fsystem.client(name="after") as client:
        mesh = _two_host_mesh(client)
        x = client.put(np.ones(4), mesh, P("x"))
        np.testing.assert_array_equal(plus_sum(x).result(timeout=30), np.full(4, 5.0))
        del x
    assert_clean(fsystem)


def test_diagnose_names_each_device(fsystem):
    diagnosis = fsystem.diagnose()
    assert sorted(diagnosis.devices) == list(range(SMALL.num_devices))
    assert all(s["state"] == "idle" for s in diagnosis.devices.values())
    assert "device 0 (island 0 host 0): idle" in str(diagnosis)


def test_doctor_prints_every_device(fsystem):
    from click.testing import CliRunner

    from pathdask.cli import main

    result = CliRunner().invoke(main, ["doctor", fsystem.scheduler_address])
    assert result.exit_code == 0, result.output
    assert "device 7 (island 1 host 1): idle" in result.output and "clients:" in result.output
    unreachable = CliRunner().invoke(main, ["doctor", "tcp://127.0.0.1:1", "--timeout", "1s"])
    assert unreachable.exit_code != 0 and "cannot reach the scheduler" in unreachable.output
