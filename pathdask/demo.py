"""``pathdask demo``: train the sharded MLP of ``graphs/mlp.py`` on an embedded system.

The demo starts a :class:`~pathdask.LocalSystem`, trains the MLP with data x
model sharding on one island, evaluates it on held-out data on another island
(so the weights cross DCN), checks everything against the NumPy reference, and
prints what each device and each link class did.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dask.utils import format_bytes

from .errors import SliceTooLargeError
from .system import LocalSystem, default_topology
from .topology import LINK_CLASSES, Topology

__all__ = ["RTOL", "DemoReport", "load_graph", "run_demo"]

#: Largest difference from the NumPy reference, relative to the largest reference value.
RTOL = 1e-6

Echo = Callable[[str], Any]


def load_graph(name: str) -> ModuleType:
    """Import ``graphs.<name>``, from the repository next to this package if need be.

    ``graphs/`` is a top-level folder of the source tree, not part of the
    installed package, so a console script (whose ``sys.path`` does not hold
    the repository root) finds it through ``pip install -e .``'s checkout.
    """
    module = f"graphs.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name not in ("graphs", module):
            raise
    root = Path(__file__).resolve().parent.parent
    if not (root / "graphs" / f"{name}.py").is_file():
        raise ModuleNotFoundError(
            f"The demo needs the example program {module} from the graphs/ folder of the "
            f"pathdask source tree, and there is no {root / 'graphs' / (name + '.py')}. Run it "
            "from a source checkout (installed with `pip install -e .`) or from its root folder",
            name=module,
        )
    sys.path.insert(0, str(root))  # worker processes spawned later inherit it
    sys.modules.pop("graphs", None)  # a foreign `graphs` found earlier must not shadow ours
    return importlib.import_module(module)


@dataclass(frozen=True)
class DemoReport:
    """What :func:`run_demo` found: the training result, device stats and the verdict."""

    result: dict[str, Any]
    stats: dict[str, Any]
    wall_s: float
    dashboard: str | None
    ok: bool
    message: str


def run_demo(topology: Topology | str | os.PathLike[str] | None = None, *, steps: int = 20,
             processes: bool = True, seed: int = 0, progress: bool = True,
             echo: Echo = print) -> DemoReport:
    """Start a local system, train the MLP, compare with NumPy and print a summary.

    Parameters
    ----------
    topology : Topology or path, optional
        Defaults to :func:`pathdask.system.default_topology`.
    steps : int
        Training steps (one program of four gangs each).
    processes : bool
        One worker process per host, or every host in this process.
    seed : int
        Seed of the data and the initial weights.
    progress : bool
        Show a tqdm progress bar (on stderr).
    echo : callable
        Where the summary lines go.

    Returns
    -------
    DemoReport
        ``ok`` is false when the result differs from the NumPy reference by
        more than :data:`RTOL`; ``message`` then says by how much.
    """
    from tqdm.auto import tqdm

    mlp = load_graph("mlp")
    if topology is None:
        topology = default_topology()
    elif not isinstance(topology, Topology):
        topology = Topology.load(topology)
    need = math.prod(mlp.MESH_SHAPE.values())
    if need > topology.devices_per_island:  # say so before starting a cluster
        raise SliceTooLargeError(
            f"The demo trains on a mesh {mlp.MESH_SHAPE} of {need} devices in one island, but an island "
            f"of this topology has {topology.devices_per_island} ({topology.describe()}). Use a topology "
            f"with at least {need} devices per island"
        )

    with LocalSystem(topology, processes=processes, dashboard_address="127.0.0.1:0") as system:
        client = system.client(name="demo")
        mesh = client.mesh(mlp.MESH_SHAPE, island=0)
        # Held-out evaluation on another island when there is one: the weights cross DCN.
        eval_mesh = client.mesh(mlp.MESH_SHAPE, island=1) if topology.islands > 1 else mesh
        echo(f"pathdask demo: 2-layer MLP, data x model sharding on mesh {mlp.MESH_SHAPE}")
        echo(f"topology: {topology.describe()}")
        echo(f"hosts: {topology.num_hosts} worker {'processes' if processes else 'threads'}; "
             f"training on devices {list(mesh.device_ids)}, held-out evaluation on "
             f"devices {list(eval_mesh.device_ids)}")
        echo(f"dashboard: {system.dashboard_link or 'off'}")

        with tqdm(total=steps, desc="training", unit="step", disable=not progress) as bar:
            def advance(done: int, loss: float | None) -> None:
                bar.update(done - bar.n)
                if loss is not None:
                    bar.set_postfix(loss=f"{loss:.4g}")

            start = time.perf_counter()
            result = mlp.train(client, steps, mesh=mesh, eval_mesh=eval_mesh, seed=seed, progress=advance)
            wall = time.perf_counter() - start
        client.close()  # its arrays are gone already; this releases its slices
        stats = system.wait_idle(timeout="10s")
        dashboard = system.dashboard_link

    ok = bool(result["rel_diff"] <= RTOL)
    message = (
        f"NumPy reference: max |diff| {result['max_abs_diff']:.3g}, relative {result['rel_diff']:.3g} "
        f"{'<=' if ok else '>'} {RTOL:g}: {'match' if ok else 'MISMATCH'}"
    )
    losses = result["losses"]
    echo(f"loss {losses[0]:.4g} -> {losses[-1]:.4g} in {steps} steps ({result['gangs']} gangs, "
         f"{wall:.2f} s); held-out loss {result['eval_loss']:.4g}")
    echo(message)
    echo("")
    for line in summary_table(stats, wall, dashboard):
        echo(line)
    return DemoReport(result, stats, wall, dashboard, ok, message)


def summary_table(stats: dict[str, Any], wall_s: float, dashboard: str | None) -> list[str]:
    """Per-device busy share, HBM peak and gangs run; bytes per link class; the dashboard."""
    lines = [f"{'device':>6}  {'island':>6}  {'host':>4}  {'busy':>6}  {'gangs':>5}  {'HBM peak':>10}  {'HBM now':>9}"]
    for dev, s in stats["devices"].items():
        busy = s["busy_s"] / wall_s if wall_s > 0 else 0.0
        lines.append(
            f"{dev:>6}  {s['island']:>6}  {s['host']:>4}  {busy:>6.1%}  {s['gangs_run']:>5}  "
            f"{format_bytes(s['peak']):>10}  {format_bytes(s['bytes_in_use']):>9}"
        )
    lines += ["", f"{'link':<9}  {'bytes':>10}  {'transfers':>9}"]
    for cls in LINK_CLASSES:
        link = stats["links"].get(cls, {"bytes": 0, "transfers": 0})
        lines.append(f"{cls:<9}  {format_bytes(link['bytes']):>10}  {link['transfers']:>9}")
    lines += ["", f"dashboard: {dashboard or 'off'}"]
    return lines
