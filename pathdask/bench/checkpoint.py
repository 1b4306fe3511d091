"""``pathdask bench checkpoint``: suspend and resume bandwidth beside ``numpy.save`` and ``numpy.load``.

On one island of 2 hosts x 4 devices (one worker process per host), a float64
state sharded over the 8 devices is suspended to a zarr checkpoint (each host
writes its own shards) and resumed (each device reads its block), in GB/s of
the state's bytes. Beside it, in the same run and the same folder, the same
bytes are written with ``numpy.save`` and read with ``numpy.load`` by one
process. Writes ``checkpoint.json``.
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

    @classmethod
    def small(cls) -> Config:
        return cls(mib=16, repeats=1)


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

            def suspend() -> None:
                shutil.rmtree(work / "state.zarr", ignore_errors=True)
                client.suspend(work / "state.zarr", {"x": x}, release=False)

            t_suspend = _best(suspend, cfg.repeats)

            def resume() -> None:
                y = client.resume(work / "state.zarr")["x"]
                _wait(y)
                y.delete()

            t_resume = _best(resume, cfg.repeats)
            if not np.array_equal(client.resume(work / "state.zarr")["x"].result(), data):
                raise AssertionError("resume gave back different bytes")
            client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {"suspend (zarr, by the hosts)": nbytes / t_suspend / 1e9, "numpy.save": nbytes / t_save / 1e9,
             "resume (zarr, by the devices)": nbytes / t_resume / 1e9, "numpy.load": nbytes / t_load / 1e9}
    echo(table(["path", "GB/s"], [[k, v] for k, v in rates.items()]))
    ratios = {"suspend_over_numpy_save": rates["suspend (zarr, by the hosts)"] / rates["numpy.save"],
              "resume_over_numpy_load": rates["resume (zarr, by the devices)"] / rates["numpy.load"]}
    echo("; ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    result = {"config": cfg.__dict__, "gb_per_s": rates, "ratios": ratios}
    write_json(f"{out}/checkpoint.json", result)
    echo(f"wrote {out}/checkpoint.json")
    return result


def _wait(y: Any) -> None:
    """Wait until every device holds its block, without fetching the state into this process."""
    from .. import function

    function(lambda b: b[:1, :1], in_specs=P("d"), out_specs=P("d"), name="loaded")(y).result(timeout=600)
