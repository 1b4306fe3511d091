"""The same runtime with one worker process per host: real comms between hosts."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.affinity import can_pin, pin
from pathdask.bench.placement import hosts_on_own_cpus

from .conftest import SMALL, assert_clean


@pytest.fixture(scope="module")
def psystem():
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as s:
        yield s


@pw.function(in_specs=(P("data", "model"), P("model", None)), out_specs=P("data", None))
def layer(x, w):
    return pw.psum(x @ w, "model")


def test_program_across_processes(psystem):
    with psystem.client(name="proc") as client:
        mesh = client.mesh({"data": 2, "model": 2})
        rng = np.random.default_rng(3)
        x, w = rng.normal(size=(8, 4)), rng.normal(size=(4, 4))
        xa = client.put(x, mesh, P("data", None))
        wa = client.put(w, mesh, P(None, "model"))  # moved to P("model", None) by the program

        @pw.program
        def two_layers(x, w):
            return layer(layer(x, w), w)

        y = two_layers(xa, wa)
        np.testing.assert_allclose(y.result(), x @ w @ w)
        other = client.mesh({"r": 4}, island=1)
        z = pw.function(lambda b: b * 2, in_specs=P("r"), out_specs=P("r"))(y, mesh=other)
        np.testing.assert_allclose(z.result(), 2 * (x @ w @ w))
        # dask.compute's finalize runs in a worker process and gathers from the others
        np.testing.assert_allclose(dask.compute(z)[0], 2 * (x @ w @ w))
        stats = client.device_stats()
        assert stats["links"]["dcn"]["bytes"] > 0 and stats["links"]["same_host"]["bytes"] > 0
        assert {d["address"] for d in client.devices()} == set(psystem.cluster.scheduler_info["workers"])
        del xa, wa, y, z
    assert_clean(psystem)


def test_client_close_frees_everything(psystem):
    client = psystem.client(name="leaver")
    mesh = client.mesh({"x": 4})
    arrays = [client.put(np.ones((16, 16)), mesh, P("x")) for _ in range(5)]
    arrays[-1].result()
    assert any(s["bytes_in_use"] for s in psystem.device_stats()["devices"].values())
    client.close()  # without deleting the arrays first
    assert_clean(psystem)
    assert all(not d["slices"] for d in psystem.devices())


def _monitor_intervals(server) -> dict[str, float]:
    return {name: server.periodic_callbacks[name].callback_time
            for name in ("tick", "monitor", "memory_monitor") if name in server.periodic_callbacks}


def test_monitors_run_at_the_systems_intervals(psystem):
    """Dask's tick, system monitor and memory monitors run at ``pathdask.local-dask-intervals``
    in the scheduler, the nannies and the worker processes (Dask's: 20 ms, 500 ms, 100 ms)."""
    wanted = {name: dask.utils.parse_timedelta(v) * 1000
              for name, v in dask.config.get("pathdask.local-dask-intervals").items()}
    expect = {"tick": wanted["tick"], "monitor": wanted["system-monitor"]}
    assert _monitor_intervals(psystem.cluster.scheduler) == expect
    for nanny in psystem.cluster.workers.values():
        assert _monitor_intervals(nanny) == {**expect, "memory_monitor": wanted["memory-monitor"]}
    with psystem.client(name="intervals") as client:
        found = client.dask.run(lambda dask_worker: _monitor_intervals(dask_worker))
    assert len(found) == SMALL.num_hosts
    assert all(f == {**expect, "memory_monitor": wanted["memory-monitor"]} for f in found.values())


def test_hosts_in_processes_of_their_own_keep_pythons_switch_interval(psystem):
    """Worker processes take ``pathdask.worker.switch-interval`` (Python's own by default),
    not the scheduler's process's ``pathdask.switch-interval``."""
    import sys

    with psystem.client(name="switch") as client:
        found = client.dask.run(sys.getswitchinterval)
    assert len(found) == SMALL.num_hosts and all(v == pytest.approx(0.005) for v in found.values()), found


def test_bad_monitor_intervals_are_named_before_anything_starts():
    with dask.config.set({"pathdask.local-dask-intervals.tick": "soon"}), \
            pytest.raises(ValueError, match=r"local-dask-intervals\.tick must be a duration"):
        pw.LocalSystem(SMALL, processes=True, dashboard_address=None).start()
    with dask.config.set({"pathdask.local-dask-intervals.ticks": "1s"}), \
            pytest.raises(ValueError, match=r"has no \['ticks'\]"):
        pw.LocalSystem(SMALL, processes=True, dashboard_address=None).start()


def _memory_watch(dask_worker) -> tuple[int | None, bool]:
    return dask_worker.memory_manager.memory_limit, "memory_monitor" in dask_worker.periodic_callbacks


def test_hosts_in_one_process_have_no_dask_memory_limit(psystem):
    """Hosts sharing a process have no Dask memory limit: each would weigh the whole process
    against its share, then pause, and collect garbage on every tick of its memory monitor.
    A host in a process of its own keeps Dask's."""
    with psystem.client(name="memory") as client:
        own = client.dask.run(_memory_watch)
    assert own and all(limit and watched for limit, watched in own.values()), own
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system, \
            system.client(name="memory") as client:
        shared = client.dask.run(_memory_watch)
        assert shared and all(not limit and not watched for limit, watched in shared.values()), shared
        assert len(system.cluster.workers) == SMALL.num_hosts


def test_a_host_killed_before_the_scheduler_noticed_is_lost_not_unreachable():
    """A fetch whose host's transport refuses because the host was just killed, before the
    scheduler removed it (so the scheduler still names that transport), waits for the
    scheduler's word: ``DeviceLostError``, and the client goes on fetching over the hosts'
    sockets, instead of taking the host for one behind a firewall and fetching everything
    over Dask's comms (each fetch of a lost array then waited for the host check)."""
    from .test_fanout import _kill

    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        with system.client(name="killed") as client:
            mesh = client.mesh({"x": 4}, island=0)
            x = client.put(np.arange(4.0), mesh, P("x"))
            np.testing.assert_array_equal(x.result(timeout=30), np.arange(4.0))
            sockets = client._hosts._sockets
            assert sockets is not None
            victim = mesh.hosts[-1]
            transport = sockets.addresses[victim]
            sockets.close()  # no idle connection to find closed: the fetch connects anew
            sockets.closed = False
            _kill(system, client, victim)  # its transport refuses from now on
            sockets.lookup = lambda host: transport  # as the scheduler answers until it noticed
            with pytest.raises(pw.DeviceLostError, match="left the cluster"):
                x.result(timeout=30)
            assert client._hosts._sockets is sockets  # still the sockets: the host left, no firewall
            sockets.lookup = client._hosts.transport_of
            others = client.mesh({"x": 4}, island=1)
            y = client.put(np.arange(4.0), others, P("x"))
            np.testing.assert_array_equal(y.result(timeout=30), np.arange(4.0))
            assert all(sockets.idle[a] for a in others.hosts)
            del x, y


def _affinities() -> list[list[int]]:
    """The distinct CPU sets of this process's threads."""
    return [list(c) for c in sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})]


def _pin_all(cpus: list[int]) -> None:
    pin(lambda tid: set(cpus))


CAN_SPREAD = can_pin() and len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not CAN_SPREAD, reason="needs two CPUs and a platform that pins threads")
def test_the_bench_pins_each_host_process_to_a_cpu_of_its_own(psystem):
    """``bench dispatch`` pins every thread of each host's worker process, round robin over the
    CPUs; the hosts then run programs as before."""
    cpus = sorted(os.sched_getaffinity(0))
    with psystem.client(name="pinned") as client:
        hosts = sorted(client.dask.scheduler_info()["workers"])
        placed = hosts_on_own_cpus(client.dask, hosts)
        try:
            assert placed == {h: cpus[i % len(cpus)] for i, h in enumerate(hosts)}
            assert client.dask.run(_affinities) == {h: [[placed[h]]] for h in hosts}
            mesh = client.mesh({"x": 4}, island=0)
            y = pw.function(lambda b: pw.psum(b, "x"), in_specs=P("x"), out_specs=P("x"))(
                client.put(np.arange(4.0), mesh, P("x")))
            np.testing.assert_allclose(y.result(), [6.0] * 4)
            del y
        finally:
            client.dask.run(_pin_all, cpus)
    assert_clean(psystem)


@pytest.mark.skipif(not can_pin(), reason="reads each thread's CPUs, as a platform that pins threads shows them")
def test_hosts_in_this_process_are_not_pinned(system):
    """In threads mode the hosts share this process: pinning them would pin the controller too."""
    before = _affinities()
    with system.client(name="unpinned") as client:
        assert hosts_on_own_cpus(client.dask, sorted(client.dask.scheduler_info()["workers"])) is None
    assert _affinities() == before
