"""``pathdask bench checkpoint``: suspend and resume bandwidth beside ``numpy.save`` and ``numpy.load``,
and how long a training loop is blocked by an asynchronous checkpoint beside a synchronous suspend.

On one island of 2 hosts x 4 devices (one worker process per host), a float64
state sharded over the 8 devices is suspended to a zarr checkpoint (each host
writes its own shards) and resumed (each device reads its block), in GB/s of
the state's bytes. Beside it, in the same run and the same folder, the same
bytes are written with ``numpy.save`` and read with ``numpy.load`` by one
process.

Then a training loop: each round checkpoints the state, then runs ``steps``
steps that update it (``x = x * 0.5 + 1``, real arithmetic on every device),
waiting for the last. Once with no checkpoint, once with ``client.suspend(...,
release=False)`` (the loop waits for the commit), once with
``client.checkpoint`` (the loop goes on while the hosts write). For each it
reports how long the call blocked the loop and how long the round took; the
asynchronous checkpoint's commit is waited for after the round, and its values
are checked to be the state as it was when asked for. Writes ``checkpoint.json``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import P
from ..system import LocalSystem
from ..topology import Topology
from .report import table, write_json

MiB = 2**20


@dataclass
class Config:
    mib: int = 1024
    repeats: int = 2
    #: training steps per round of the loop
    steps: int = 3

    @classmethod
    def small(cls) -> Config:
        return cls(mib=16, repeats=1, steps=2)


def _best(step: Callable[[], Any], repeats: int) -> float:
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return float(best)


def run(cfg: Config, out: str = "bench-results", echo: Callable[[str], Any] = print,
        folder: str | None = None) -> dict[str, Any]:
    """Run the checkpoint benchmark in ``folder`` (a temporary one by default)."""
    nbytes = cfg.mib * MiB
    work = Path(tempfile.mkdtemp(prefix="pathdask-ckpt-", dir=folder))
    topo = Topology(islands=1, hosts_per_island=2, devices_per_host=4, hbm=max(64, 2 * cfg.mib) * MiB)
    data = np.random.default_rng(0).random(nbytes // 8).reshape(8, -1)
    try:
        np_file = work / "state.npy"
        t_save = _best(lambda: np.save(np_file, data), cfg.repeats)
        t_load = _best(lambda: np.load(np_file), cfg.repeats)
        with LocalSystem(topo, dashboard_address=None) as system:
            client = system.client(name="checkpoint")
            mesh = client.mesh({"d": 8})
            echo(f"pathdask bench checkpoint: {cfg.mib} MiB of float64 over {mesh.size} devices on "
                 f"{len(mesh.hosts)} hosts, in {work}")
            x = client.put(data, mesh, P("d"))
            x.result()

            def suspend() -> None:  # over the last one: which it then removes
                client.suspend(work / "state.zarr", {"x": x}, release=False)

            t_suspend = _best(suspend, cfg.repeats)

            def resume() -> None:
                y = client.resume(work / "state.zarr")["x"]
                _wait(y)
                y.delete()

            t_resume = _best(resume, cfg.repeats)
            if not np.array_equal(client.resume(work / "state.zarr")["x"].result(), data):
                raise AssertionError("resume gave back different bytes")
            loop, written = _training_loop(client, x, data, work, cfg)
            client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {"suspend (zarr, by the hosts)": nbytes / t_suspend / 1e9, "numpy.save": nbytes / t_save / 1e9,
             "resume (zarr, by the devices)": nbytes / t_resume / 1e9, "numpy.load": nbytes / t_load / 1e9}
    echo(table(["path", "GB/s"], [[k, v] for k, v in rates.items()]))
    echo(table([f"training loop: checkpoint, then {cfg.steps} steps", "blocked s", "round s"],
               [[k, v["blocked"], v["round"]] for k, v in loop.items()]))
    echo(f"the asynchronous checkpoint was committed {written:.3f} s after it was asked for")
    ratios = {"suspend_over_numpy_save": rates["suspend (zarr, by the hosts)"] / rates["numpy.save"],
              "resume_over_numpy_load": rates["resume (zarr, by the devices)"] / rates["numpy.load"],
              "checkpoint_blocked_over_suspend_blocked": loop["checkpoint (async)"]["blocked"]
              / loop["suspend (sync)"]["blocked"],
              "round_with_checkpoint_over_round_with_suspend": loop["checkpoint (async)"]["round"]
              / loop["suspend (sync)"]["round"],
              "round_with_checkpoint_over_round_without": loop["checkpoint (async)"]["round"]
              / loop["no checkpoint"]["round"]}
    echo("; ".join(f"{k} {v:.3g}" for k, v in ratios.items()))
    result = {"config": cfg.__dict__, "gb_per_s": rates, "training_loop_s": loop,
              "checkpoint_committed_after_s": written, "ratios": ratios}
    write_json(f"{out}/checkpoint.json", result)
    echo(f"wrote {out}/checkpoint.json")
    return result


def _training_loop(client: Any, x: Any, data: np.ndarray, work: Path,
                   cfg: Config) -> tuple[dict[str, dict[str, float]], float]:
    """Seconds a round blocks in its checkpoint call and takes in all, per way of checkpointing
    (best of ``cfg.repeats``); and when the asynchronous checkpoint was committed, from its call."""
    from .. import function

    update = function(lambda b: b * 0.5 + 1.0, in_specs=P("d"), out_specs=P("d"), name="train-step")
    best: dict[str, dict[str, float]] = {}
    written = np.inf
    for _ in range(cfg.repeats):
        for way in ("no checkpoint", "suspend (sync)", "checkpoint (async)"):
            state = x
            start = time.perf_counter()
            pending = None
            if way == "suspend (sync)":
                client.suspend(work / "loop.zarr", {"x": state}, release=False)
            elif way == "checkpoint (async)":
                pending = client.checkpoint(work / "loop.zarr", {"x": state})
            blocked = time.perf_counter() - start
            for _ in range(cfg.steps):
                state = update(state)
            _wait(state)
            times = {"blocked": blocked, "round": time.perf_counter() - start}
            if pending is not None:
                pending.result()
                written = min(written, time.perf_counter() - start)
            del state
            if way not in best or times["round"] < best[way]["round"]:
                best[way] = times
    check = client.resume(work / "loop.zarr")["x"]
    if not np.array_equal(check.result(), data):
        raise AssertionError("the asynchronous checkpoint did not hold the state as it was when asked for")
    return best, float(written)


def _wait(y: Any) -> None:
    """Wait until every device holds its block, without fetching the state into this process."""
    from .. import function

    function(lambda b: b[:1, :1], in_specs=P("d"), out_specs=P("d"), name="loaded")(y).result(timeout=600)
