"""pathdask.simulate: exact basics on the virtual clock, and a small validation against a real run."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest

import pathdask as pw
from pathdask import P, function
from pathdask.dashboard.trace import VARIABLES
from pathdask.pipeline import Pipeline, Stage
from pathdask.simulate import AbstractArray, ClientScript, CostModel, abstract_mesh, simulate
from pathdask.simulate.figures import reach_95
from pathdask.simulate.workloads import dispatch_programs, dispatch_rate, shares, traced

FREE = CostModel(**{f: 0.0 for f in ("client_call_s", "client_host_s", "scheduler_call_s", "scheduler_host_s",
                                     "host_dispatch_s", "host_op_s", "device_op_s", "exchange_s",
                                     "exchange_host_s", "message_s", "result_s", "mc_call_s", "mc_op_s")})


def _one_gang(cost: float) -> tuple[pw.Topology, Any]:
    """One device, and a program of one gang of ``cost`` seconds on it."""
    topo = pw.Topology(islands=1, hosts_per_island=1, devices_per_host=1)
    mesh = abstract_mesh(topo, {"x": 1})
    g = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=cost, name="g")
    return topo, traced(lambda x: g(x), topo, AbstractArray((4,), "f8", mesh, P("x")), name="p")


def _one_call(topo: pw.Topology, prog: Any, costs: CostModel = FREE) -> Any:
    def script(h: Any) -> Any:
        call = yield from h.call(prog)
        yield from h.result(call)
        h.mark("end")

    return simulate(topo, [ClientScript("a", script)], costs)


def test_chain_on_one_device_is_the_exact_sum_of_its_costs() -> None:
    topo = pw.Topology(islands=1, hosts_per_island=1, devices_per_host=1)
    mesh = abstract_mesh(topo, {"x": 1})
    gangs = [function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=c, name=f"g{i}")
             for i, c in enumerate((1e-3, 2e-3, 5e-3))]

    def chain(x: Any) -> Any:
        for g in gangs:
            x = g(x)
        return x

    result = _one_call(topo, traced(chain, topo, AbstractArray((4,), "f8", mesh, P("x")), name="chain"))
    assert result.by_name("a").marks["end"] == pytest.approx(8e-3, abs=1e-12)
    trace = result.trace
    assert set(trace.data_vars) == set(VARIABLES) and trace.sizes["event"] == 3
    assert list(trace.gang.values[0]) == ["g0", "g1", "g2"]
    busy = (trace.end - trace.start).sum("event").values[0] / np.timedelta64(1, "s")
    assert busy == pytest.approx(8e-3)
    trace.pathdask.plot()  # the real plot reads a simulated trace


def test_control_costs_add_up_for_one_call() -> None:
    topo = pw.Topology(islands=1, hosts_per_island=1, devices_per_host=1)
    mesh = abstract_mesh(topo, {"x": 1})
    g = function(lambda b: b + 1.0, in_specs=P("x"), out_specs=P("x"), cost=1e-3, name="g")
    costs = CostModel(client_call_s=1e-3, client_host_s=0, scheduler_call_s=2e-3, scheduler_host_s=0,
                      host_dispatch_s=3e-4, host_op_s=0, device_op_s=0, exchange_s=0, exchange_host_s=0,
                      message_s=1e-4, result_s=5e-4)
    result = _one_call(topo, traced(lambda x: g(x), topo, AbstractArray((4,), "f8", mesh, P("x")), name="p"), costs)
    # client, message, scheduler, message, host, kernel, message, message, result
    assert result.by_name("a").marks["end"] == pytest.approx(1e-3 + 1e-4 + 2e-3 + 1e-4 + 3e-4 + 1e-3 + 2e-4 + 5e-4)


def test_calls_that_travel_alone_pay_the_lone_costs_and_pipelined_calls_do_not() -> None:
    """A client that waits for each result pays the lone-call costs on every call; one that
    pipelines its calls pays them on its first only (its later messages share batches)."""
    from dataclasses import replace

    topo, prog = _one_gang(1e-3)
    costs = replace(FREE, lone_call_s=4e-3, lone_host_s=1e-3)  # 4 ms of scheduler and 1 ms of host CPU

    def waiting(h: Any) -> Any:
        for _ in range(3):
            yield from h.result((yield from h.call(prog)))
        h.mark("end")

    def pipelined(h: Any) -> Any:
        calls = []
        for _ in range(3):
            calls.append((yield from h.call(prog)))
        yield from h.result(calls[-1])
        h.mark("end")

    alone = simulate(topo, [ClientScript("a", waiting)], costs)
    assert alone.by_name("a").marks["end"] == pytest.approx(3 * (5e-3 + 1e-3))
    assert [c.lone for c in alone.calls] == [True, True, True]
    batched = simulate(topo, [ClientScript("a", pipelined)], costs)
    assert batched.by_name("a").marks["end"] == pytest.approx(5e-3 + 3 * 1e-3)
    assert [c.lone for c in batched.calls] == [True, False, False]


def test_calls_made_back_to_back_go_as_one_message_taken_in_slices() -> None:
    """A client's calls go when it waits, or once it has called for the switch interval; the
    scheduler takes a message's first call alone, then a slice of calls per ``CALL_SLICE``,
    and each call's dispatch goes when its slice is done, as ``SchedulerPlugin.call`` does."""
    import sys
    from dataclasses import replace

    from pathdask.scheduler.plugin import CALL_SLICE

    topo, prog = _one_gang(0.0)
    call_s, take_s = 1e-4, 0.4 * CALL_SLICE
    n = round(1.5 * sys.getswitchinterval() / call_s)  # the client calls for 1.5 switch intervals

    def pipelined(h: Any) -> Any:
        for _ in range(n):
            call = yield from h.call(prog)
        yield from h.result(call)

    costs = replace(FREE, client_call_s=call_s, scheduler_call_s=take_s)
    calls = simulate(topo, [ClientScript("a", pipelined)], costs).calls
    dispatched = np.array([float(c.dispatched[0]) for c in calls])
    made = np.array([c.submitted for c in calls])
    # the first message: the calls made within a switch interval of the first, sent by the next
    first = int(np.sum(made - made[0] < sys.getswitchinterval()))
    assert 0 < first < n
    sent = made[first]
    # taken in: the first call alone, then slices of 3 calls (0.4, 0.8 and 1.2 slices' time)
    slices = [min(1 + 3 * -(-i // 3), first) for i in range(first)]
    assert dispatched[:first] == pytest.approx(sent + take_s * np.array(slices), abs=1e-12)
    # the rest go when the client waits, and are taken in after the first message
    assert dispatched[first] == pytest.approx(max(made[-1], sent + take_s * first) + take_s, abs=1e-12)


def test_the_scheduler_takes_pipelined_calls_in_at_its_handlers_cost_and_does_the_rest_after() -> None:
    """A message's calls are sliced by the handler's share of the scheduler's CPU per call; the
    rest comes once the slice's dispatches went, so the scheduler's CPU in all is unchanged. A
    call that travels alone pays all of it as it is taken in."""
    from dataclasses import replace

    from pathdask.scheduler.plugin import CALL_SLICE
    from pathdask.simulate.run import Simulation

    topo, prog = _one_gang(0.0)
    whole, take = 2 * CALL_SLICE, 0.3 * CALL_SLICE
    costs = replace(FREE, scheduler_call_s=whole, scheduler_take_s=take)
    assert costs.scheduler_s(1) == pytest.approx((take, whole - take))
    assert costs.scheduler_s(1, lone=True) == (whole, 0.0)
    assert CostModel().scheduler_s(3) == (CostModel().scheduler_call_s + 3 * CostModel().scheduler_host_s, 0.0)
    n = 10

    def pipelined(h: Any) -> Any:
        call = None
        for _ in range(n):  # made at 0, sent at once: one message
            call = yield from h.call(prog)
        yield from h.result(call)

    sim = Simulation(topo, costs)
    sim.client("a", pipelined)
    calls = sim.run().calls
    dispatched = np.array([float(c.dispatched[0]) for c in calls])
    # the first call alone (it travels alone: all of its cost), then slices of 4 calls at 0.3 of
    # a slice each; a slice's rest comes once its dispatches went, behind the next slice, which
    # was taken in first
    assert calls[0].lone and not any(c.lone for c in calls[1:])
    assert dispatched[0] == pytest.approx(whole)
    assert dispatched[1:5] == pytest.approx(whole + 4 * take)
    assert dispatched[5:9] == pytest.approx(whole + 8 * take)
    assert dispatched[9] == pytest.approx(whole + 8 * take + 4 * (whole - take) + take)
    assert sim.scheduler_cpu.busy_s == pytest.approx(n * whole)


def test_on_one_cpu_a_devices_work_waits_for_the_turn_that_holds_the_cpu_when_it_reaches_a_program() -> None:
    """On one shared CPU a device takes a program up when it reaches it, not when its host has
    it: a control turn that began before then holds the CPU to its end, and the gang ends late."""
    from dataclasses import replace

    from pathdask.simulate.schedule import compile_schedule

    topo, prog = _one_gang(1e-3)
    turn, own = 2e-3, 1e-4
    costs = replace(FREE, lone_call_s=turn, device_op_s=own).embedded()

    def pipelined(h: Any) -> Any:  # A travels alone (taken in 0-2 ms, runs 2-3); B is ready at 2
        a = yield from h.call(prog)
        b = yield from h.call(prog)
        yield from h.result(a)
        yield from h.result(b)

    def late(h: Any) -> Any:  # C travels alone: taken in 2.5-4.5 ms, in one turn
        yield from h.sleep(2.5e-3)
        c = yield from h.call(prog)
        yield from h.result(c)

    result = simulate(topo, [ClientScript("a", pipelined), ClientScript("c", late)], costs)
    a, b, c = sorted(result.calls, key=lambda call: call.submitted)
    assert a.done_at == pytest.approx(3e-3)
    # B's device reaches it at 3 ms, inside C's turn: its own work (its op, and the body's NumPy)
    # runs after it, from 4.5 ms
    own += compile_schedule(prog, topo).steps[0].compute
    assert b.done_at == pytest.approx(2.5e-3 + turn + own)
    assert c.done_at == pytest.approx(b.done_at + 1e-3)


def test_pipelined_calls_whose_gangs_outlast_their_control_work_pay_for_endings_that_go_alone() -> None:
    """Each ending of a pipelined call whose gang outlasts the control plane's work for a call
    comes to an idle scheduler and costs it the lone-done CPU; endings of zero-cost gangs come
    together and do not."""
    from dataclasses import replace

    def run(cost: float, lone_done: float, share: tuple[tuple[float, float], ...] = ()) -> float:
        topo, prog = _one_gang(cost)

        def pipelined(h: Any) -> Any:
            for _ in range(3):
                call = yield from h.call(prog)
            yield from h.result(call)
            h.mark("end")

        costs = replace(FREE, client_call_s=1e-4, lone_done_s=lone_done, lone_done_share=share)
        return simulate(topo, [ClientScript("a", pipelined)], costs).by_name("a").marks["end"]

    # the three calls go as one message when the client waits (0.3 ms); gangs at 0.3-1.3,
    # 1.3-2.3 and 2.3-3.3 ms (and the body's measured NumPy); the last ending is seen 0.2 ms later
    assert run(1e-3, 2e-4) - run(1e-3, 0.0) == pytest.approx(2e-4, abs=2e-5)
    assert run(1e-3, 0.0) == pytest.approx(3.3e-3, abs=2e-5)
    assert run(0.0, 2e-4) - run(0.0, 0.0) == pytest.approx(0.0, abs=2e-5)
    assert run(0.0, 2e-4) == pytest.approx(3e-4, abs=2e-5)  # the client's CPU, nothing more
    # gangs 10 times the control work (0.1 ms of client CPU), where half the endings go alone
    assert run(1e-3, 2e-4, ((20.0, 1.0),)) - run(1e-3, 0.0) == pytest.approx(1e-4, abs=2e-5)


def test_the_share_of_endings_that_go_alone_grows_with_how_much_gangs_outlast_the_control_work() -> None:
    costs = CostModel(lone_done_share=[[1.0, 0.2], [2.0, 1.0]])  # as JSON gives it
    assert costs.lone_done_share == ((1.0, 0.2), (2.0, 1.0))
    assert [costs.lone_done_at(s) for s in (0.0, 0.5, 1.0, 1.5, 2.0, 5.0)] == pytest.approx(
        [0.0, 0.1, 0.2, 0.6, 1.0, 1.0])
    assert [CostModel().lone_done_at(s) for s in (0.5, 1.0, 1.01)] == [0.0, 0.0, 1.0]  # none: all or nothing at 1
    for bad in (((2.0, 0.5), (1.0, 1.0)), ((1.0, 1.5),), ((0.0, 0.5),)):
        with pytest.raises(ValueError, match="lone_done_share"):
            CostModel(lone_done_share=bad)


def test_a_program_slotted_when_another_ends_waits_for_the_ending_to_be_known_and_for_its_order() -> None:
    """Proportional share keeps a third program queued while two hold the device; it is slotted
    once the scheduler learns that the first ended (the done wait after it, for a call that
    travelled alone), and its order then costs the late-order CPU before it may run."""
    from dataclasses import replace

    topo, prog = _one_gang(1e-3)

    def once(h: Any) -> Any:
        yield from h.result((yield from h.call(prog)))
        h.mark("end")

    def ends(costs: CostModel) -> list[float]:
        result = simulate(topo, [ClientScript(n, once) for n in "abc"], costs, policy="proportional")
        assert result.stats["scheduler"]["late"] == 1
        return sorted(t.marks["end"] for t in result.tenants.values())

    assert ends(FREE) == pytest.approx([1e-3, 2e-3, 3e-3])
    # slotted at 1 ms, ordered at 1 + 2 = 3 ms, run from 3 to 4 ms
    assert ends(replace(FREE, late_order_host_s=2e-3)) == pytest.approx([1e-3, 2e-3, 4e-3])
    # a ends at 1 ms and the scheduler learns of it at 1 + 0.5 + 1 = 2.5 ms; b ends at 2 ms
    assert ends(replace(FREE, done_wait_s=0.5e-3, done_wait_host_s=1e-3)) == pytest.approx([1e-3, 2e-3, 3.5e-3])
    # a fourth client: c is slotted at 1 ms while d still waits, so its order costs 2 ms more
    # (ordered at 3 ms, run from 3 to 4); d is slotted at 2 ms with none waiting, and runs after c
    result = simulate(topo, [ClientScript(n, once) for n in "abcd"], replace(FREE, late_order_waiting_s=2e-3),
                      policy="proportional")
    assert sorted(t.marks["end"] for t in result.tenants.values()) == pytest.approx([1e-3, 2e-3, 4e-3, 5e-3])


def test_gpipe_efficiency_is_m_over_m_plus_s_minus_1() -> None:
    stages, micro = 4, 8
    topo = pw.Topology(islands=1, hosts_per_island=stages, devices_per_host=1)
    meshes = [abstract_mesh(topo, {"d": 1}, first=s) for s in range(stages)]
    fwd = function(lambda w, x: x * w, in_specs=(P(), P()), out_specs=P(), cost=1e-3, name="f")
    bwd = function(lambda w, x, dy: (dy * x, dy * w), in_specs=(P(), P(), P()), out_specs=(P(), P()), cost=2e-3,
                   name="b")
    loss = function(lambda y, t: (np.mean(y - t), y - t), in_specs=(P(), P()), out_specs=(P(), P()), name="l")
    pipe = Pipeline([Stage(fwd, bwd, m) for m in meshes], loss, micro, schedule="gpipe", accumulate="final")
    params = [AbstractArray((4,), "f8", m) for m in meshes]
    xs = [AbstractArray((4,), "f8", meshes[0]) for _ in range(micro)]
    ys = [AbstractArray((4,), "f8", meshes[-1]) for _ in range(micro)]
    result = _one_call(topo, traced(pipe.program, topo, *params, *xs, *ys))
    makespan = result.by_name("a").marks["end"]
    assert micro * 3e-3 / makespan == pytest.approx(micro / (micro + stages - 1), rel=1e-2)


def test_proportional_share_gives_the_weights() -> None:
    topo = pw.Topology(islands=1, hosts_per_island=2, devices_per_host=2)
    costs = CostModel.load().cluster()
    # gangs long enough that the devices, not the control plane, are the bottleneck: a backlog to share
    got, _ = shares(topo, costs, (1, 3), cost=1e-2, gangs=4, inflight=4, seconds=5.0)
    assert got == pytest.approx([0.25, 0.75], abs=0.03)
    fifo, _ = shares(topo, costs, (1, 1), cost=1e-2, gangs=4, inflight=4, seconds=5.0)
    assert fifo == pytest.approx([0.5, 0.5], abs=0.03)


def test_reach_95_interpolates_on_a_log_scale() -> None:
    assert reach_95([1e-3, 1e-2, 1e-1], [10, 90, 100], [100, 100, 100]) == pytest.approx(1e-2 * 10 ** 0.5)
    assert reach_95([1e-3], [10], [100]) is None


def test_chained_gangs_take_their_modelled_time_on_the_real_system_and_in_the_simulation() -> None:
    """Chained 10 ms gangs on the default topology, pathdask and the multi-controller: neither the
    real system nor the simulation runs them faster than their modelled time (100 gangs/s), and
    the simulation, whose control costs are far below 10 ms, stays near that bound.

    How near the real system comes depends on how fast this machine's CPU runs now (a slow
    one turns even 10 ms gangs CPU-bound), so that is ``pathdask simulate validate``'s to
    report, not a test's to assert."""
    from pathdask.bench.dispatch import Kernels, _mc_run, _pathdask_run
    from pathdask.system import LocalSystem, default_topology

    topo, k, cost = default_topology(), 16, 1e-2
    costs = CostModel.load().embedded()
    programs = dispatch_programs(topo, cost, k)
    kernels = Kernels(cost, k)
    with LocalSystem(topo, processes=False, dashboard_address=None) as system:
        client = system.client(name="validate")
        mesh = client.mesh({"x": topo.devices_per_island}, island=0)
        x = client.put(np.zeros(mesh.size), mesh, P("x"))
        for name, run in (("pathdask", lambda: _pathdask_run(kernels, x, "Chained", "parallel")),
                          ("multi-controller", lambda: _mc_run(client, kernels, x, "Chained"))):
            run()
            real = k / min(run() for _ in range(2))
            sim, _ = dispatch_rate(topo, costs, programs, "Chained", k, name)
            assert 0 < real <= 1 / cost and 0.8 / cost < sim <= 1 / cost, (name, real, sim)


@pytest.mark.slow
def test_calibration_measures_every_cost_on_the_real_system_and_the_model_runs_on_them(tmp_path: Any) -> None:
    """``pathdask simulate --calibrate`` at its smallest: every timing on meshes of 1, 2 and 4
    hosts of a real embedded system, fitted into a calibration file the model runs on."""
    from pathdask.simulate.calibrate import HOSTS, calibrate
    from pathdask.system import default_topology

    path = str(tmp_path / "calibration.json")
    lines: list[str] = []
    costs = calibrate(path, k=16, repeats=1, echo=lines.append)
    assert CostModel.load(path) == costs and lines[-1] == f"wrote {path}"
    raw = costs.source["raw"]
    for hosts in HOSTS:  # each timing measured, each positive
        timed = raw[str(hosts)]
        assert all(timed.get(n, 0) > 0 for n in ("call", "opbyop", "take", "dispatch1", "dispatchk", "chained",
                                                 "fused", "single", "result", "lone", "mc")), timed
    assert costs.reference_s == raw["reference_s"] > 0
    # the fan-out trees, on a system of 8 hosts: each mesh's calls sent directly, then down trees
    tree = raw["tree"]
    for hosts in ("2", "4", "8"):
        assert tree[hosts]["direct"]["fanned"] == 0 and tree[hosts]["tree"]["fanned"] == 1
        assert tree[hosts]["tree"]["fan"] > 0 and tree[hosts]["tree"]["subtree"] > 0 and tree[hosts]["direct"]["fan"] == 0
    # each child costs its relay something; the ending's share may fit to 0 on so few calls: a tree's
    # ending up replaces the scheduler's reading of each host's, at about the same cost
    assert costs.relay_forward_s > 0 and costs.relay_done_s >= 0 and "measured with the rest" in costs.source["fanout"]
    # the handler's take-in is measured, and is a part of the scheduler's CPU per call
    take, after = costs.scheduler_s(2)
    assert 0 < take < take + after and costs.scheduler_s(2, lone=True)[1] == 0.0
    topo = default_topology()
    rate, _ = dispatch_rate(topo, costs.embedded(), dispatch_programs(topo, 1e-3, 16), "OpByOp", 16)
    assert 0 < rate < 1e3  # at most one 1 ms gang per ms


def test_a_calibration_line_never_gives_a_negative_cost() -> None:
    """Noise can tilt a fitted line below zero, at its intercept or everywhere: costs stay at least 0."""
    from pathdask.simulate.calibrate import _line

    assert _line([1, 2, 4], [1.0, 2.0, 4.0]) == pytest.approx((0.0, 1.0))
    assert _line([1, 2, 4], [-1.0, -2.0, -3.0]) == (0.0, 0.0)  # falling: the mean, at least 0
    assert _line([1, 2, 4], [-3.0, -2.0, -1.5]) == (0.0, 0.0)  # rising, but below 0 throughout
    assert _line([1, 2, 4], [0.5, 2.0, 5.0])[0] == 0.0


def test_a_processor_runs_work_in_the_free_time_around_work_booked_ahead() -> None:
    """Work ready before a span booked ahead (a gang's, booked when its program started) runs in
    the gaps around it, not after everything booked; zero work waits until the processor is free."""
    from pathdask.simulate.clock import Processor

    p = Processor("one")
    assert p.book(0.0, 1.0) == 1.0
    assert p.book(3.0, 1.0) == 4.0  # booked ahead: busy 0-1 and 3-4
    assert p.book(0.5, 1.5) == 2.5  # from the end of the first span, in the gap
    assert p.book(0.0, 1.0) == 4.5  # half in the gap 2.5-3, the rest after the span 3-4
    assert p.book(2.0, 0.0) == 4.5  # nothing to do, but not before the processor is free
    assert p.free_at == 4.5 and p.busy_s == 4.5


def test_work_booked_late_runs_after_what_held_the_processor_meanwhile() -> None:
    """Once the clock passed a span, work ready before its end (booked late: a program's devices
    on a host that had it before its other hosts) runs after it, not in the past over it."""
    from pathdask.simulate.clock import Processor

    now = [0.0]
    p = Processor("one", lambda: now[0])
    assert p.book(0.0, 1.0) == 1.0  # another host's dispatch, 0-1
    now[0] = 1.5  # the program starts once every host has it
    assert p.book(0.2, 0.3) == pytest.approx(1.3)  # ready at 0.2, but the processor was busy until 1
    assert p.book(1.4, 0.1) == pytest.approx(1.5)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this platform cannot pin threads")
def test_one_cpu_pins_every_thread_and_those_started_inside_then_lets_them_go() -> None:
    """Calibration and validation measure the one-process system on one CPU, as the model has it."""
    import threading

    from pathdask.simulate.measure import one_cpu

    allowed = os.sched_getaffinity(0)
    waiting = threading.Event()
    before = threading.Thread(target=waiting.wait)  # a thread that exists already
    before.start()
    seen: list[set[int]] = []
    try:
        with one_cpu(echo=lambda _: None) as cpu:
            assert cpu in allowed
            inside = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
            inside.start()
            inside.join()
            assert seen == [{cpu}]
            assert before.native_id is not None and os.sched_getaffinity(before.native_id) == {cpu}
            assert os.sched_getaffinity(0) == {cpu}
        assert os.sched_getaffinity(0) == allowed
        assert os.sched_getaffinity(before.native_id) == allowed
        with one_cpu(-1, echo=lambda _: None) as cpu:  # -1: leave the threads where they are
            assert cpu is None and os.sched_getaffinity(0) == allowed
        with pytest.raises(ValueError, match="not one this process may use"):
            with one_cpu(max(allowed) + 1, echo=lambda _: None):
                pass
    finally:
        waiting.set()
        before.join()


def test_costs_at_another_speed_scale_every_cost_by_the_speed_ratio() -> None:
    """The model's costs are seconds of the calibration's CPU; on a CPU half as fast each is doubled."""
    from dataclasses import fields

    costs = CostModel(reference_s=1e-3, shared_cpu=True)
    slow = costs.at_speed(2e-3)
    assert slow.reference_s == 2e-3 and slow.shared_cpu
    for f in fields(CostModel):
        if f.name.endswith("_s") and f.name != "reference_s":
            assert getattr(slow, f.name) == pytest.approx(2 * getattr(costs, f.name)), f.name
    assert CostModel().at_speed(2e-3) == CostModel()  # a calibration with no speed on record stays as it is
    assert costs.at_speed(0.0) == costs


def test_the_speed_meter_times_its_work_in_its_own_thread_while_a_measurement_runs() -> None:
    import threading
    import time

    from pathdask.simulate.measure import SpeedMeter

    with SpeedMeter() as meter:
        def until_sampled(n: int) -> str:
            deadline = time.monotonic() + 30
            while len(meter.samples) < n and time.monotonic() < deadline:
                threading.Event().wait(meter.period)
            return "done"

        result, speed = meter.during(until_sampled, 3)
        assert result == "done" and len(meter.samples) >= 3
        assert speed > 0 and min(meter.samples) <= speed <= max(meter.samples)
        assert meter.since(meter.mark()) > 0  # no sample yet: one is taken
        # a run made while the CPU ran far from the speed asked for is made again, up to ``tries`` runs
        runs: list[int] = []
        result, _ = meter.during(lambda: runs.append(1) or len(runs), near=speed * 1e-6)
        assert len(runs) == meter.tries == meter.redone + 1 and result in range(1, meter.tries + 1)
        meter.during(lambda: runs.append(1), near=0.0)  # any speed: once
        assert len(runs) == meter.tries + 1
    assert not meter._thread.is_alive()
    # a CPU that spent half a run at each of two speeds did its work at their mean speed
    meter.samples = [4e-4, 8e-4, 8e-4, 4e-4]
    assert meter.since(0) == meter.mean() == pytest.approx(2 / (1 / 4e-4 + 1 / 8e-4))


def test_small_validation_runs_the_model_at_each_real_runs_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate(small=True)`` on real runs: each row keeps the CPU's speed during its runs and
    simulates at it; no 10 ms gang runs faster than its modelled time, real or simulated."""
    from dataclasses import replace

    from pathdask.simulate.measure import SpeedMeter
    from pathdask.simulate.validate import validate

    monkeypatch.setattr(SpeedMeter, "tries", 1)  # a calibration speed made up: no run made again
    costs = replace(CostModel.load(), reference_s=1e-3)
    out = validate(costs, small=True, echo=lambda _: None)
    rows = {r["configuration"]: r for r in out["rows"]}
    assert out["reference_s"] > 0 and out["speed_ratio_at_start"] > 0 and len(rows) == 24
    for r in rows.values():
        assert len(r["reference_s"]) == len(r["real_runs"]) == 1 and r["reference_s"][0] > 0
    opbyop = rows["dispatch pathdask OpByOp 1 ms"]
    speed = opbyop["reference_s"][0]
    # a CPU-bound row: at another speed than the calibration's, its simulated figure moves the other way
    assert (opbyop["simulated"] - opbyop["simulated_at_calibration"]) * (speed - 1e-3) < 0
    for r in rows.values():  # each row's error is that of its figures (how large: the command's to report)
        assert r["relative_error"] == pytest.approx(abs(r["simulated"] - r["real"]) / r["real"])
    for name in ("dispatch pathdask Chained 10 ms", "dispatch multi-controller Chained 10 ms"):
        assert 0 < rows[name]["real"] <= 100 and 0 < rows[name]["simulated"] <= 100, rows[name]  # 10 ms gangs
    # rows of clients that wait for their results time the hosts' handler of each one-call message
    waiting = [r for name, r in rows.items() if "waiting on results" in name]
    assert waiting and all(len(r["handler_cpu_s"]) == 1 and 0 < r["handler_cpu_s"][0] < 0.1 for r in waiting)
    assert all("handler_cpu_s" not in r for name, r in rows.items() if "waiting on results" not in name)
    # one island of 8 and of 16 hosts: above the default threshold (2), the real calls went down trees
    # (the row checks it), and so do the simulated ones
    at = {h: rows[f"{h} hosts x 1 device: dispatch pathdask OpByOp 1 ms"] for h in (8, 16)}
    assert all(r["tree"] is True and r["fanout"] == {"degree": 4, "threshold": 2} for r in at.values())
    # and the same calls with the scheduler's threshold above the hosts, in the runtime and the model
    assert all(rows[f"{h} hosts x 1 device: dispatch pathdask OpByOp 1 ms, no tree"]["tree"] is False for h in (8, 16))


def test_validation_warns_before_it_starts_when_the_cpu_runs_far_from_the_calibrations_speed() -> None:
    """Within twice the meter's tolerance the scaling holds and nothing is said; beyond it, either
    way, the warning names how far and what to do."""
    from pathdask.simulate.validate import far_from_calibration

    assert far_from_calibration(None, 0.15) is None
    assert far_from_calibration(1.25, 0.15) is None and far_from_calibration(1 / 1.25, 0.15) is None
    slow, fast = far_from_calibration(2.9, 0.15), far_from_calibration(0.5, 0.15)
    assert slow is not None and "2.90x as slowly" in slow and "--calibrate" in slow and "15%" in slow
    assert fast is not None and "2.00x as fast" in fast


def test_a_row_gives_the_spread_of_its_runs_and_of_their_rates_in_the_systems_own_work() -> None:
    """Two runs, one twice as fast as the other, whose hosts' handler took half the CPU per call:
    the machine ran at another speed, and in the system's own work the runs are alike."""
    from pathdask.simulate.validate import Run, _row

    rows: list[dict[str, Any]] = []
    _row(rows, "waiting", [Run(100.0, 1e-3, 2e-5), Run(50.0, 1e-3, 4e-5)], [90.0, 80.0, 70.0], lambda _: None)
    (row,) = rows
    assert row["real"] == 75.0 and row["simulated"] == 75.0 and row["handler_cpu_s"] == [2e-5, 4e-5]
    assert row["spread"] == pytest.approx(1 / 3) and row["spread_in_own_work"] == pytest.approx(0.0)
    _row(rows, "untimed", [Run(100.0, 1e-3), Run(50.0, 1e-3)], [90.0, 80.0, 70.0], lambda _: None)
    assert "handler_cpu_s" not in rows[1] and "spread" not in rows[1]


def test_the_handler_clock_times_the_hosts_messages_of_one_call() -> None:
    """A lone call reaches each of its two hosts as a message of one call: two samples of the
    handler's CPU. A burst of back-to-back calls goes partly in messages of several calls (the
    scheduler's slices), which it leaves out."""
    from pathdask.bench.dispatch import Kernels
    from pathdask.simulate.measure import HandlerClock, handled
    from pathdask.system import LocalSystem, default_topology

    with LocalSystem(default_topology(), processes=False, dashboard_address=None) as system:
        clock = HandlerClock(system)
        client = system.client(name="clock")
        mesh = client.mesh({"x": 4}, island=0)
        x = client.put(np.zeros(4), mesh, P("x"))
        kernels = Kernels(0.0, 32)

        kernels.step(x).result()  # traced and warm
        handled(client)
        mark = clock.mark()
        kernels.step(x).result()
        handled(client)
        assert clock.mark() - mark == len(mesh.hosts) == 2 and 0 < clock.since(mark) < 0.1
        mark = clock.mark()
        y = x
        for _ in range(32):
            y = kernels.step(y)
        y.result()
        handled(client)
        assert clock.mark() - mark < 32 * 2
        assert math.isnan(clock.since(clock.mark()))
        client.close()
