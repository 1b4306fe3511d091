"""pathdask.simulate: the relay tree (``pathdask.fanout``) a call's records go down and its endings up."""

from __future__ import annotations

import json
from typing import Any

import dask.config
import numpy as np
import pytest

import pathdask as pw
from pathdask import P, function
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
from pathdask.simulate.fanout import Route, levels
from pathdask.simulate.model import RELAY_DONE_SHARE
from pathdask.simulate.workloads import traced

ZERO = ("client_call_s", "client_host_s", "scheduler_call_s", "scheduler_host_s", "host_dispatch_s", "host_op_s",
        "device_op_s", "exchange_s", "exchange_host_s", "message_s", "result_s", "mc_call_s", "mc_op_s",
        "scheduler_tree_s", "relay_forward_s", "relay_done_s")


def _costs(**given: float) -> CostModel:
    """Every control cost 0 but those ``given``."""
    return CostModel(**{**dict.fromkeys(ZERO, 0.0), **given})


def _island(hosts: int) -> tuple[pw.Topology, Any]:
    """One island of ``hosts`` hosts of one device, and a one-gang program of 1 ms over all of them."""
    topo = pw.Topology(islands=1, hosts_per_island=hosts, devices_per_host=1)
    mesh = abstract_mesh(topo, {"x": hosts})
    g = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=1e-3, name="g")
    return topo, traced(lambda x: g(x), topo, AbstractArray((hosts,), "f8", mesh, P("x")), name="p")


def _pipelined(prog: Any, calls: int) -> Any:
    def script(h: Any) -> Any:
        call = None
        for _ in range(calls):
            call = yield from h.call(prog, after=call)
        yield from h.result(call)
        h.mark("end")
    return script


def _scheduler_cpu_per_call(hosts: int, costs: CostModel, fanout: Fanout | None = None, calls: int = 4) -> float:
    topo, prog = _island(hosts)
    sim = Simulation(topo, costs, fanout=fanout)
    sim.client("a", _pipelined(prog, calls))
    sim.run()
    return sim.scheduler_cpu.busy_s / calls


def test_the_tree_is_heap_laid_over_the_island_and_a_call_uses_the_ways_to_its_hosts() -> None:
    full = levels(range(16), 4)
    assert [lv.hosts.tolist() for lv in full] == [[0], [1, 2, 3, 4], list(range(5, 16))]
    assert full[1].children.tolist() == [4, 4, 3, 0] and full[0].children.tolist() == [4]
    assert full[2].parent.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert full[2].rank.tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    # a call on positions 9 and 15 of an island whose first host is 100: through 0, then 2 and 3
    part = levels([9, 15], 4, first=100, entries=[0, 1])
    assert [lv.hosts.tolist() for lv in part] == [[100], [102, 103], [109, 115]]
    assert [lv.own.tolist() for lv in part] == [[-1], [-1, -1], [0, 1]]  # the relays are not the call's
    assert part[0].children.tolist() == [2] and part[1].children.tolist() == [1, 1]


def test_the_schedulers_cpu_per_call_is_flat_in_the_hosts_with_the_tree_and_grows_without() -> None:
    costs = _costs(scheduler_call_s=1e-4, scheduler_host_s=2e-4, scheduler_tree_s=3e-4, relay_forward_s=1e-5,
                   relay_done_s=1e-5)
    for hosts in (16, 64, 256):
        assert _scheduler_cpu_per_call(hosts, costs) == pytest.approx(1e-4 + 3e-4)
        assert _scheduler_cpu_per_call(hosts, costs, Fanout.off()) == pytest.approx(1e-4 + 2e-4 * hosts)


def test_the_tree_is_used_only_in_islands_of_more_than_the_threshold_of_hosts() -> None:
    costs = _costs(scheduler_host_s=2e-4, scheduler_tree_s=3e-4)
    assert _scheduler_cpu_per_call(8, costs) == pytest.approx(8 * 2e-4)  # the default threshold: 8
    assert _scheduler_cpu_per_call(9, costs) == pytest.approx(3e-4)
    assert _scheduler_cpu_per_call(9, costs, Fanout(threshold=9)) == pytest.approx(9 * 2e-4)
    topo, _ = _island(16)
    with dask.config.set({"pathdask.fanout.threshold": 16, "pathdask.fanout.degree": 2}):
        assert Simulation(topo, costs).fanout == Fanout(degree=2, threshold=16)
        assert _scheduler_cpu_per_call(16, costs) == pytest.approx(16 * 2e-4)
    with dask.config.set({"pathdask.fanout.degree": 1}), pytest.raises(ValueError, match="degree"):
        Fanout.from_config()


def test_latency_grows_with_the_trees_depth_down_and_up() -> None:
    """One call, every cost but the messages' 0: without the tree, 4 messages and the gang (client to
    scheduler, to the hosts, the ending back, to the client); on 16 hosts with degree 4 (depth 2),
    2 more each way; with degree 2 (depth 4: position 15 is under 7, 3 and 1), 4 more."""
    topo, prog = _island(16)
    message = 1e-4

    def end(fanout: Fanout) -> float:
        result = simulate(topo, [ClientScript("a", _pipelined(prog, 1))], _costs(message_s=message), fanout=fanout)
        return float(result.by_name("a").marks["end"])

    assert end(Fanout.off()) == pytest.approx(1e-3 + 4 * message)
    assert end(Fanout()) == pytest.approx(1e-3 + 8 * message)
    assert end(Fanout(degree=2)) == pytest.approx(1e-3 + 12 * message)


def test_a_record_goes_down_each_relay_to_one_child_after_another() -> None:
    """Degree 2 over 7 hosts: each relay forwards to its children in turn (1 s each), each
    forward half a second on the way; each host then registers its part (0.25 s). A relay that the
    call does not use reads the record first (0.3 s)."""
    costs = _costs(relay_forward_s=1.0, message_s=0.5, host_dispatch_s=0.3)
    down = Route((levels(range(7), 2),), 7).descend(Hosts(7), 0.0, np.full(7, 0.25), costs)
    assert down.tolist() == pytest.approx([2.25, 3.75, 4.75, 3.25, 4.25, 4.25, 5.25])
    part = Route((levels([0, 6], 2),), 2).descend(Hosts(7), 0.0, np.full(2, 0.25), costs)
    assert part.tolist() == pytest.approx([1.25, 3.55])  # through relay 2: 1.5 + 0.3 + 1 + 0.5, then its own


def test_an_ending_reaches_the_scheduler_once_every_subtree_the_call_uses_reported() -> None:
    """Degree 2 over 7 hosts, a message 1 s, a relay 0.1 s per child ending it takes: the root reports
    once its two subtrees did, and a late host anywhere holds every relay above it."""
    costs = _costs(relay_done_s=0.1, message_s=1.0)
    tree = Route((levels(range(7), 2),), 7)
    on_time = np.zeros(7)
    assert tree.ascend(Hosts(7), on_time, 0.0, costs) == pytest.approx(3.4)  # 2 levels of 1.2, then 1 s
    for late in range(7):  # whichever host ends at 10 s, the scheduler hears of it through each level above
        ends = on_time.copy()
        ends[late] = 10.0
        depth = 0 if late == 0 else 1 if late < 3 else 2
        relays = 0.4 if late else 0.2  # the relays on its way up (itself, if one), each taking 2 endings
        assert tree.ascend(Hosts(7), ends, 0.0, costs) == pytest.approx(10.0 + depth * 1.0 + relays + 1.0), late
    # the call's hosts 0 and 6; relay 2 (not the call's) waits for 6 before it reports
    assert Route((levels([0, 6], 2),), 2).ascend(Hosts(7), np.array([0.0, 10.0]), 0.0, costs) == pytest.approx(13.2)
    # each host that reports pays its share of the lone-done CPU first
    assert tree.ascend(Hosts(7), on_time, 0.5, costs) == pytest.approx(3.4 + 3 * 0.5)


def test_a_calibration_without_the_trees_costs_derives_them_from_the_per_host_ones(tmp_path: Any) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"source": {}, "costs": {"scheduler_host_s": 2e-4, "reference_s": 1e-3}}))
    costs = CostModel.load(str(old))
    assert costs.scheduler_tree_s == 2e-4
    assert costs.relay_done_s == pytest.approx(2e-4 * RELAY_DONE_SHARE)
    assert costs.relay_forward_s + costs.relay_done_s == pytest.approx(2e-4)
    given = _costs(scheduler_host_s=2e-4, scheduler_tree_s=1e-5, relay_forward_s=2e-5, relay_done_s=3e-5)
    path = str(tmp_path / "new.json")
    given.save(path)
    assert CostModel.load(path) == given
    shipped = CostModel.load()
    assert all(getattr(shipped, n) > 0 for n in ("scheduler_tree_s", "relay_forward_s", "relay_done_s"))
    assert costs.at_speed(2e-3).relay_forward_s == pytest.approx(2 * costs.relay_forward_s)


def test_figure6_small_runs_with_and_without_the_tree() -> None:
    """Configuration B (16 hosts): the tree takes the scheduler's cost per host out of each call, so
    pathdask keeps up with the multi-controller at smaller computations than without it."""
    from pathdask.simulate.figures import MC, NO_TREE, TREE, figure6

    lines: list[str] = []
    out = figure6(CostModel.load().cluster(), small=True, echo=lines.append)
    b = out["B"]
    assert set(b["rates"]) == {TREE, NO_TREE, MC} and b["tree"] and b["paper_95pct_at_s"] == 2.3e-3
    assert all(t >= o * 0.999 for t, o in zip(b["rates"][TREE], b["rates"][NO_TREE]))
    assert b["rates"][TREE][0] > 2 * b["rates"][NO_TREE][0]  # 1 ms gangs: the scheduler bounded the calls
    assert b["reaches_95pct_at_s"] < b["reaches_95pct_at_s_no_tree"]
    per_call = b["per_call_s"]
    assert per_call[TREE]["scheduler_s"] < per_call[NO_TREE]["scheduler_s"] / 8
    assert any("model with the tree" in line for line in lines)
