"""Fan-out trees on real LocalClusters: a program on many hosts reaches them through a tree of
relays, its endings come back as one, its outputs are one key each, and a relay killed
mid-run fails exactly the programs that use it, on every host, stranding nothing."""

from __future__ import annotations

import os
import signal
from typing import Any

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.topology import Topology

from .conftest import UNBATCHED, assert_clean

#: one island of six hosts, one device each: a tree of degree 2 has depth 2
SIX = Topology(islands=1, hosts_per_island=6, devices_per_host=1)
TREE = {"pathdask.fanout.threshold": 2, "pathdask.fanout.degree": 2}


def _step() -> pw.Function:
    return pw.function(lambda b: b + pw.psum(b, "x"), in_specs=P("x"), out_specs=P("x"))


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_a_program_on_many_hosts_goes_down_a_tree_and_ends_once(processes):
    # each call its own program: twelve go down the tree
    with dask.config.set({**TREE, **UNBATCHED}), pw.LocalSystem(SIX, processes=processes, dashboard_address=None) as system:
        with system.client(name="tree") as client:
            mesh = client.mesh({"x": 6})
            step = _step()
            x = client.put(np.arange(6.0), mesh, P("x"))
            before = client.device_stats()["scheduler"]
            y, expected = x, np.arange(6.0)
            for _ in range(12):  # chained: each reads the one before, whose key goes meanwhile
                y = step(y)
                expected = expected + expected.sum()
            np.testing.assert_allclose(y.result(timeout=60), expected)
            stats = client.device_stats()["scheduler"]
            assert stats["fanned"] - before["fanned"] == 12
            assert len(y.__dask_keys__()) == 1  # one key for the output, whatever the hosts
            # below the threshold, calls go to each host directly
            small = client.mesh({"x": 2})
            z = client.put(np.ones(2), small, P("x"))
            np.testing.assert_allclose(step(z).result(timeout=60), [3.0, 3.0])
            assert client.device_stats()["scheduler"]["fanned"] == stats["fanned"]
            del x, y, z
        assert_clean(system)


def test_a_replicated_output_survives_the_loss_of_the_host_holding_its_key():
    """Elastic recovery reads surviving copies: the key's owner is lost, the other hosts keep
    their shards until the client lets go of the array, then free them."""
    with dask.config.set(TREE), pw.LocalSystem(SIX, processes=True, dashboard_address=None) as system:
        with system.client(name="owner") as client:
            mesh = client.mesh({"x": 6})
            x = client.put(np.arange(4.0), mesh, P())  # replicated on all six hosts
            # a collective that reads it on every device: every copy exists once it returns
            total = pw.function(lambda b: pw.psum(b, "x"), in_specs=P(), out_specs=P())(x)
            np.testing.assert_allclose(total.result(timeout=60), 6 * np.arange(4.0))
            (owner,) = x._futures  # the host holding the output's one key
            _kill(system, client, owner)
            survivors = client.mesh({"x": 4})
            (again,) = client.recover({"x": x}, survivors).values()
            np.testing.assert_allclose(again.result(timeout=60), np.arange(4.0))
            del x, again, total
        assert_clean(system)


def test_a_relay_killed_mid_run_fails_its_programs_everywhere_and_strands_no_other():
    """Kill the first host of a tree (the relay every record goes through) while programs run
    on it: they fail with DeviceLostError on every host; programs on the other hosts (through
    their own trees) keep running and give right results; nothing is left behind."""
    with dask.config.set({**TREE, "pathdask.host-timeout": "3s"}), \
            pw.LocalSystem(SIX, processes=True, dashboard_address=None) as system:
        with system.client(name="relay") as client:
            big = client.mesh({"x": 6})
            relay = big.devices[0].address
            step = _step()
            x = client.put(np.ones(6), big, P("x"))
            running = [step(x) for _ in range(20)]
            _kill(system, client, relay, wait=False)
            outcomes = []
            for r in running:
                try:
                    outcomes.append(r.result(timeout=60))
                except pw.DeviceLostError:
                    outcomes.append("lost")
            assert "lost" in outcomes
            for value in outcomes:
                if not isinstance(value, str):
                    np.testing.assert_allclose(value, np.full(6, 7.0))
            # the other hosts go on, with trees that hold no lost host
            survivors = client.mesh({"x": 4})
            z = client.put(np.ones(4), survivors, P("x"))
            np.testing.assert_allclose(step(step(z)).result(timeout=60), np.full(4, 25.0))
            del x, z, running
        assert_clean(system)


def _kill(system: pw.LocalSystem, client: pw.Client, host: str, wait: bool = True) -> None:
    """SIGKILL host ``host``'s worker process; ``wait``: until the scheduler removed it."""
    pid = client.dask.run(os.getpid, workers=[host])[host]
    os.kill(pid, signal.SIGKILL)
    if wait:
        admin = system._admin
        assert admin is not None
        admin.sync(admin.scheduler.pathdask_wait_host_gone, address=host, callback_timeout=30)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("degree", [1, 2, 4])
def test_a_tree_reaches_every_host_once_each_host_forwarding_to_at_most_degree(n, degree):
    from pathdask.core.fanout import shares

    reached, depth = [], 0

    def walk(start: int, stop: int, level: int) -> None:
        nonlocal depth
        reached.append(start)
        depth = max(depth, level)
        children = [(start + a, start + b) for a, b in shares(stop - start, degree)]
        assert len(children) <= degree
        for a, b in children:
            walk(a, b, level + 1)

    walk(0, n, 0)
    assert sorted(reached) == list(range(n))
    if degree > 1:  # about log_degree(n) hops
        assert depth <= int(np.ceil(np.log(n) / np.log(degree))) + 1


def test_a_tree_call_is_one_record_naming_each_host_once():
    """A call down a tree costs the scheduler one record, whatever its hosts: the call and its
    order together, each host named once, one plan id, the devices taken from that plan on each
    host, and one ``prev`` while calls stay on one mesh. A call on some of those hosts in
    between gives each host its own ``prev`` once; the relays hand each child its share."""
    from pathdask.core.host import Enqueue, HostCore, Register, Relay, Wake
    from pathdask.core.island import SchedulerCore, Send
    from pathdask.ops import GangSpec, HostPlan, KernelOp, OutSpec
    from pathdask.protocol import Fan
    from pathdask.topology import DeviceId, DeviceInfo

    from .test_invariant import NoAborts

    hosts = [f"h{i}" for i in range(9)]
    core = SchedulerCore(threshold=2, degree=4)
    for h in hosts:
        core.host_joined(h, None)
    core.client_joined("c", 1.0)

    def call(pid: str, on: list[str]) -> list[Fan]:
        out = core.take_call("c", {
            "pid": pid, "hosts": on, "plan": f"plan-{pid}", "owned": [(len(on) - 1, [(f"{pid}-out", 0)])],
            "outputs": [(f"{pid}-out", 0, on[-1])], "inputs": [],
            "program": {"pid": pid, "hosts": {h: [hosts.index(h)] for h in on}, "cost": 1.0}})
        return [i.msg for i in out if isinstance(i, Send) and isinstance(i.msg, Fan)]

    [first] = call("p1", hosts)
    assert first.hosts == hosts and first.call == ("c", "p1", [], "plan-p1", [(8, [("p1-out", 0)])])
    assert first.order == ("p1", "c", 0, None, -1)  # devices: the plan's; prev: one for all
    [second] = call("p2", hosts)
    assert second.order == ("p2", "c", 1, None, 0)
    assert call("p3", hosts[:2]) == []  # on 2 hosts: a record to each, directly
    [fourth] = call("p4", hosts)
    assert fourth.order[4] == [2, 2, 1, 1, 1, 1, 1, 1, 1]  # each host's own, once
    [fifth] = call("p5", hosts)
    assert fifth.order[4] == 3

    # the first host takes its part, with its devices from the plan it holds, and relays
    # each child its share: the output key owned by the last host, counted from the child
    root = HostCore("h0", [0], NoAborts())
    gang = GangSpec(0, "g", tuple(DeviceInfo(DeviceId(i), 0, i, 0, h) for i, h in enumerate(hosts)))
    root.add_plans("c", [HostPlan("p", {0: gang}, {0: (KernelOp(0, 0, (), (OutSpec(1, (1,), "f8"),)),)}, {},
                                  "plan-p1")])
    took = root.fan(first)
    assert Enqueue(0, "p1") in took  # its device, from the plan
    # its order first, as a direct call's records come: the call's registration then finds its
    # place taken, and its device, woken, may run it at once (the runtime hands it the GIL)
    [register] = [i for i in took if isinstance(i, Register)]
    assert took.index(Enqueue(0, "p1")) < took.index(register)
    assert root.register(register.prog, register.enqueue) == [Wake((0,), True)]
    relayed = [i for i in took if isinstance(i, Relay)]
    assert [r.host for r in relayed] == ["h1", "h3", "h5", "h7"]
    last = relayed[-1].msg
    assert last.hosts == ["h7", "h8"] and last.call[4] == [(1, [("p1-out", 0)])] and last.order == first.order
    assert all(r.msg.call[4] == [] for r in relayed[:-1])
    assert root.last_slot == 0 and root.endings.waiting["p1"][1] == 1 + len(relayed)


def test_the_calls_of_a_plan_share_its_hosts_and_are_checked_again_once_a_host_left():
    """Every call of one plan names the same hosts: the scheduler keeps them once (its mesh),
    so that nothing it does per call grows with the hosts. Its trees' records carry the one
    list; its hosts are checked live once per change of the cluster's hosts, so a call made
    after one of them left (or while Dask removes it) fails (``DeviceLostError``), as the
    first call on it would."""
    from pathdask.core.island import SchedulerCore, Send
    from pathdask.errors import DeviceLostError
    from pathdask.protocol import Fan

    hosts = [f"h{i}" for i in range(9)]
    core = SchedulerCore(threshold=2, degree=4)
    for h in hosts:
        core.host_joined(h, None)
    core.client_joined("c", 1.0)

    def call(pid: str) -> dict:
        return {"pid": pid, "hosts": list(hosts), "plan": "plan-m", "owned": [(0, [(f"{pid}-out", 0)])],
                "outputs": [(f"{pid}-out", 0, hosts[0])], "inputs": [],
                "program": {"pid": pid, "hosts": {h: [i] for i, h in enumerate(hosts)}, "cost": 1.0}}

    fans = []
    for pid in ("p1", "p2"):
        c = call(pid)
        mesh = core.check_call(c, set(hosts))
        fans += [i.msg for i in core.take_call("c", c) if isinstance(i, Send) and isinstance(i.msg, Fan)]
    assert len(core.meshes) == 1 and mesh.live_at == core.epoch
    assert fans[0].hosts == hosts and fans[0].hosts is fans[1].hosts is mesh.order
    assert fans[1].order[4] == 0  # the run of programs on the mesh's hosts: one prev for all
    assert core.check_call(call("p3"), set()) is mesh  # live at this epoch: not looked at again
    core.host_lost("h4", "gone")
    with pytest.raises(DeviceLostError, match=r"\['h4'\] left the cluster before program p4"):
        core.check_call(call("p4"), set(hosts) - {"h4"})
    core.host_joined("h4", None)
    assert core.check_call(call("p5"), set(hosts)) is mesh and mesh.live_at == core.epoch
    core.host_leaving()  # Dask removes a retiring host before it leaves the order
    with pytest.raises(DeviceLostError, match=r"\['h8'\] left the cluster before program p6"):
        core.check_call(call("p6"), set(hosts) - {"h8"})


def test_a_program_reading_one_dropped_before_its_slot_is_dropped_too_as_it_comes():
    """A call whose producer's dispatch failed while it waited for a slot is not slotted: its
    order, down its tree, could reach a host before the producer's drop did, and its devices
    would read the producer's buffers pending. It is dropped on its hosts with the producer's
    cause, as its devices would have read it."""
    from pathdask.core.island import SchedulerCore, Send
    from pathdask.errors import DispatchError
    from pathdask.protocol import DropPrograms, Fan

    hosts = ["h0", "h1", "h2"]
    core = SchedulerCore("proportional", threshold=1, degree=4)
    for h in hosts:
        core.host_joined(h, None)
    core.client_joined("c", 1.0)

    def call(pid: str, on: list[str], inputs: list[Any]) -> list[Any]:
        return core.take_call("c", {
            "pid": pid, "hosts": on, "plan": f"plan-{pid}", "owned": [], "outputs": [], "inputs": inputs,
            "program": {"pid": pid, "hosts": {h: [hosts.index(h)] for h in on}, "cost": 1.0}})

    for i in range(2):  # the window is full: the next ones wait for a slot
        call(f"a{i}", hosts, [])
    call("p", hosts, [])
    assert "p" in core.order.waiting
    cause = DispatchError("injected")
    dropped = core.dispatch_failed("h1", "p", "DispatchError: injected", cause)
    assert {(i.host, tuple(i.msg.pids)) for i in dropped if isinstance(i, Send)} == {(h, ("p",)) for h in hosts}
    out = call("r", hosts[::-1], [["p", 0]])  # another tree: its root is another host
    assert not any(isinstance(i, Send) and isinstance(i.msg, Fan) and i.msg.order for i in out)
    drops = [i for i in out if isinstance(i, Send) and isinstance(i.msg, DropPrograms)]
    assert sorted(i.host for i in drops) == hosts
    assert all(i.msg.pids == ["r"] and i.msg.cause is cause and "program p" in i.msg.reason for i in drops)
    assert "r" not in core.order.waiting and "r" not in core.order.inflight and not core.readers
