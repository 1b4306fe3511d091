"""The optional Ray peers of the dispatch benchmark (skipped where Ray is not installed)."""

from __future__ import annotations

import math
import os

import pytest

from pathdask.bench.ray_peers import RAY_MISSING, run_ray

VARIANTS = ("ray_tasks", "ray_actors", "ray_compiled_graph")


def _sems() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("sem.")}
    except OSError:
        return set()


def test_missing_ray_message() -> None:
    assert "pip install 'pathdask[peers]'" in RAY_MISSING


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_ray_small() -> None:
    ray = pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    children_before = {c.pid for c in me.children(recursive=True)}
    sems_before = _sems()
    home_before = os.environ.get("HOME")

    result = run_ray(steps=16, participants=2)

    assert result["ray_version"] == ray.__version__
    for name in VARIANTS:
        rate = result[name]
        assert isinstance(rate, float), (name, rate)
        assert math.isfinite(rate) and rate > 0, (name, rate)
    assert set(result) == {*VARIANTS, "ray_version"}
    assert not ray.is_initialized()
    assert os.environ.get("HOME") == home_before

    # Ray's object store semaphores are named sem.hdr<raylet pid>-N / sem.obj<raylet pid>-N.
    left = {n for n in _sems() - sems_before if n.startswith(("sem.hdr", "sem.obj"))}
    assert not left, f"Ray left semaphores in /dev/shm: {sorted(left)}"

    _, alive = psutil.wait_procs(
        [c for c in me.children(recursive=True) if c.pid not in children_before], timeout=10
    )
    assert not alive, f"Ray left processes behind: {[(p.pid, p.name()) for p in alive]}"
