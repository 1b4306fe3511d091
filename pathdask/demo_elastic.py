"""``pathdask demo --elastic``: the MLP loses a host mid-run, re-meshes and carries on.

It trains ``graphs/elastic.py``'s loop on an embedded system with one worker
process per host, kills the worker process of one training host (SIGKILL: no
goodbye) at a chosen step, and shows on the progress bar where the host was
lost, where the loop resumed from its last checkpoint, and how long recovery
took. The final loss is checked against an uninterrupted NumPy run.
"""

from __future__ import annotations

import os
import signal
import tempfile
from typing import Any

from .demo import RTOL, Echo, load_graph
from .system import LocalSystem, default_topology
from .topology import Topology

__all__ = ["run_elastic_demo"]


def run_elastic_demo(topology: Topology | str | os.PathLike[str] | None = None, *, steps: int = 20,
                     seed: int = 0, progress: bool = True, echo: Echo = print) -> dict[str, Any]:
    """Train with a host killed at a third of the steps; returns ``graphs.elastic.train``'s report
    plus ``ok`` (final loss within :data:`~pathdask.demo.RTOL` of NumPy's)."""
    from tqdm.auto import tqdm

    elastic = load_graph("elastic")
    topology = default_topology() if topology is None else (
        topology if isinstance(topology, Topology) else Topology.load(topology))
    with LocalSystem(topology, processes=True, dashboard_address="127.0.0.1:0") as system, \
            tempfile.TemporaryDirectory(prefix="pathdask-elastic-") as tmp:
        client = system.client(name="elastic")
        echo(f"pathdask demo --elastic: {steps} steps; a training host is killed before step "
             f"{steps // 3 + 1}; dashboard: {system.dashboard_link}")

        def kill_a_training_host() -> None:
            # the training mesh is the client's first slice; kill the host of its last device
            device = max(d["id"] for d in client.devices() if d["slices"])
            addr = next(d["address"] for d in client.devices() if d["id"] == device)
            pid = client.dask.run(os.getpid, workers=[addr])[addr]
            os.kill(pid, signal.SIGKILL)  # a worker process this system started

        with tqdm(total=steps, desc="training", unit="step", disable=not progress) as bar:
            def event(kind: str, step: int, detail: Any) -> None:
                if kind == "step":
                    bar.update(step - bar.n)
                    bar.set_postfix(loss=f"{detail:.4g}")
                elif kind == "lost":
                    bar.set_description("recovering")
                    (bar.write if progress else echo)(f"  x host lost at step {step + 1}: {detail}")
                else:
                    bar.n = step
                    bar.set_description("training")
                    (bar.write if progress else echo)(
                        f"  > lost devices {detail['lost_devices']}; new mesh {detail['mesh']} on devices "
                        f"{detail['devices']}; resuming from the checkpoint of step {step}")

            report = elastic.train(client, steps, f"{tmp}/checkpoint.zarr", checkpoint_every=5, seed=seed,
                                   interrupt_at=steps // 3, interrupt=kill_a_training_host, event=event)
        client.close()
    report["ok"] = bool(report["final_rel_diff"] <= RTOL)
    for r in report["recoveries"]:
        echo(f"recovered in {r['seconds']:.2f} s (from the loss to the next completed step)")
    echo(f"final loss {report['losses'][-1]:.6g}, NumPy {report['reference'][-1]:.6g}: relative difference "
         f"{report['final_rel_diff']:.2g} {'<=' if report['ok'] else '>'} {RTOL:g}")
    return report
