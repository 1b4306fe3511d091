"""Ray peers for the dispatch micro-benchmark (optional; needs ``pathdask[peers]``).

The micro-benchmark, as in the Pathways paper: ``participants`` processes each
hold a scalar. One *computation* (a step) is an all-reduce (sum) over every
participant followed by an add: each participant's new value is
``sum / participants + 1``. The output of one step is the input of the next,
``steps`` times in a row. Optionally every participant spends ``compute_s``
seconds of compute per step.

Ray has no modelled device, so the compute is a ``time.sleep(compute_s)`` in the
participant (like pathdask's modelled time it does not load the host CPU; unlike
it, ``time.sleep`` may overshoot by tens of microseconds).

Three Ray variants are measured, each warmed up first, and reported in steps/s:

``ray_tasks``
    Plain remote tasks. Per step one task per participant (``sum_prev / N + 1``,
    then the compute) and one reduce task, chained by ObjectRefs. All steps are
    submitted at once and the driver waits only for the last one (Ray's best
    case: asynchronous chained dispatch). Participant tasks ask for
    ``num_cpus / participants`` CPUs (at most 1) so that all participants of a
    step can run at once on a ``num_cpus`` node.
``ray_actors``
    ``participants`` actors holding their value and one reducer actor. Per step
    the driver calls ``contribute()`` on every participant (the compute), passes
    the results to ``reducer.reduce()``, and hands the reduced ObjectRef to every
    participant's ``update()``. Also submitted all at once, one wait at the end.
``ray_compiled_graph``
    Ray Compiled Graphs (``ray.dag.InputNode`` / ``MultiOutputNode`` /
    ``experimental_compile()``): the same participant actors and reducer actor,
    one compiled execution per step; the driver reads each step's outputs and
    feeds them into the next ``execute()`` (step by step, as the benchmark
    defines it).

Housekeeping, from measurements with Ray 2.60:

- Compiled-graph actors busy-poll their channels (about two cores busy while
  idle), so the compiled graph runs last and is torn down, and ``ray.shutdown()``
  runs in a ``finally``.
- Ray leaves ``sem.*`` files in ``/dev/shm`` (``sem.hdr<raylet pid>-<n>`` and
  ``sem.obj<raylet pid>-<n>``); the ones that appeared during the run and are
  named after one of this run's Ray processes are removed afterwards. Files that
  existed before, and those of a concurrent Ray instance, are left alone.
- Ray writes an auth token under ``$HOME/.ray`` and sets ``RAY_*`` environment
  variables in the driver: ``HOME`` points at a temporary directory for the run
  (Ray's session files go there too, instead of ``/tmp/ray``), the environment
  is restored after, and Ray's in-process token cache is reset so that a second
  run in the same process works.
- Ray is started locally only (``address="local"``), without dashboard or usage
  stats.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["RAY_MISSING", "run_ray"]

RAY_MISSING = "Ray is not installed; `pip install 'pathdask[peers]'` adds it"

_SHM = "/dev/shm"
_WARMUP_STEPS = 4


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(RAY_MISSING) from e
    return ray


def _shm_sems() -> set[str]:
    try:
        return {n for n in os.listdir(_SHM) if n.startswith("sem.")}
    except OSError:
        return set()


# Ray's object store names its semaphores ``sem.hdr<pid>-<n>`` / ``sem.obj<pid>-<n>``.
_SEM_PID = re.compile(r"^sem\.[A-Za-z]+(\d+)-")


def _descendant_pids() -> set[int] | None:
    """PIDs of this process's descendants (Ray's raylet, GCS, workers); None if unknown."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with distributed
        return None
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:  # pragma: no cover
        return None


def _remove_new_sems(before: set[str], ray_pids: set[int] | None) -> None:
    """Unlink the ``sem.*`` files in /dev/shm that appeared since ``before``.

    When the PIDs of this run's Ray processes are known, only semaphores named
    after one of them are removed, so that a concurrent Ray instance (another
    benchmark on the same machine) keeps its own.
    """
    for name in _shm_sems() - before:
        if ray_pids is not None:
            m = _SEM_PID.match(name)
            if m is None or int(m.group(1)) not in ray_pids:
                continue
        try:
            os.unlink(os.path.join(_SHM, name))
        except OSError:
            pass


def _reset_ray_auth_cache() -> None:
    """Forget the auth token Ray cached in this process (it lives in the temporary HOME).

    Without this a second run in the same process reuses the first run's token,
    which no longer exists on disk, and the new GCS never starts.
    """
    try:
        raylet = importlib.import_module("ray._raylet")
        raylet.AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # older or newer Ray: nothing to reset
        pass


@contextmanager
def _isolated_ray_env() -> Iterator[tuple[str, dict[str, set[int] | None]]]:
    """A temporary ``HOME`` (and Ray temp dir) for the run; restores the environment after.

    Yields the temporary directory and a dict whose ``"pids"`` the caller sets to
    the PIDs of the Ray processes it started, or to None when they are unknown
    (see :func:`_remove_new_sems`).
    """
    saved_env = dict(os.environ)
    # Ray warns, once per ray.init, that it enabled token auth by default; that is expected here.
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    saved_level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    sems_before = _shm_sems()
    ray_pids: dict[str, set[int] | None] = {"pids": set()}
    tmp_home = tempfile.mkdtemp(prefix="pdray-")
    os.environ["HOME"] = tmp_home
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    _reset_ray_auth_cache()
    try:
        yield tmp_home, ray_pids
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        auth_log.setLevel(saved_level)
        _reset_ray_auth_cache()
        _remove_new_sems(sems_before, ray_pids["pids"])
        shutil.rmtree(tmp_home, ignore_errors=True)


def _expected(initial: list[float], steps: int) -> float:
    """Every participant's value after ``steps`` steps (all equal after the first)."""
    return sum(initial) / len(initial) + steps


def _check(values: list[float], initial: list[float], steps: int, variant: str) -> None:
    want = _expected(initial, steps)
    if not all(math.isclose(v, want, rel_tol=1e-9) for v in values):
        raise RuntimeError(f"{variant}: wrong result {values!r}, expected {want} everywhere")


def _rate(steps: int, seconds: float) -> float:
    return steps / seconds if seconds > 0 else math.inf


def _bench_tasks(ray: Any, steps: int, participants: int, compute_s: float, num_cpus: int) -> float:
    n = participants

    def participant(prev_sum: float, n: int, compute_s: float) -> float:
        value = prev_sum / n + 1.0
        if compute_s > 0:
            time.sleep(compute_s)
        return value

    def reduce(*values: float) -> float:
        return float(sum(values))

    part_cpus = min(1.0, num_cpus / n)
    part_remote = ray.remote(num_cpus=part_cpus)(participant)
    reduce_remote = ray.remote(num_cpus=min(1.0, float(num_cpus)))(reduce)

    def run(k: int) -> float:
        # Start with the sum whose participants' first value is 1.0 each: sum = 0.
        total: Any = 0.0
        for _ in range(k):
            parts = [part_remote.remote(total, n, compute_s) for _ in range(n)]
            total = reduce_remote.remote(*parts)
        return float(ray.get(total))

    run(_WARMUP_STEPS)
    t0 = time.perf_counter()
    total = run(steps)
    elapsed = time.perf_counter() - t0
    # Each step's participant value is the previous one + 1, starting at 1: sum = n * steps.
    if not math.isclose(total, n * steps, rel_tol=1e-9):
        raise RuntimeError(f"ray_tasks: wrong result {total}, expected {n * steps}")
    return _rate(steps, elapsed)


class _Participant:
    """Holds one scalar; the methods the actor variants call."""

    def __init__(self, value: float, n: int, compute_s: float) -> None:
        self.value = value
        self.n = n
        self.compute_s = compute_s

    def reset(self, value: float) -> float:
        self.value = value
        return value

    def contribute(self) -> float:
        if self.compute_s > 0:
            time.sleep(self.compute_s)
        return self.value

    def update(self, total: float) -> float:
        self.value = total / self.n + 1.0
        return self.value

    # Stateless pair for the compiled graph: the driver feeds values through.
    def compute(self, value: float) -> float:
        if self.compute_s > 0:
            time.sleep(self.compute_s)
        return value

    def add(self, total: float) -> float:
        return total / self.n + 1.0


class _Reducer:
    def reduce(self, *values: float) -> float:
        return float(sum(values))


def _bench_actors(ray: Any, actors: list[Any], reducer: Any, steps: int, initial: list[float]) -> float:
    def run(k: int) -> list[float]:
        ray.get([a.reset.remote(v) for a, v in zip(actors, initial)])
        outs: list[Any] = []
        for _ in range(k):
            parts = [a.contribute.remote() for a in actors]
            total = reducer.reduce.remote(*parts)
            outs = [a.update.remote(total) for a in actors]
        return [float(v) for v in ray.get(outs)]

    run(_WARMUP_STEPS)
    t0 = time.perf_counter()
    values = run(steps)
    elapsed = time.perf_counter() - t0
    _check(values, initial, steps, "ray_actors")
    return _rate(steps, elapsed)


def _bench_compiled(ray: Any, actors: list[Any], reducer: Any, steps: int, initial: list[float]) -> float:
    from ray.dag import InputNode, MultiOutputNode

    with InputNode() as inp:
        parts = [a.compute.bind(inp[i]) for i, a in enumerate(actors)]
        total = reducer.reduce.bind(*parts)
        dag = MultiOutputNode([a.add.bind(total) for a in actors])
    compiled = dag.experimental_compile()
    try:

        def run(k: int) -> list[float]:
            values = list(initial)
            for _ in range(k):
                values = ray.get(compiled.execute(*values))
            return [float(v) for v in values]

        run(_WARMUP_STEPS)
        t0 = time.perf_counter()
        values = run(steps)
        elapsed = time.perf_counter() - t0
    finally:
        compiled.teardown()
    _check(values, initial, steps, "ray_compiled_graph")
    return _rate(steps, elapsed)


def run_ray(
    steps: int = 128, participants: int = 4, compute_s: float = 0.0, num_cpus: int = 2
) -> dict[str, Any]:
    """Steps/s of the dispatch micro-benchmark for three Ray variants.

    Returns ``{"ray_tasks": float, "ray_actors": float, "ray_compiled_graph": float,
    "ray_version": str}``. Raises ``ImportError`` (message :data:`RAY_MISSING`)
    when Ray is not installed. Starts and shuts down a private local Ray
    instance; do not call it while this process is already connected to Ray.
    """
    if steps < 1 or participants < 1 or compute_s < 0 or num_cpus < 1:
        raise ValueError("need steps >= 1, participants >= 1, compute_s >= 0, num_cpus >= 1")
    ray = _import_ray()
    if ray.is_initialized():
        raise RuntimeError("run_ray starts its own local Ray instance; this process is already connected")

    initial = [float(i) for i in range(participants)]
    result: dict[str, Any] = {"ray_version": str(ray.__version__)}
    with _isolated_ray_env() as (tmp_home, ray_pids):
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _temp_dir=os.path.join(tmp_home, "ray"),
            )
            result["ray_tasks"] = _bench_tasks(ray, steps, participants, compute_s, num_cpus)

            participant_cls = ray.remote(num_cpus=0)(_Participant)
            reducer_cls = ray.remote(num_cpus=0)(_Reducer)
            actors = [participant_cls.remote(v, participants, compute_s) for v in initial]
            reducer = reducer_cls.remote()
            ray.get([a.reset.remote(v) for a, v in zip(actors, initial)])

            result["ray_actors"] = _bench_actors(ray, actors, reducer, steps, initial)
            # Last: compiled-graph actors busy-poll until teardown.
            result["ray_compiled_graph"] = _bench_compiled(ray, actors, reducer, steps, initial)
        finally:
            # Taken before shutdown, while Ray's processes still exist; None (unknown)
            # makes the cleanup remove every new sem.* file.
            ray_pids["pids"] = _descendant_pids()
            ray.shutdown()
    return result


def _main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--participants", type=int, default=4)
    p.add_argument("--compute-s", type=float, default=0.0)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--json", action="store_true", help="Print JSON (for run_ray_isolated).")
    a = p.parse_args(argv)
    result = run_ray(steps=a.steps, participants=a.participants, compute_s=a.compute_s, num_cpus=a.num_cpus)
    if a.json:
        import json

        print(json.dumps(result))
    else:
        print(result)


def run_ray_isolated(steps: int = 128, participants: int = 4, compute_s: float = 0.0,
                     num_cpus: int = 2) -> dict[str, Any]:
    """:func:`run_ray` in a fresh process, so that no thread of ours (the Dask client's
    event loop, say) competes with Ray's busy-polling Compiled Graph actors and driver."""
    import json
    import subprocess
    import sys

    try:
        import ray  # noqa: F401
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    out = subprocess.run(
        [sys.executable, "-m", "pathdask.bench.ray_peers", "--json", "--steps", str(steps),
         "--participants", str(participants), "--compute-s", str(compute_s), "--num-cpus", str(num_cpus)],
        capture_output=True, text=True, timeout=600, check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    _main()
