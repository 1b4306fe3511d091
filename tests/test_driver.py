"""One driver thread per host (``pathdask.driver``): waits yield, pokes wake, sends batch."""

import threading
import time

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.worker.driver import Driver, Waitable, current, sleep_until, yield_to_others

from .conftest import SMALL, assert_clean


def _drive(targets):
    """Run ``targets`` (each made from the driver) as one driver's devices; returns what it
    flushed, once every target ended."""
    flushed = []
    driver = Driver("test-driver", flushed.append)
    thread = driver.drive([t(driver) for t in targets])
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the driver hung"
    return flushed


def test_devices_wait_on_each_other_in_one_thread():
    """Two devices hand a token back and forth through a Waitable: each wait yields the
    thread to the other, so both finish on the one driver thread."""
    seen, threads = [], set()

    def device(me, rounds=50):
        def make(driver):
            cond = Waitable(driver)
            device.conds.append(cond)

            def run():
                threads.add(threading.get_ident())
                assert current() is driver
                for _ in range(rounds):
                    with cond:
                        while state["turn"] != me:
                            cond.wait()
                        seen.append(me)
                        state["turn"] = 1 - me
                    for c in device.conds:
                        with c:
                            c.notify_all()
            return run
        return make

    device.conds = []
    state = {"turn": 0}
    _drive([device(0), device(1)])
    assert seen == [0, 1] * 50
    assert len(threads) == 1


def test_a_notify_from_another_thread_wakes_a_parked_device():
    box = {}
    ready = threading.Event()

    def make(driver):
        cond = box["cond"] = Waitable(driver)

        def run():
            with cond:
                ready.set()
                while "value" not in box:
                    cond.wait()
        return run

    def poke():
        ready.wait(10)
        with box["cond"]:
            box["value"] = 1
            box["cond"].notify()

    t = threading.Thread(target=poke)
    t.start()
    _drive([make])
    t.join()
    assert box["value"] == 1


def test_devices_woken_together_end_their_waits_before_either_goes_on_to_compute():
    """Two devices wait on one collective's end; one notify wakes both. Each yields before its
    compute (as ``execute.run_op`` does before a kernel body): both end their waits first."""
    log, box = [], {}
    ready = [threading.Event(), threading.Event()]

    def device(me):
        def make(driver):
            cond = box.setdefault("cond", Waitable(driver))

            def run():
                with cond:
                    ready[me].set()
                    while "go" not in box:
                        cond.wait()
                log.append(("woke", me))
                yield_to_others()
                log.append(("computed", me))
            return run
        return make

    def go():
        for event in ready:
            assert event.wait(10)
        with box["cond"]:
            box["go"] = True
            box["cond"].notify_all()

    t = threading.Thread(target=go)
    t.start()
    _drive([device(0), device(1)])
    t.join()
    assert sorted(log[:2]) == [("woke", 0), ("woke", 1)] and sorted(log[2:]) == [("computed", 0), ("computed", 1)]
    yield_to_others()  # on a thread of its own: nothing to yield to


def test_a_timed_wait_and_a_sleep_end_on_time_while_the_other_device_runs():
    log = []

    def sleeper(driver):
        def run():
            sleep_until(time.perf_counter() + 0.05)
            log.append("slept")
            cond = Waitable(driver)
            with cond:
                assert cond.wait(0.02)  # nothing notifies: the deadline ends it
            log.append("waited")
        return run

    def worker(driver):
        def run():
            log.append("ran")
        return run

    _drive([sleeper, worker])
    assert log == ["ran", "slept", "waited"]


def test_sends_of_the_devices_of_one_host_go_together():
    """What the devices defer before they pause is flushed as one batch per peer."""
    def device(piece):
        def make(driver):
            def run():
                driver.defer({"peer": [piece]})
                driver.pause()
            return run
        return make

    assert _drive([device("a"), device("b")]) == [{"peer": ["a", "b"]}]


def test_a_failing_device_does_not_stop_the_others(caplog):
    done = []

    def bad(driver):
        def run():
            raise RuntimeError("boom")
        return run

    def good(driver):
        def run():
            driver.pause()
            done.append(True)
        return run

    _drive([bad, good])
    assert done == [True]
    assert "boom" in caplog.text


@pytest.mark.parametrize("driver", ["host", "device"])
def test_collectives_over_hosts_with_either_driver(driver):
    with dask.config.set({"pathdask.driver": driver}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name=driver) as client:
            mesh = client.mesh({"x": 4}, island=0)

            @pw.function(in_specs=P("x"), out_specs=P("x"))
            def step(b):
                return pw.pmean(b, "x") + b

            x = client.put(np.arange(4.0), mesh, P("x"))
            for _ in range(3):
                x = step(x)
            expect = np.arange(4.0)
            for _ in range(3):
                expect = expect.mean() + expect
            np.testing.assert_allclose(x.result(), expect)
            del x
        assert_clean(system)


def _fail_next_send(dask_worker):
    """The next pieces this host sends find their peer unreachable."""
    peers = dask_worker.plugins["pathdask"].peers
    real = peers.send

    def failing(addr, kind, *args):
        if kind != "xfer":
            return real(addr, kind, *args)
        peers.send = real
        raise pw.DeviceLostError(f"injected: host {addr} cannot be reached")

    peers.send = failing


def test_pieces_the_driver_cannot_send_fail_their_gang_and_the_host_goes_on():
    """The driver sends what its devices deferred after they moved on: a send that fails
    fails their gang with the send's error, and the host runs the next program."""
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name="unreachable") as client:
            mesh = client.mesh({"x": 2}, placement="spread")

            @pw.function(in_specs=P("x"), out_specs=P())
            def total(b):
                return pw.psum(b, "x")

            x = client.put(np.ones(2), mesh, P("x"))
            client.dask.run(_fail_next_send, workers=[mesh.devices[0].address])
            with pytest.raises(pw.DeviceLostError, match="injected: host .* cannot be reached"):
                total(x).result(timeout=30)
            np.testing.assert_array_equal(total(x).result(timeout=30), [2.0])
            del x
        assert_clean(system)


def test_a_bad_driver_setting_is_a_value_error():
    with dask.config.set({"pathdask.driver": "butler"}), \
            pytest.raises(ValueError, match="pathdask.driver must be one of 'host', 'device', got 'butler'"):
        pw.LocalSystem(pw.Topology(islands=1, hosts_per_island=1, devices_per_host=1),
                       processes=False, dashboard_address=None).start()
