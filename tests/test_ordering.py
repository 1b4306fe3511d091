"""One consistent order: with it, interleaved programs of two clients never deadlock;
without it (a test-only switch), the same workload does."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean

TRIALS = 100
JITTER = 0.004  # each host delays each dispatch by up to 4 ms, as independent controllers would


@pw.function(in_specs=P("x"), out_specs=P("x"))
def allreduce_add(b):
    return b + pw.psum(b, "x")


@pw.function(in_specs=P(("p", "q")), out_specs=P(("p", "q")))
def allreduce_add2(b):
    return b + pw.psum(b, ("p", "q"))


def run_trials(system: pw.LocalSystem, trials: int, timeout: float) -> tuple[int, list[str]]:
    """Run random interleavings; returns (trials that completed, clients used)."""
    rng = random.Random(7)
    a, b = system.client(name="alice"), system.client(name="bob")
    # both slices on island 0: they overlap on all four devices, across two hosts
    ma, mb = a.mesh({"x": 4}, island=0), b.mesh({"p": 2, "q": 2}, island=0)
    xa, xb = a.put(np.ones(4), ma, P("x")), b.put(np.ones(4), mb, P(("p", "q")))
    xa.result(), xb.result()  # without ordering, nothing else would keep readers after writers
    done = 0
    try:
        for _ in range(trials):
            n_a, n_b = rng.randint(1, 3), rng.randint(1, 3)
            outs: dict[str, list[pw.ShardedArray]] = {"a": [], "b": []}
            start = threading.Barrier(2)

            def submit(key, fn, x, n, start=start, outs=outs):
                start.wait()
                for _ in range(n):
                    outs[key].append(fn(x))

            threads = [threading.Thread(target=submit, args=("a", allreduce_add, xa, n_a)),
                       threading.Thread(target=submit, args=("b", allreduce_add2, xb, n_b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for y in outs["a"] + outs["b"]:
                np.testing.assert_array_equal(y.result(timeout=timeout), np.full(4, 5.0))
            done += 1
    except TimeoutError:
        pass
    finally:
        del xa, xb
        # Closing the clients drops their pending programs on every host, which is
        # also what releases devices stuck in a deadlocked collective.
        a.close()
        b.close()
    return done, [a.name, b.name]


def test_ordering_prevents_deadlock():
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None, dispatch_jitter=JITTER) as system:
        done, _ = run_trials(system, TRIALS, timeout=30)
        assert done == TRIALS
        assert_clean(system)


@pytest.mark.slow
def test_without_ordering_the_same_workload_deadlocks():
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None, dispatch_jitter=JITTER,
                        ordering=False) as system:
        done, _ = run_trials(system, TRIALS, timeout=2)
        assert done < TRIALS, "no deadlock in any trial: the ordering switch has no effect?"
        assert_clean(system)  # the deadlock was cleaned up: nothing left behind
