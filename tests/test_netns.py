"""Across machines: the dask-CLI recipe in network namespaces, one per machine, on a bridge.

Each test starts a :class:`~pathdask.netns.NetnsSystem` (needs root and
iproute2; skipped with the reason where they are missing, and failed instead
when ``PATHDASK_REQUIRE_NETNS=1``, as in CI). Links with a delay use the
kernel's ``netem``, or where it is missing a user-space delay line (needs
``/dev/net/tun``; skipped or failed the same way without it).
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.demo import RTOL, load_graph
from pathdask.netns import NetnsSystem, Shape

from .netns_support import require_delay, require_namespaces
from .silence import until, wait_out

ROOT = Path(__file__).resolve().parent.parent
TWO_ISLANDS = pw.Topology(islands=2, hosts_per_island=1, devices_per_host=2, hbm=256 * 2**20)
TIMEOUT = 6.0


@pytest.fixture(autouse=True)
def _namespaces_possible():
    require_namespaces()


def _first_program() -> dict:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(import numpy as np\n.*?)\ndef main", readme, re.S)
    assert found, "the README has no first program"
    names: dict = {"__name__": "first_program"}
    exec(compile(found.group(1), "README.md", "exec"), names)  # its functions, not its LocalSystem
    return names


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_first_program_and_demo_training_across_machines(tls):
    first = _first_program()
    with NetnsSystem(pw.Topology.load("local"), tls=tls) as system:
        assert system.address.startswith(("tls" if tls else "tcp") + "://198.18.")
        with system.client(name="alice") as client:
            assert len({d["address"].rsplit(":", 1)[0] for d in client.devices()}) == 4  # four machines
            mesh = client.mesh({"data": 2, "model": 2})
            x = client.put(np.ones((8, 4)), mesh, P("data", "model"))
            w = client.put(np.eye(4), mesh, P("model", None))
            np.testing.assert_array_equal(first["step"](x, w).result(timeout=60), np.ones((8, 4)))
            assert sum(v["bytes"] for v in system.device_stats()["links"].values()) > 0
            mlp = load_graph("mlp")
            train, held_out = client.mesh(mlp.MESH_SHAPE, island=0), client.mesh(mlp.MESH_SHAPE, island=1)
            result = mlp.train(client, 3, mesh=train, eval_mesh=held_out, seed=0)
            assert result["rel_diff"] <= RTOL, result["rel_diff"]
            del x, w
        idle = system.wait_idle(timeout="15s")
        assert all(s["bytes_in_use"] == 0 for s in idle["devices"].values())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_cross_island_move_crosses_a_shaped_link_and_the_stats_match_it():
    require_delay()
    rate = 1e9  # and 1 ms one way: netem, or a delay line (perhaps slower than the rate: that passes)
    with NetnsSystem(TWO_ISLANDS, shape=Shape(delay=1e-3, rate=rate)) as system:
        with system.client(name="mover") as client:
            src, dst = client.mesh({"x": 2}, island=0), client.mesh({"x": 2}, island=1)
            data = np.arange(4 * 2**20, dtype=np.float64).reshape(2, -1)  # 32 MiB
            x = client.put(data, src, P("x"))
            x.result(timeout=60)
            client.reset_observations()
            before = {h: system.link_bytes(h) for h in (0, 1)}
            start = time.monotonic()
            y = x.to(dst, P("x"))
            stats = client.device_stats()

            def nic(stats, host, side):
                return stats["nics"].get(host, {}).get(side, {}).get("bytes", 0)

            while nic(stats, "1/0", "recv") < data.nbytes or nic(stats, "0/0", "send") < data.nbytes:
                assert time.monotonic() - start < 60, stats["nics"]
                time.sleep(0.05)
                stats = client.device_stats()
            took = time.monotonic() - start
            after = {h: system.link_bytes(h) for h in (0, 1)}
            np.testing.assert_array_equal(y.result(timeout=60), data)
            nics = stats["nics"]
            assert nics["0/0"]["send"]["bytes"] == data.nbytes, nics
            assert nics["1/0"]["recv"]["bytes"] == data.nbytes, nics
            assert stats["links"]["dcn"]["bytes"] == data.nbytes, stats["links"]
            # the kernel saw those bytes cross the two machines' links, plus headers and control
            for host, side in ((0, "sent"), (1, "recv")):
                moved = after[host][side] - before[host][side]
                assert data.nbytes <= moved <= data.nbytes * 1.05 + 2**20, (host, side, moved)
            assert took >= 0.9 * data.nbytes * 8 / rate, took  # no faster than the link's rate
            del x, y


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_stress_round_across_machines_has_no_hangs():
    from pathdask.bench import stress

    cfg = stress.Config(runs=1, min_clients=2, max_clients=2, programs_per_client=6, max_depth=4,
                        chaos=False, process_clients=0.0)
    plan = stress.plan_run(cfg, 0, [0])

    def netns(plan):
        env = {"DASK_PATHDASK__POLICY": plan.policy}
        return NetnsSystem(stress.topology(), env=env).start()

    r = stress.run_once(cfg, plan, 0, make_system=netns)
    assert not r["hang"], (r["hang_reason"], r["diagnosis"])
    assert not r["wrong"], r["wrong"]
    assert r["bytes_left"] == 0 and r["leftover_error"] is None
    assert r["programs_checked"] > 0


@pytest.fixture
def partitionable():
    system = NetnsSystem(TWO_ISLANDS, env={"DASK_PATHDASK__HOST_TIMEOUT": f"{TIMEOUT:g}s"})
    with system:
        yield system


@pw.function(in_specs=P("x"), out_specs=P("x"), cost=0.01)
def step(b):
    return pw.pmean(b, "x") + 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_partitioned_host_is_lost_within_the_timeout_and_rejoins_when_healed(partitionable):
    system = partitionable
    with system.client(name="partition") as client:
        m0, m1 = client.mesh({"x": 2}, island=0), client.mesh({"x": 2}, island=1)
        x0, x1 = client.put(np.zeros(2), m0, P("x")), client.put(np.zeros(2), m1, P("x"))
        np.testing.assert_array_equal(step(x0).result(timeout=30), np.ones(2))
        victim = m0.devices[0].address
        system.partition(0)
        out = wait_out(system, step, x0, x1, victim, TIMEOUT)
        assert isinstance(out.error, pw.DeviceLostError), out.error
        assert re.search(r"silent for \d+\.\ds, past pathdask.host-timeout|left the", str(out.error)), out.error
        assert out.took < TIMEOUT + 3, out.took
        assert out.slowest < 1.0, out.slowest
        assert out.silent is not None and victim in out.silent, out.silent
        y = out.last
        last = y.result(timeout=10)
        assert last[0] == last[1] >= 1.0, last
        # the link heals: the host, alive all along, restarts its worker and rejoins as host 0
        system.heal(0)
        until(lambda: len(client.devices()) >= TWO_ISLANDS.num_devices, 90, "the healed host's rejoin",
              system.logs)
        again = client.mesh({"x": 2}, island=0)
        assert {d.id for d in again.devices} == {0, 1}
        x = client.put(np.zeros(2), again, P("x"))
        np.testing.assert_array_equal(step(x).result(timeout=30), np.ones(2))
        del x, x0, x1, y


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_host_is_not_lost_and_the_order_holds():
    require_delay()
    one_island = pw.Topology(islands=1, hosts_per_island=2, devices_per_host=1)
    slow = {"host0": Shape(delay=0.05)}  # 50 ms from host 0 to any other machine: netem or a delay line
    with NetnsSystem(one_island, shapes=slow, env={"DASK_PATHDASK__HOST_TIMEOUT": f"{TIMEOUT:g}s"}) as system:
        with system.client(name="slow") as client:
            mesh = client.mesh({"x": 2})
            y, n, start = client.put(np.zeros(2), mesh, P("x")), 0, time.monotonic()
            while time.monotonic() - start < 2 * TIMEOUT:  # past the timeout: never declared lost
                ys = [y := step(y) for _ in range(5)]  # five programs in flight, in one order
                n += len(ys)
                np.testing.assert_array_equal(y.result(timeout=60), np.full(2, float(n)))
            assert len(client.devices()) == one_island.num_devices
            assert not system.diagnose().silent
            # the delay was real: a TCP connect from the switch waits for host 0's SYN-ACK, 50 ms late
            workers = {d["address"] for d in client.devices()}
            connects = {h: _connect_time(next(a for a in workers if f"//{system.ip_of(f'host{h}')}:" in a))
                        for h in (0, 1)}
            assert connects[0] >= 0.05 > connects[1], connects


def _connect_time(address: str) -> float:
    """Median seconds of five TCP connects to ``tcp://ip:port``."""
    ip, port = address.removeprefix("tcp://").rsplit(":", 1)
    times = []
    for _ in range(5):
        start = time.monotonic()
        socket.create_connection((ip, int(port)), timeout=10).close()
        times.append(time.monotonic() - start)
    return sorted(times)[2]
