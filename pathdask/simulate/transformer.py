"""``bench pipeline``'s Transformer rows (Table 2), traced on abstract meshes and simulated.

The same programs as :mod:`pathdask.bench.pipeline`: the SPMD training step,
and GPipe pipelines of ``S`` stages with ``M = 4S`` microbatches followed by each
stage's SGD, values at the computed width, time at the modelled size.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from .. import P
from ..bench.pipeline import Bench, Config, _topology
from ..pipeline import Pipeline, Stage
from ..topology import Topology
from .abstract import AbstractArray, abstract_mesh
from .model import CostModel
from .run import ClientScript, Tenant, simulate
from .workloads import traced


def _arr(a: np.ndarray, mesh: Any, spec: Any) -> AbstractArray:
    return AbstractArray(tuple(a.shape), a.dtype, mesh, spec)


def _timed(topology: Topology, costs: CostModel, step: Any, steps: int) -> float:
    """Seconds per step: one untimed step, then ``steps`` back to back (``Bench.timed``).
    ``step(h, after)`` is a generator that submits one step and returns its calls."""
    out: list[float] = []

    def script(h: Tenant) -> Generator[Any, Any, None]:
        calls = yield from step(h, None)
        for c in calls:
            yield from h.result(c)
        start = h.now
        for _ in range(steps):
            calls = yield from step(h, calls)
        for c in calls:
            yield from h.result(c)
        out.append((h.now - start) / steps)

    simulate(topology, [ClientScript("bench", script)], costs, trace_gangs=0)
    return out[0]


def spmd_seconds(b: Bench, topology: Topology, costs: CostModel) -> float:
    mesh = abstract_mesh(topology, {"data": b.cfg.devices})
    prog = traced(b.tr.make_train_step(b.model, lr=0.01, modelled=b.modelled), topology,
                  _arr(b.tr.pack(b.params), mesh, P()), _arr(b.tokens, mesh, P("data", None)),
                  _arr(b.targets, mesh, P("data", None)), name="train_step")

    def step(h: Tenant, after: Any) -> Generator[Any, Any, list[Any]]:
        call = yield from h.call(prog, after=after)
        return [call]

    return _timed(topology, costs, step, b.cfg.steps)


def pipeline_seconds(b: Bench, topology: Topology, costs: CostModel, stages: int, islands: int = 1) -> float:
    per_island, n = stages // islands, b.cfg.devices // stages
    fns = [b.tr.make_stage(b.model, s, stages, b.modelled, lr=0.01) for s in range(stages)]
    meshes = [abstract_mesh(topology, {"data": n}, island=s // per_island, first=(s % per_island) * n)
              for s in range(stages)]
    micro = 4 * stages
    examples = b.cfg.batch // micro
    pipe = Pipeline([Stage(f.forward, f.backward, m) for f, m in zip(fns, meshes)], fns[-1].loss, micro,
                    schedule="gpipe", accumulate="final", name=f"pipeline-S{stages}",
                    move_nbytes=lambda s: b.modelled.activation_bytes(examples))
    params = [_arr(f.pack(b.params), m, P()) for f, m in zip(fns, meshes)]
    xs = [_arr(t, meshes[0], fns[0].forward.in_specs[1]) for t in np.split(b.tokens, micro)]
    ys = [_arr(t, meshes[-1], fns[-1].loss.in_specs[1]) for t in np.split(b.targets, micro)]  # type: ignore[union-attr]
    prog = traced(pipe.program, topology, *params, *xs, *ys, name=pipe.program.name)
    sgds = [traced(lambda p, g, f=f: f.sgd(p, g), topology, p, p, name="sgd") for f, p in zip(fns, params)]

    def step(h: Tenant, after: Any) -> Generator[Any, Any, list[Any]]:
        call = yield from h.call(prog, after=after)
        out = [call]
        for s in sgds:
            out.append((yield from h.call(s, after=call)))
        return out

    return _timed(topology, costs, step, b.cfg.steps)


def table2(cfg: Config, costs: CostModel, stages: tuple[int, ...], echo: Any = print) -> list[dict[str, Any]]:
    """Table 2's rows on ``cfg.devices`` devices: SPMD and a pipeline per ``S`` in ``stages``."""
    b = Bench(cfg)
    topology = _topology(cfg, 1)
    rows = []

    def add(name: str, seconds: float, s: int | None = None) -> None:
        tps = b.tokens_per_s(seconds)
        rows.append({"row": name, "devices": cfg.devices, "step_s": seconds, "tokens_per_s": tps,
                     "efficiency": tps / b.peak, "bubble": 4 * s / (5 * s - 1) if s else None, "S": s,
                     "M": 4 * s if s else None})
        echo(f"  {name} on {cfg.devices} devices: {seconds:.3f} s/step")

    add("SPMD", spmd_seconds(b, topology, costs))
    for s in stages:
        add(f"pipeline S={s} M={4 * s}", pipeline_seconds(b, topology, costs, s), s)
    return rows
