"""pathdask.simulate: the fan-out tree (``pathdask.fanout``) a call's records go down and its endings up,
as the runtime builds it."""

from __future__ import annotations

import json
from typing import Any

import dask.config
import numpy as np
import pytest

import pathdask as pw
from pathdask import P, function
from pathdask.core.fanout import DEFAULT_DEGREE, DEFAULT_THRESHOLD
from pathdask.core.host import HostCore, Relay, Tell
from pathdask.core.island import SchedulerCore
from pathdask.protocol import Fan, Released, SubtreeDone
from pathdask.simulate import (
    AbstractArray,
    ClientScript,
    CostModel,
    Fanout,
    Simulation,
    abstract_mesh,
    simulate,
)
from pathdask.simulate.clock import Hosts
from pathdask.simulate.fanout import Route, route, tree
from pathdask.simulate.model import DEFAULT, RELAY_DONE_SHARE
from pathdask.simulate.workloads import traced

ZERO = ("client_call_s", "client_host_s", "scheduler_call_s", "scheduler_host_s", "host_dispatch_s", "host_op_s",
        "device_op_s", "exchange_s", "exchange_host_s", "message_s", "result_s", "mc_call_s", "mc_op_s",
        "scheduler_tree_s", "relay_forward_s", "relay_done_s", "relay_root_s")


def _costs(**given: float) -> CostModel:
    """Every control cost 0 but those ``given``."""
    return CostModel(**{**dict.fromkeys(ZERO, 0.0), **given})


def _program(topo: pw.Topology, hosts: int, first: int = 0) -> Any:
    """A one-gang program of 1 ms on ``hosts`` hosts of ``topo`` (one device each) from host ``first``."""
    mesh = abstract_mesh(topo, {"x": hosts}, ids=list(range(first, first + hosts)))
    g = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=1e-3, name="g")
    return traced(lambda x: g(x), topo, AbstractArray((hosts,), "f8", mesh, P("x")), name=f"p{hosts}@{first}")


def _island(hosts: int) -> tuple[pw.Topology, Any]:
    """One island of ``hosts`` hosts of one device, and a one-gang program of 1 ms over all of them."""
    topo = pw.Topology(islands=1, hosts_per_island=hosts, devices_per_host=1)
    return topo, _program(topo, hosts)


def _pipelined(prog: Any, calls: int) -> Any:
    def script(h: Any) -> Any:
        call = None
        for _ in range(calls):
            call = yield from h.call(prog, after=call)
        yield from h.result(call)
        h.mark("end")
    return script


def _scheduler_cpu_per_call(topo: pw.Topology, prog: Any, costs: CostModel, fanout: Fanout | None = None,
                            calls: int = 4) -> float:
    sim = Simulation(topo, costs, fanout=fanout)
    sim.client("a", _pipelined(prog, calls))
    sim.run()
    return sim.scheduler_cpu.busy_s / calls


def _runtime_tree(n: int, degree: int) -> tuple[dict[int, int], dict[int, int], int]:
    """The tree the runtime's hosts build for a record on ``n`` hosts (``HostCore.fan``, each host's
    own core, records passed between them as the runtime relays them), and the endings coming up:
    each position's parent and its rank among its parent's children, and the number of reports
    the scheduler got."""
    addrs = [f"h{i}" for i in range(n)]
    cores = {a: HostCore(a, [0], None) for a in addrs}  # type: ignore[arg-type]
    parent: dict[int, int] = {}
    rank: dict[int, int] = {}
    reports = 0
    todo: list[tuple[str, Any]] = [(addrs[0], Fan(addrs, None, degree, release=("r1", [])))]
    while todo:
        at, msg = todo.pop(0)
        out = cores[at].fan(msg) if isinstance(msg, Fan) else cores[at]._report(msg.pid)
        forwards = 0
        for ins in out:
            if isinstance(ins, Relay) and isinstance(ins.msg, Fan):
                forwards += 1
                child = addrs.index(ins.host)
                assert ins.msg.hosts[0] == ins.host and ins.msg.parent == at
                parent[child], rank[child] = addrs.index(at), forwards
            if isinstance(ins, Relay) and isinstance(ins.msg, SubtreeDone):
                assert addrs.index(ins.host) == parent[addrs.index(at)]  # endings go up the same tree
            if isinstance(ins, Tell):
                assert isinstance(ins.msg, Released) and at == addrs[0]
                reports += 1
            if isinstance(ins, Relay):
                todo.append((ins.host, ins.msg))
    return parent, rank, reports


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 7])
def test_the_models_tree_is_the_one_the_runtimes_hosts_build(degree: int) -> None:
    """For every size of call, the model's tree (``simulate.fanout.tree``) has the parents and the
    forwarding order of the tree the runtime's host cores build from one Fan record, and its
    endings reach the scheduler once, from the first host."""
    for n in range(1, 40):
        parent, rank, reports = _runtime_tree(n, degree)
        t = tree(n, degree)
        assert t.parent.tolist() == [parent.get(p, -1) for p in range(n)], (n, degree)
        assert t.rank.tolist() == [rank.get(p, 0) for p in range(n)], (n, degree)
        assert t.children.tolist() == [sum(1 for c in parent.values() if c == p) for p in range(n)]
        assert t.children.max() <= degree and reports == 1
        assert sorted(np.concatenate(t.levels).tolist()) == list(range(n))  # every host once, no other


def test_a_tree_is_made_of_contiguous_near_equal_shares_of_the_calls_hosts() -> None:
    t = tree(16, 4)  # the first host forwards to 4 shares of 15: 4, 4, 4 and 3 hosts
    assert [lv.tolist() for lv in t.levels] == [[0], [1, 5, 9, 13], [2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15]]
    assert t.children.tolist() == [4, 3, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0]
    assert t.rank[[1, 5, 9, 13]].tolist() == [1, 2, 3, 4]
    assert tree(512, 4).depth == 5 and tree(512, 4).children.max() == 4
    assert tree(16, 2).depth == 4 and tree(16, 16).depth == 1 and tree(16, 1).depth == 15


def test_the_threshold_is_per_call_as_in_the_runtime() -> None:
    """In one island of 16 hosts, a call on at most ``threshold`` hosts goes to each host directly and
    a larger one down a tree, whatever the island's size: the runtime scheduler's rule."""
    topo = pw.Topology(islands=1, hosts_per_island=16, devices_per_host=1)
    costs = _costs(scheduler_host_s=2e-4, scheduler_tree_s=3e-4)
    fanout = Fanout()
    runtime = SchedulerCore(degree=fanout.degree, threshold=fanout.threshold)
    for hosts in (1, 2, 4, 5, 8, 16):
        expected = 3e-4 if hosts > DEFAULT_THRESHOLD else hosts * 2e-4
        assert _scheduler_cpu_per_call(topo, _program(topo, hosts), costs) == pytest.approx(expected), hosts
        assert fanout.fans(hosts) == runtime.fans([f"h{i}" for i in range(hosts)]) == (hosts > DEFAULT_THRESHOLD)
    assert _scheduler_cpu_per_call(topo, _program(topo, 8), costs, Fanout(threshold=8)) == pytest.approx(8 * 2e-4)
    assert _scheduler_cpu_per_call(topo, _program(topo, 8), costs, Fanout.off()) == pytest.approx(8 * 2e-4)


def test_relays_are_always_hosts_of_the_call() -> None:
    """A call on the last 6 hosts of an island of 16: only those hosts do any work; the first of
    them (host 10) forwards to 4 children (11, 13, 14 and 15; 11 to 12) and takes their endings; no
    other host of the island relays."""
    topo = pw.Topology(islands=1, hosts_per_island=16, devices_per_host=1)
    prog = _program(topo, 6, first=10)
    sim = Simulation(topo, _costs(relay_forward_s=1e-4, relay_done_s=1e-5, relay_root_s=1e-6,
                                  host_dispatch_s=1e-6).cluster())
    sim.client("a", _pipelined(prog, 1))
    sim.run()
    r = sim.route(sim.schedule(prog))
    assert r is not None and r.hosts.tolist() == list(range(10, 16))
    busy = sim.hosts.free_at
    assert np.all(busy[:10] == 0) and np.all(busy[10:] > 0)
    assert r.tree.parent.tolist() == [-1, 0, 1, 0, 0, 0]
    assert r.relay_cpu(sim.costs) == pytest.approx((5 * 1.1e-4 + 1e-6, 4 * 1.1e-4 + 1e-6))


def test_the_schedulers_cpu_per_call_is_flat_in_the_hosts_with_the_tree_and_grows_without() -> None:
    costs = _costs(scheduler_call_s=1e-4, scheduler_host_s=2e-4, scheduler_tree_s=3e-4, relay_forward_s=1e-5,
                   relay_done_s=1e-5)
    for hosts in (16, 64, 256):
        topo, prog = _island(hosts)
        assert _scheduler_cpu_per_call(topo, prog, costs) == pytest.approx(1e-4 + 3e-4)
        assert _scheduler_cpu_per_call(topo, prog, costs, Fanout.off()) == pytest.approx(1e-4 + 2e-4 * hosts)


def test_the_trees_shape_comes_from_the_dask_config_with_the_runtimes_defaults() -> None:
    assert Fanout() == Fanout(DEFAULT_DEGREE, DEFAULT_THRESHOLD) == Fanout(4, 2)
    assert Fanout.from_config() == Fanout(4, 2)  # pathdask.yaml: threshold 2, degree 4
    topo, _ = _island(16)
    with dask.config.set({"pathdask.fanout.threshold": 16, "pathdask.fanout.degree": 2}):
        assert Simulation(topo, _costs()).fanout == Fanout(degree=2, threshold=16)
    with dask.config.set({"pathdask.fanout.degree": 0}), pytest.raises(ValueError, match="degree"):
        Fanout.from_config()
    with pytest.raises(ValueError, match="threshold"):
        Fanout(threshold=-1)


def test_latency_grows_with_the_trees_depth_down_and_up() -> None:
    """One call, every cost but the messages' 0: without the tree, 4 messages and the gang (client to
    scheduler, to the hosts, the ending back, to the client); on 16 hosts with degree 4 (depth 2),
    2 more each way; with degree 2 (depth 4), 4 more; with degree 16 (depth 1), 1 more."""
    topo, prog = _island(16)
    message = 1e-4

    def end(fanout: Fanout) -> float:
        result = simulate(topo, [ClientScript("a", _pipelined(prog, 1))], _costs(message_s=message), fanout=fanout)
        return float(result.by_name("a").marks["end"])

    assert end(Fanout.off()) == pytest.approx(1e-3 + 4 * message)
    assert end(Fanout()) == pytest.approx(1e-3 + 8 * message)
    assert end(Fanout(degree=2)) == pytest.approx(1e-3 + 12 * message)
    assert end(Fanout(degree=16)) == pytest.approx(1e-3 + 6 * message)


def test_a_record_goes_down_each_host_to_one_child_after_another_then_its_own_part() -> None:
    """Degree 2 over 7 hosts: the first host forwards to positions 1 and 4 (shares 1-3 and 4-6), they
    to 2, 3 and 5, 6. Each forward takes 1 s of its host and half a second on the way; each host
    then registers its part (0.25 s); the first host pays its 0.1 s per tree call first."""
    costs = _costs(relay_forward_s=1.0, message_s=0.5, relay_root_s=0.1)
    down = Route(tree(7, 2), np.arange(7)).descend(Hosts(7), 0.0, np.full(7, 0.25), costs)
    assert down.tolist() == pytest.approx([2.35, 3.85, 3.35, 4.35, 4.85, 4.35, 5.35])
    # the hosts are the call's, wherever they are: hosts 3, 9, ... of 30
    hosts = np.array([3, 9, 12, 20, 21, 25, 29])
    busy = Hosts(30)
    Route(tree(7, 2), hosts).descend(busy, 0.0, np.full(7, 0.25), costs)
    assert np.nonzero(busy.free_at)[0].tolist() == hosts.tolist()
    # a late order: down the same tree, its forwards' CPU already counted with the call's
    late = Route(tree(7, 2), np.arange(7)).descend(Hosts(7), 0.0, np.zeros(7), costs, forward_s=0.0)
    assert late.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0, 0.5, 1.0, 1.0])


def test_an_ending_reaches_the_scheduler_once_every_child_reported() -> None:
    """Degree 2 over 7 hosts, a message 1 s, a host 0.1 s per child ending it takes: the first host
    reports once its two subtrees did, and a late host anywhere holds every host above it."""
    costs = _costs(relay_done_s=0.1, message_s=1.0)
    t = Route(tree(7, 2), np.arange(7))
    on_time = np.zeros(7)
    assert t.ascend(Hosts(7), on_time, 0.0, costs) == pytest.approx(3.4)  # 2 levels of 1.2, then 1 s
    for late in range(7):  # whichever host ends at 10 s, the scheduler hears of it through each level above
        ends = on_time.copy()
        ends[late] = 10.0
        depth = 0 if late == 0 else 1 if late in (1, 4) else 2
        relays = 0.2 * (depth + 1) if depth < 2 else 0.4  # its own children's endings, and each parent's
        assert t.ascend(Hosts(7), ends, 0.0, costs) == pytest.approx(10.0 + depth * 1.0 + relays + 1.0), late
    # each host pays its share of the lone-done CPU before it reports
    assert t.ascend(Hosts(7), on_time, 0.5, costs) == pytest.approx(3.4 + 3 * 0.5)
    assert route(np.arange(2), Fanout()) is None and route(np.arange(3), Fanout()) is not None


def test_a_calibration_without_the_trees_costs_derives_them_from_the_per_host_ones(tmp_path: Any) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"source": {}, "costs": {"scheduler_host_s": 2e-4, "reference_s": 1e-3}}))
    costs = CostModel.load(str(old))
    assert costs.scheduler_tree_s == 2e-4 and costs.relay_root_s == 0.0
    assert costs.relay_done_s == pytest.approx(2e-4 * RELAY_DONE_SHARE)
    assert costs.relay_forward_s + costs.relay_done_s == pytest.approx(2e-4)
    given = _costs(scheduler_host_s=2e-4, scheduler_tree_s=1e-5, relay_forward_s=2e-5, relay_done_s=3e-5,
                   relay_root_s=4e-5)
    path = str(tmp_path / "new.json")
    given.save(path)
    assert CostModel.load(path) == given
    assert costs.at_speed(2e-3).relay_forward_s == pytest.approx(2 * costs.relay_forward_s)


def test_the_shipped_calibration_has_the_trees_measured_costs() -> None:
    shipped = CostModel.load()
    with open(DEFAULT) as f:
        assert "scheduler_tree_s" in json.load(f)["costs"]  # measured, not derived from the direct path
    # a tree call may cost the scheduler nothing beyond a call's own part, within the fit's noise
    # (the plugin's meter gives its own estimate, kept in the source for the record)
    assert shipped.scheduler_tree_s >= 0 and shipped.relay_forward_s > 0
    assert shipped.relay_done_s >= 0  # endings up a tree may cost the hosts no more than each reporting directly
    assert "measured" in shipped.source["fanout"]
    # measured with the rest (``--calibrate``), or merged into an earlier calibration (``merge``)
    raw = shipped.source["raw_tree"] if "raw_tree" in shipped.source else shipped.source["raw"]["tree"]
    assert all(raw[h]["tree"]["fanned"] == 1 and raw[h]["direct"]["fanned"] == 0 for h in ("2", "4", "8"))


def _synthetic_raw(costs: CostModel, forward: float, done: float, root: float, scheduler_tree: float,
                   untimed: float) -> dict[str, Any]:
    """Raw tree timings of a system whose trees cost what is given: the hosts' timed work per child
    ``forward`` and ``done``, and ``untimed`` more per child that only the process's CPU shows."""
    raw: dict[str, Any] = {"k": 64, "degree": 4}
    for n in (1, 2, 4, 8):
        common = 1e-4 * n + 3e-5 * n * n  # client, the hosts' own parts, the devices
        direct = {"dispatch": 2e-5 * n, "order": 1e-5 * n, "release": 1e-5 * n, "ended": 5e-6 * n,
                  "fan": 0.0, "relay_fan": 0.0, "subtree": 0.0, "relay_subtree": 0.0,
                  "process_cpu": common + costs.scheduler_call_s + costs.scheduler_host_s * n,
                  "plugin": 5e-5 + 2e-5 * n, "fanned": 0.0}
        raw[str(n)] = {"direct": direct}
        if n > 1:
            c = n - 1
            raw[str(n)]["tree"] = {
                "dispatch": 0.0, "order": 0.0, "release": 0.0, "ended": 5e-6 * n + 0.5 * done * c,
                "fan": 2e-5 * n + 0.7 * forward * c + root, "relay_fan": 0.3 * forward * c,
                "subtree": 0.25 * done * c, "relay_subtree": 0.25 * done * c,
                "process_cpu": (common + costs.scheduler_call_s + scheduler_tree + root
                                + c * (forward + done + untimed)),
                "plugin": 8e-5, "fanned": 1.0}
    return raw


def test_the_tree_calibration_fits_the_costs_that_made_its_timings() -> None:
    """The fit gets back the first host's cost and the scheduler's, and all of the process's CPU per
    child, split between forwards and endings as the timers split it."""
    from pathdask.simulate.calibrate_tree import fit

    costs = _costs(scheduler_call_s=1e-5, scheduler_host_s=2e-4)
    got = fit(_synthetic_raw(costs, 6e-5, 2e-5, 3e-5, 1.5e-4, 1.2e-4), costs)
    assert got["relay_root_s"] == pytest.approx(3e-5)
    assert got["scheduler_tree_s"] == pytest.approx(1.5e-4)
    assert got["timed_per_child_s"] == pytest.approx(8e-5) and got["per_child_s"] == pytest.approx(2e-4)
    assert got["relay_forward_s"] == pytest.approx(1.5e-4) and got["relay_done_s"] == pytest.approx(5e-5)
    assert got["scheduler_tree_by_meter_s"] == pytest.approx(2.1e-4 * 8e-5 / 7e-5 - 1e-5)
    # nothing untimed: the timers' costs as they are
    exact = fit(_synthetic_raw(costs, 6e-5, 2e-5, 3e-5, 1.5e-4, 0.0), costs)
    assert exact["relay_forward_s"] == pytest.approx(6e-5) and exact["relay_done_s"] == pytest.approx(2e-5)


def test_figure6_small_runs_with_and_without_the_tree() -> None:
    """Configuration B (16 hosts): its calls go down trees (16 > 2), which take the scheduler's cost per
    host out of each call, so pathdask keeps up with the multi-controller at smaller computations."""
    from pathdask.simulate.figures import MC, NO_TREE, TREE, figure6

    lines: list[str] = []
    out = figure6(CostModel.load().cluster(), small=True, echo=lines.append)
    b = out["B"]
    assert set(b["rates"]) == {TREE, NO_TREE, MC} and b["tree"] and b["paper_95pct_at_s"] == 2.3e-3
    assert b["fanout"] == {"degree": 4, "threshold": 2}
    assert b["rates"][TREE][0] > b["rates"][NO_TREE][0]  # 1 ms gangs: the scheduler bounded the calls
    # where each reaches 95% is reported; with 16 calls per size (small) a tree's depth shows in the
    # short run's fill, so their order is the full figure's to tell (128 calls per size)
    assert 0 < b["reaches_95pct_at_s"] and 0 < b["reaches_95pct_at_s_no_tree"]
    per_call = b["per_call_s"]
    assert per_call[TREE]["scheduler_s"] < per_call[NO_TREE]["scheduler_s"] / 8
    assert b["bound"][NO_TREE] == "scheduler" and b["bound"][TREE] != "scheduler"
    assert any("model with trees" in line for line in lines)
