"""The island scheduler's policies, without a cluster: order, shares and dependencies."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathdask.core.order import IslandScheduler, Submission, make_policy


def sub(pid, client, devices=(0, 1), cost=1.0, deps=()):
    return Submission(pid, client, {"h": list(devices)}, cost, frozenset(deps))


def test_fifo_slots_at_once_in_arrival_order():
    s = IslandScheduler("fifo")
    slotted = [x for i in range(5) for x in s.submit(sub(f"p{i}", "a" if i % 2 else "b"), 1.0)]
    assert [(slot, x.pid) for slot, x in slotted] == [(i, f"p{i}") for i in range(5)]


@pytest.mark.parametrize("weights", [(1, 1, 1, 1), (1, 2, 4, 8)])
def test_proportional_share_follows_weights(weights):
    s = IslandScheduler("proportional")
    clients = [f"c{i}" for i in range(len(weights))]
    for n in range(200):  # every client keeps a backlog
        for c, w in zip(clients, weights):
            s.submit(sub(f"{c}-{n}", c), w)
    ran: Counter[str] = Counter()
    for _ in range(300):  # the devices finish programs one at a time, in slot order
        pid = next(iter(s.inflight))
        ran[s.inflight[pid].client] += 1
        s.host_done(pid, "h")
    total = sum(ran.values())
    for c, w in zip(clients, weights):
        assert ran[c] / total == pytest.approx(w / sum(weights), rel=0.05), (c, ran)


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"'lottery'.*\['fifo', 'proportional'\]"):
        make_policy("lottery")


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(["fifo", "proportional"]), data=st.data())
def test_never_slotted_before_its_producers(policy, data):
    """Random programs of random clients, each reading earlier programs' outputs."""
    s = IslandScheduler(policy)
    n = data.draw(st.integers(1, 40))
    slot_of: dict[str, int] = {}
    programs = []
    for i in range(n):
        deps = data.draw(st.sets(st.sampled_from([p.pid for p in programs]), max_size=3)) if programs else set()
        devices = data.draw(st.sets(st.integers(0, 3), min_size=1, max_size=4))
        p = sub(f"p{i}", data.draw(st.sampled_from("abc")), sorted(devices), data.draw(st.floats(0, 1)), deps)
        programs.append(p)
        for slot, x in s.submit(p, data.draw(st.sampled_from([1.0, 2.0, 4.0]))):
            slot_of[x.pid] = slot
        while data.draw(st.booleans()) and s.inflight:  # some programs finish meanwhile
            for slot, x in s.host_done(data.draw(st.sampled_from(sorted(s.inflight))), "h"):
                slot_of[x.pid] = slot
    while s.inflight:
        for slot, x in s.host_done(sorted(s.inflight)[0], "h"):
            slot_of[x.pid] = slot
    assert set(slot_of) == {p.pid for p in programs}, "every program got a slot"
    for p in programs:
        for d in p.deps:
            assert slot_of[d] < slot_of[p.pid]
    # a client's own programs keep their order
    for c in "abc":
        mine = [slot_of[p.pid] for p in programs if p.client == c]
        assert mine == sorted(mine)


def test_programs_slotted_after_their_submission_count_as_late():
    """Those are the programs whose orders go to their hosts apart from their calls."""
    s = IslandScheduler("proportional")
    for i in range(3):
        s.submit(sub(f"a{i}", "a"), 1.0)
    assert set(s.inflight) == {"a0", "a1"} and s.late == 0  # the window of 2 is full
    assert [x.pid for _, x in s.host_done("a0", "h")] == ["a2"]
    assert s.late == 1 and s.info()["late"] == 1
    fifo = IslandScheduler("fifo")
    for i in range(3):
        fifo.submit(sub(f"a{i}", "a"), 1.0)
    assert fifo.late == 0


def test_the_policy_changes_only_while_no_program_waits():
    s = IslandScheduler("proportional")
    for i in range(3):
        s.submit(sub(f"a{i}", "a"), 1.0)
    with pytest.raises(RuntimeError, match="1 program.*wait for a slot under 'proportional'"):
        s.use("fifo")
    s.host_done("a0", "h")
    s.use("fifo")
    assert s.info()["policy"] == "fifo"
    assert [x.pid for _, x in s.submit(sub("a3", "a"), 1.0)] == ["a3"]  # no window any more


def test_a_closed_clients_programs_release_the_window():
    s = IslandScheduler("proportional")
    for i in range(4):
        s.submit(sub(f"a{i}", "a"), 1.0)
    s.submit(sub("b0", "b"), 1.0)
    assert "b0" not in s.inflight  # the devices' window is full of a's programs
    slotted = s.drop_client("a")
    assert [x.pid for _, x in slotted] == ["b0"]


def test_a_lost_host_drops_the_waiting_programs_that_use_it():
    s = IslandScheduler("proportional")
    for i in range(3):
        s.submit(Submission(f"a{i}", "a", {"h": [0, 1]}, 1.0), 1.0)
    s.submit(Submission("other", "b", {"g": [2]}, 1.0), 1.0)
    assert set(s.inflight) == {"a0", "a1", "other"}  # a2 waits: window of 2 per device
    dropped, slotted = s.host_lost("h")
    assert [x.pid for x in dropped] == ["a2"]
    assert slotted == [] and set(s.inflight) == {"other"}
    assert len(s.policy) == 0


def test_a_program_dropped_before_its_slot_takes_the_programs_waiting_on_it_along():
    """A waiting program whose dispatch failed leaves the queue with the programs waiting that
    read its outputs, in turn: left waiting, they would be slotted next with no order of their
    producer ahead of them, to read buffers that will never be computed."""
    s = IslandScheduler("proportional")
    for i in range(2):
        s.submit(sub(f"a{i}", "a"), 1.0)  # the devices' window is full
    s.submit(sub("p", "a"), 1.0)
    s.submit(sub("r1", "a", deps=["p"]), 1.0)
    s.submit(sub("r2", "a", deps=["r1"]), 1.0)
    s.submit(sub("other", "a"), 1.0)
    assert set(s.waiting) == {"p", "r1", "r2", "other"}
    assert [x.pid for x in s.fail("p")] == ["p", "r1", "r2"]
    assert s.waiting == {"other"} and [x.pid for x in s.policy.waiting()] == ["other"]
    assert [x.pid for x in s.fail("a0")] == ["a0"]  # slotted: it stays until its hosts popped it
    assert s.fail("gone") == []


def test_a_lost_host_drops_the_programs_waiting_on_the_programs_it_drops():
    s = IslandScheduler("proportional")
    for i in range(2):
        s.submit(Submission(f"a{i}", "a", {"h": [0], "g": [1]}, 1.0), 1.0)
    s.submit(Submission("p", "a", {"h": [0]}, 1.0), 1.0)
    s.submit(Submission("r", "a", {"g": [1]}, 1.0, frozenset({"p"})), 1.0)
    dropped, slotted = s.host_lost("h")
    assert [x.pid for x in dropped] == ["p", "r"]  # r does not use h, but reads what p would make
    assert slotted == [] and not s.waiting
