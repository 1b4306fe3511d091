"""``pathdask bench soak``: many clients, many random programs, every result checked.

Each client owns a few meshes and submits random programs: chains of
element-wise kernels, ``psum``, tiled ``all_gather``, ``ppermute`` shifts and
moves to another mesh or spec, on arrays whose first dimension is sharded over
a random mesh axis. Every result is compared with NumPy, nothing may deadlock
(every wait has a deadline), and the stores must end empty.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import P, all_gather, function, ppermute, program, psum
from ..system import LocalSystem, default_topology
from ..topology import Topology
from .report import table, write_json

Echo = Callable[[str], Any]
MESH_SHAPES = ({"a": 2, "b": 2}, {"a": 4}, {"a": 2}, {"a": 2, "b": 1})


@dataclass
class Config:
    clients: int = 8
    programs: int = 50
    max_ops: int = 4
    policy: str = "proportional"
    timeout: float = 120.0
    seed: int = 0

    @classmethod
    def small(cls) -> Config:
        return cls(clients=3, programs=6, max_ops=3, timeout=60.0)


def _op(rng: random.Random, mesh: Any, other: Any, n_rows: int) -> tuple[Any, Callable[[np.ndarray], np.ndarray]]:
    """One random step: (a function of one sharded array, its NumPy meaning)."""
    axis = "a"
    n = mesh.shape[axis]
    kind = rng.choice(["scale", "psum", "gather", "permute", "move"])
    if kind == "scale":
        a, c = rng.uniform(-2, 2), rng.uniform(-1, 1)
        f = function(lambda b: b * a + c, in_specs=P(axis), out_specs=P(axis), name="scale")
        return (lambda x: f(x, mesh=mesh)), (lambda v: v * a + c)
    if kind == "psum":
        summed = function(lambda b: psum(b, axis), in_specs=P(axis), out_specs=P(), name="psum")
        tile = function(lambda b: np.tile(b, (n, 1)), in_specs=P(), out_specs=P(), name="tile")

        def psum_then_tile(x: Any) -> Any:
            return tile(summed(x, mesh=mesh), mesh=mesh)

        # the sum of the n row blocks, tiled back to n_rows rows so that shapes stay put
        return psum_then_tile, lambda v: np.tile(v.reshape(n, -1, v.shape[1]).sum(0), (n, 1))
    if kind == "gather":
        g = function(lambda b: all_gather(b, axis, tiled=True), in_specs=P(axis), out_specs=P(), name="gather")
        return (lambda x: g(x, mesh=mesh)), (lambda v: v)
    if kind == "permute":
        shift = [(i, (i + 1) % n) for i in range(n)]
        pf = function(lambda b: ppermute(b, axis, shift), in_specs=P(axis), out_specs=P(axis), name="permute")
        return (lambda x: pf(x, mesh=mesh)), (lambda v: np.roll(v.reshape(n, -1, v.shape[1]), 1, 0).reshape(v.shape))
    mv = function(lambda b: b, in_specs=P("a"), out_specs=P("a"), name="move")
    return (lambda x: mv(x, mesh=other)), (lambda v: v)


def _chain(steps: list[tuple[Any, Any]]) -> Callable[[Any], Any]:
    def chain(a: Any) -> Any:
        for f, _ in steps:
            a = f(a)
        return a

    return chain


def _client(system: LocalSystem, cfg: Config, index: int, weight: float, errors: list[BaseException],
            counts: list[int]) -> None:
    rng = random.Random(cfg.seed * 1000 + index)
    c = system.client(name=f"soak-{index}", weight=weight)
    try:
        meshes = [c.mesh(rng.choice(MESH_SHAPES), island=rng.randrange(system.topology.islands))
                  for _ in range(2)]
        for _ in range(cfg.programs):
            mesh, other = rng.sample(meshes, 2)
            n_rows = 4 * rng.randint(1, 3)
            x = np.asarray(np.random.default_rng(rng.randrange(2**32)).normal(size=(n_rows, rng.randint(1, 5))))
            steps = [_op(rng, mesh if i % 2 == 0 else other, other if i % 2 == 0 else mesh, n_rows)
                     for i in range(rng.randint(1, cfg.max_ops))]

            prog = program(_chain(steps))

            expected = x
            for _, g in steps:
                expected = g(expected)
            start_mesh = rng.choice([mesh, other])
            out = prog(c.put(x, start_mesh, P("a")))
            np.testing.assert_allclose(out.result(timeout=cfg.timeout), expected, rtol=1e-9, atol=1e-9)
            counts[index] += 1
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)
    finally:
        c.close()


def run(cfg: Config, topology: Topology | None = None, out: str = "bench-results", echo: Echo = print,
        processes: bool = True) -> dict[str, Any]:
    """Run the soak; raises the first mismatch or error; writes ``soak.json``."""
    topology = topology or default_topology()
    rng = random.Random(cfg.seed)
    weights = [rng.choice([1.0, 2.0, 4.0]) for _ in range(cfg.clients)]
    errors: list[BaseException] = []
    counts = [0] * cfg.clients
    with LocalSystem(topology, processes=processes, dashboard_address=None, policy=cfg.policy) as system:
        start = time.perf_counter()
        threads = [threading.Thread(target=_client, args=(system, cfg, i, w, errors, counts))
                   for i, w in enumerate(weights)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        stats = system.wait_idle(timeout="30s")
    leftover = sum(s["bytes_in_use"] for s in stats["devices"].values())
    result = {"config": cfg.__dict__, "weights": weights, "programs_checked": counts, "seconds": elapsed,
              "errors": [repr(e) for e in errors], "bytes_left": leftover}
    echo(table(["client", "weight", "programs checked against NumPy"],
               [[i, w, n] for i, (w, n) in enumerate(zip(weights, counts))]))
    echo(f"{sum(counts)} programs from {cfg.clients} clients in {elapsed:.1f} s; "
         f"{len(errors)} error(s); {leftover} bytes left in the stores")
    write_json(f"{out}/soak.json", result)
    if errors:
        raise errors[0]
    if leftover:
        raise AssertionError(f"{leftover} bytes left in the device stores after the soak")
    return result
