"""Checkpoints under faults, with worker processes: a host, or the client, killed at random moments
of a suspend. Every resume gives the old values or the new ones, never zeros, never a mix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pathdask as pw
from pathdask import P
from pathdask.protocol import WaitHostGone, WaitHosts, ask

from .conftest import SMALL, assert_clean

pytestmark = pytest.mark.slow


def values(version):
    """A version's state: every element non-zero and unlike any other version's."""
    w = 1000.0 * (version + 1) + np.arange(256 * 64, dtype=np.float64).reshape(256, 64)
    return {"w": w, "b": -w[0]}


def which_version(got, versions):
    """The one version every array of ``got`` equals, else fail: a mix, zeros, or other values."""
    for v in versions:
        if all(np.array_equal(got[k], a) for k, a in values(v).items()):
            return v
    raise AssertionError(f"resumed values are none of versions {versions}: w[::64, 0] = {got['w'][::64, 0]}, "
                         f"b[:3] = {got['b'][:3]}")


def resume_values(client, path):
    state = client.resume(path)
    got = {k: a.result(timeout=60) for k, a in state.items()}
    del state
    return got


def siblings(path):
    return sorted(n for n in os.listdir(path.parent) if n.startswith(path.name + ".pathdask-"))


def put(client, mesh, version):
    state = {"w": client.put(values(version)["w"], mesh, P("d")), "b": client.put(values(version)["b"], mesh, P())}
    for a in state.values():
        a.result()  # computed: the write is all that is in flight
    return state


@pytest.mark.timeout(300)
def test_a_host_killed_at_random_moments_of_a_checkpoint(tmp_path):
    """Seeded: half the kills come from inside the victim, before its k-th chunk write; half at a
    random time after the checkpoint starts, which may fall before, during or after the write."""
    rng = np.random.default_rng(20261203)

    def kill_before_chunk(k):  # runs in the victim's process
        from pathdask.worker import storage

        store, done = storage._store, [0]

        def store_or_die(*chunk):
            if done[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            done[0] += 1
            return store(*chunk)

        storage._store = store_or_die

    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        client = system.client(name="checkpointing")
        path = tmp_path / "state.zarr"
        mesh = client.mesh({"d": 4}, island=0)
        start = time.perf_counter()
        client.suspend(path, put(client, mesh, 0))
        span = time.perf_counter() - start
        committed, outcomes = 0, []
        for i in range(6):
            mesh = client.mesh({"d": 4}, island=0)  # two hosts, two shards of w each
            state = put(client, mesh, committed + 1)
            victim = mesh.hosts[int(rng.integers(len(mesh.hosts)))]
            pid = client.dask.run(os.getpid, workers=[victim])[victim]
            if i % 2 == 0:
                k = int(rng.integers(2))  # the victim writes 2 or 3 chunks (b goes once, from one host)
                client.dask.run(kill_before_chunk, k, workers=[victim])
                future = client.checkpoint(path, state)
            else:
                future = client.checkpoint(path, state)
                time.sleep(float(rng.uniform(0, 2 * span)))  # the random moment
                os.kill(pid, signal.SIGKILL)  # a worker this test started, by its PID
            del state
            try:
                future.result(timeout=60)
                outcome = "committed"
            except (pw.DeviceLostError, pw.CheckpointWriteError) as e:
                outcome = type(e).__name__
            client.dask.sync(ask, client.dask.scheduler, WaitHostGone(victim))  # it died ...
            client.dask.sync(ask, client.dask.scheduler, WaitHosts())  # ... and its nanny brought it back
            got = which_version(resume_values(client, path), [committed, committed + 1])
            assert outcome != "committed" or got == committed + 1, (i, outcome, got)
            if i % 2 == 0:
                assert got == committed, "a host killed mid-write, yet the new checkpoint was committed"
            outcomes.append((outcome, got))
            committed = got
        assert any(o != "committed" for o, _ in outcomes), outcomes
        client.suspend(path, put(client, client.mesh({"d": 4}), committed + 1))  # and no leftovers after
        assert siblings(path) == [os.readlink(path)]
        which_version(resume_values(client, path), [committed + 1])
        client.close()
        assert_clean(system)


CLIENT_SCRIPT = """
import sys
import numpy as np
import pathdask as pw
from pathdask import P
from pathdask.protocol import WaitHostGone, WaitHosts, ask
sys.path.insert(0, sys.argv[3])
from tests.test_checkpoint_faults import values
c = pw.connect(sys.argv[1], name="doomed")
mesh = c.mesh({"d": 4}, island=0)
version = int(sys.argv[4])
while True:
    v = values(version)
    c.suspend(sys.argv[2], {"w": c.put(v["w"], mesh, P("d")), "b": c.put(v["b"], mesh, P())})
    print(version, flush=True)
    version += 1
"""


@pytest.mark.timeout(300)
def test_a_client_killed_at_random_moments_of_its_suspends(tmp_path):
    """A client process suspends version after version to one path, and is killed at a random
    moment: the path then holds the last version it reported, or the one after, whole."""
    rng = np.random.default_rng(7)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    path = tmp_path / "state.zarr"
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None) as system:
        client = system.client(name="reader")
        committed = -1
        for _ in range(3):
            proc = subprocess.Popen([sys.executable, str(script), system.scheduler_address, str(path), root,
                                     str(committed + 1)], stdout=subprocess.PIPE, text=True)
            try:
                assert proc.stdout is not None
                committed = int(proc.stdout.readline())  # one suspend done: the next is under way
                time.sleep(float(rng.uniform(0, 0.5)))  # the random moment
            finally:
                proc.kill()  # a client process this test started
                out, _ = proc.communicate(timeout=30)
            reported = [committed, *map(int, out.split())]
            got = which_version(resume_values(client, path), [reported[-1], reported[-1] + 1])
            committed = got
        client.suspend(path, put(client, client.mesh({"d": 4}), committed + 1))
        assert siblings(path) == [os.readlink(path)]  # what the killed clients left is gone
        client.close()
        assert_clean(system)
