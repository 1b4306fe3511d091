"""The user-space delay line: frames between two namespaces really arrive late, in order, some lost.

The namespace tests need root, iproute2 and ``/dev/net/tun`` (skipped with the
reason where missing, failed when ``PATHDASK_REQUIRE_NETNS=1``); they build
links on the delay line even where the kernel has ``netem``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from pathdask.bench.delayline import echo_server, in_namespace
from pathdask.netns import LinkError, Network, Shape, delayline, delaylink
from pathdask.netns.delayline import DelayLineError, Params, update

from .netns_support import require_delay_line, require_namespaces


def test_parameters_are_checked_and_set_all_or_nothing():
    forth, back = Params(), Params()
    update(forth, back, "delay=0.002 loss=0.1 back_rate=1e9")
    assert (forth.delay, forth.loss, forth.rate, back.rate, back.delay) == (0.002, 0.1, None, 1e9, 0.0)
    for bad, says in (("delay=-1", "delay must be >= 0"), ("loss=2", "loss must be a share"),
                      ("jitter=1", "the keys are"), ("delay=soon", "expected key=number"),
                      ("rate=-5", "rate must be > 0")):
        with pytest.raises(DelayLineError, match=says):
            update(forth, back, f"delay=0.5 {bad}")
        assert forth.delay == 0.002  # nothing of a refused line is taken
    update(forth, back, "back_rate=0")
    assert back.rate is None


@pytest.fixture
def lines():
    require_namespaces()
    require_delay_line()
    with Network(delay_line=True) as net:
        yield net


def _rtts(net: Network, n: int = 60) -> list[float]:
    return list(in_namespace(net.machines["a"], "rtt", net.machines["b"], n))


@pytest.mark.timeout(120)
def test_a_round_trip_grows_by_twice_the_delay(lines):
    a, b = lines.add("a", 10), lines.add("b", 11)
    assert a.line is not None and b.line is not None
    with echo_server(b):
        base = statistics.median(_rtts(lines))
        for delay in (0.002, 0.02):
            lines.set_shape("a", Shape(delay=delay))  # a to b late, b to a on time
            lines.set_shape("b", Shape(delay=delay))  # and b to a as late: one delay each way
            rtts = _rtts(lines, 30)
            # never early: every round trip holds the delay twice (a median of the undelayed
            # line's wake-ups is not subtracted here: the delay hides some of them)
            assert min(rtts) >= 2 * delay - 1e-4, (delay, min(rtts))
            # late by no more than a loaded machine's wake-ups (at 20 ms, well short of a delay
            # applied twice each way)
            added = statistics.median(rtts) - base
            assert added <= 2 * delay + 10e-3, (delay, added, base)
    assert base < 10e-3, base  # the line itself, undelayed, adds no delay of its own


@pytest.mark.timeout(120)
def test_frames_keep_their_order_and_loss_drops_about_its_share(lines):
    a, b = lines.add("a", 10), lines.add("b", 11)
    with echo_server(b):
        assert len(in_namespace(a, "udp", b, 20)) == 20  # neighbours known, nothing lost yet
        lines.set_shape("a", Shape(delay=0.003, loss=0.2))  # three datagrams in flight at once
        n = 500
        back = in_namespace(a, "udp", b, n)
        stats = json.loads(a.line.stats()) if a.line else {}
    assert back == sorted(back), "the delay line reordered frames"
    lost = 1 - len(back) / n
    assert 0.12 <= lost <= 0.28, lost  # 0.2 give or take 4.5 standard deviations (0.018)
    assert stats["a_to_b"]["lost"] >= n - len(back), stats


@pytest.mark.timeout(120)
def test_the_line_paces_to_its_rate(lines):
    a, b = lines.add("a", 10), lines.add("b", 11)
    assert a.line is not None
    with echo_server(b):
        a.line.configure("rate=1e8")  # 100 Mbit/s from a to b, in the line itself
        rate = in_namespace(a, "send", b, 8 * 2**20) * 8
    assert 0.5e8 <= rate <= 1.02e8, rate


@pytest.mark.timeout(60)
def test_closing_stops_the_lines_and_their_taps_vanish(lines):
    a = lines.add("a", 10, Shape(delay=0.001))
    assert a.line is not None
    proc, taps = a.line.proc, (a.port, f"{a.port}x")
    assert Path("/sys/class/net", a.port).exists()
    lines.close()
    assert proc.poll() is not None
    assert not any(Path("/sys/class/net", t).exists() for t in taps)
    assert not Path("/run/netns", a.namespace).exists()


@pytest.mark.timeout(60)
def test_without_dev_net_tun_a_delay_is_a_clear_error(monkeypatch, lines):
    monkeypatch.setattr(delayline, "TUN_PATH", "/nonexistent/net/tun")
    assert "is missing" in (delaylink.tun_unavailable() or "")
    with pytest.raises(LinkError, match=r"needs a delay line \(delay 1 ms, loss 0%\).*/nonexistent/net/tun is missing.*modprobe tun"):
        lines.add("a", 10, Shape(delay=0.001))


@pytest.mark.timeout(60)
def test_a_line_that_cannot_start_says_why_and_leaves_nothing(lines):
    taken = lines.bridge  # a device of that name exists: the line cannot create its TAP
    with pytest.raises(LinkError, match=rf"exited \(2\) to start: delayline: TUNSETIFF '{taken}' failed"):
        delaylink.DelayLink(f"{taken}q", taken, Shape(delay=0.001))
    assert not Path("/sys/class/net", f"{taken}q").exists()
