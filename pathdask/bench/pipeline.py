"""``pathdask bench pipeline``: the paper's Table 2 and Figures 10 and 12, at our scale.

A decoder-only Transformer (``graphs/transformer.py``) is trained on ``N``
devices, each step on the same global batch, in these configurations:

- SPMD: the whole model data-parallel on one mesh of all ``N`` devices;
- pipelines of ``S`` stages (``M = 4S`` microbatches, GPipe) on one island,
  each stage on ``N/S`` devices;
- the largest of those pipelines split over 2 and 4 islands (DCN between the
  islands' stages);
- two-island data parallel: each island of ``N/2`` devices computes the
  gradients of half the batch, sums them over ICI, exchanges them over DCN
  chunk by chunk while the backward goes on, and applies them, beside one
  island of ``N`` devices doing the same without DCN.

**Modelled and computed.** Every value is computed by NumPy at a small width
and checked against nothing here (the tests do that). Device time is modelled:
each gang holds its devices for the FLOPs it would take at a paper size
(:data:`MODELLED`, the 3B model of Table 2 with 63 layers and a vocabulary of
12·d_model, so that the last stage's unembedding weighs one layer and the
stages balance, as the paper balanced them by moving layers), divided by the
topology's FLOP/s. Moves of activations and gradients are timed at the bytes
they would have at that size (``x.to(..., model_nbytes=)``).

Each row gives tokens/s (modelled tokens: examples x the modelled sequence),
the ratio to SPMD, the efficiency (tokens/s over the devices' peak at the
model's FLOPs per token) and the bubble model's M/(M+S-1). It writes
``pipeline.json`` and two Bokeh traces: ``pipeline-trace.html`` (Figure 10:
the 4-island pipeline, devices x time, coloured by stage and microbatch) and
``dcn-overlap.html`` (Figure 12: two-island data parallel with its DCN
transfers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import P, all_gather, axis_index, axis_size, function, program
from ..demo import load_graph
from ..pipeline import Pipeline, Stage
from ..system import LocalSystem
from ..topology import Topology
from .report import table, write_json

Echo = Callable[[str], Any]
LR = 0.01  # every row's SGD step


@dataclass
class Config:
    devices: int = 16  # devices_per_host = 2
    stages: tuple[int, ...] = (2, 4, 8)
    islands: tuple[int, ...] = (2, 4)  # the largest pipeline split over this many islands
    batch: int = 64  # global batch of every row (examples): a multiple of 4 x devices
    steps: int = 2  # timed steps per row, after one untimed
    chunks: int = 8  # gradient chunks exchanged over DCN in the data-parallel rows
    #: the modelled device's sustained speed; slow enough that this machine's real overhead per
    #: small gang (a loss's collectives: ~20 ms on 2 busy cores) stays small beside a stage's time
    device_flops: str = "10 TFLOP/s"
    #: per host NIC; slow enough that the gradients' DCN time is a visible part of a step
    dcn: dict[str, str] = field(default_factory=lambda: {"bandwidth": "2 GB/s", "latency": "50us"})
    computed: dict[str, int] = field(default_factory=lambda: {
        "vocab": 32, "d_model": 16, "heads": 2, "d_ff": 32, "seq": 8, "layers": 8})

    @classmethod
    def small(cls) -> Config:
        """What CI runs: every kind of row, on 4 devices, with fast modelled devices."""
        return cls(devices=4, stages=(2,), islands=(2,), batch=16, steps=1, chunks=2, device_flops="400 TFLOP/s")


def _modelled(tr: Any) -> Any:
    """The paper's 3B model (d_model 2048, d_ff 8192), with 63 layers and a vocabulary of 12 x
    2048, so that the last stage (one layer less, plus the unembedding) weighs what the others do."""
    return tr.Modelled(d_model=2048, d_ff=8192, heads=16, seq=1024, layers=63, vocab=12 * 2048)


def _topology(cfg: Config, islands: int) -> Topology:
    return Topology.from_dict({"islands": islands, "hosts_per_island": cfg.devices // 2 // islands,
                               "devices_per_host": 2, "device_flops": cfg.device_flops, "dcn": cfg.dcn,
                               "hbm": "4 GiB"})


class Bench:
    """What every row shares: the model, its parameters and the batch."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.tr = load_graph("transformer")
        self.model = self.tr.Config(**cfg.computed)
        self.modelled = _modelled(self.tr)
        self.params = self.tr.init_params(self.model, seed=0)
        self.tokens, self.targets = self.tr.make_batch(self.model, cfg.batch, seed=1)
        whole = self.tr.stage_of(self.model)
        per_example = 3 * self.modelled.forward_flops(whole, 1) + self.modelled.loss_flops(1)
        #: tokens/s if every device computed all the time (no bubble, no overhead)
        self.peak = cfg.devices * _topology(cfg, 1).device_flops / per_example * self.modelled.seq

    def tokens_per_s(self, seconds: float) -> float:
        return self.cfg.batch * self.modelled.seq / seconds

    def timed(self, step: Callable[[], Sequence[Any]]) -> float:
        """Seconds per step: one untimed step, then ``steps`` dispatched back to back, as a training
        loop does (each step's gangs wait on the device for the parameters the last one made)."""
        _wait(step())
        start = time.perf_counter()
        for _ in range(self.cfg.steps):
            last = step()
        _wait(last)
        return (time.perf_counter() - start) / self.cfg.steps


def _wait(arrays: Sequence[Any]) -> None:
    for a in arrays:
        a.result(timeout=600)


# -- the rows ------------------------------------------------------------------------
def spmd(b: Bench, client: Any) -> float:
    mesh = client.mesh({"data": b.cfg.devices})
    step = b.tr.make_train_step(b.model, lr=LR, modelled=b.modelled)
    params = client.put(b.tr.pack(b.params), mesh, P())
    tokens, targets = (client.put(a, mesh, P("data", None)) for a in (b.tokens, b.targets))
    state = [params]

    def one() -> Sequence[Any]:
        state[0], loss = step(state[0], tokens, targets)
        return state[0], loss

    return b.timed(one)


def pipelined(b: Bench, client: Any, stages: int, islands: int) -> tuple[float, Pipeline]:
    """One pipeline of ``stages`` stages over ``islands`` islands (stages in order, island by island)."""
    per_island = stages // islands
    fns = [b.tr.make_stage(b.model, s, stages, b.modelled, lr=LR) for s in range(stages)]
    meshes = [client.mesh({"data": b.cfg.devices // stages}, island=s // per_island) for s in range(stages)]
    micro = 4 * stages
    examples = b.cfg.batch // micro
    pipe = Pipeline([Stage(f.forward, f.backward, m) for f, m in zip(fns, meshes)], fns[-1].loss, micro,
                    schedule="gpipe", accumulate="final", name=f"pipeline-S{stages}",
                    move_nbytes=lambda s: b.modelled.activation_bytes(examples))
    params = [client.put(f.pack(b.params), m, P()) for f, m in zip(fns, meshes)]
    xs, ys = pipe.put_batch(client, b.tokens, b.targets)
    state = [params]

    def one() -> Sequence[Any]:
        loss, grads = pipe(state[0], xs, ys)
        state[0] = [f.sgd(p, g) for f, p, g in zip(fns, state[0], grads)]
        return [loss, *state[0]]

    return b.timed(one), pipe


@function(in_specs=P(), out_specs=P("data"), name="my_part")
def _my_part(g: np.ndarray) -> np.ndarray:
    """This device's part of a replicated flat gradient, zero-padded to split evenly (no data moves)."""
    n = -(-g.shape[0] // axis_size("data"))
    i = axis_index("data")
    part = g[i * n:(i + 1) * n]
    return np.concatenate([part, np.zeros(n - part.shape[0], g.dtype)])


def data_parallel(b: Bench, client: Any, islands: int) -> float:
    """Each island trains on its share of the batch; gradients meet over DCN, chunk by chunk."""
    cfg, tr = b.cfg, b.tr
    chunks = [tr.make_stage(b.model, c, cfg.chunks, b.modelled, lr=LR) for c in range(cfg.chunks)]
    meshes = [client.mesh({"data": cfg.devices // islands}, island=i) for i in range(islands)]
    @function(in_specs=(P(), P(), P("data")), out_specs=P(), name="apply")
    def apply_two(params: np.ndarray, mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
        """SGD with the mean of this island's gradient and the other's (gathered over ICI)."""
        other = all_gather(theirs, "data", tiled=True)[: params.shape[0]]
        return params - LR * (mine + other) / 2

    last_loss = chunks[-1].loss
    assert last_loss is not None  # the last chunk holds the loss
    @program
    def step(*arrays: Any) -> tuple[Any, ...]:
        k = cfg.chunks
        params = [arrays[i * k:(i + 1) * k] for i in range(islands)]
        tokens, targets = arrays[islands * k:islands * k + islands], arrays[islands * k + islands:]
        grads: list[list[Any]] = [[None] * k for _ in range(islands)]
        moved: list[list[Any]] = [[None] * k for _ in range(islands)]
        losses = []
        for i in range(islands):
            acts = [tokens[i]]
            for c in range(k):
                acts.append(chunks[c].forward(params[i][c], acts[-1]))
            loss, dy = last_loss(acts[-1], targets[i])
            losses.append(loss)
            for c in reversed(range(k)):
                grads[i][c], dy = chunks[c].backward(params[i][c], acts[c], dy)
                if islands == 2:  # each chunk's gradient crosses DCN while the backward goes on
                    moved[i][c] = _my_part(grads[i][c]).to(meshes[1 - i], P("data"),
                                                           model_nbytes=chunks[c].modelled_param_bytes())
        if islands == 1:
            return (*[chunks[c].sgd(params[0][c], grads[0][c]) for c in range(k)], *losses)
        new = [apply_two(params[i][c], grads[i][c], moved[1 - i][c]) for i in range(islands) for c in range(k)]
        return (*new, *losses)

    params = [client.put(c.pack(b.params), m, P()) for m in meshes for c in chunks]
    halves = list(zip(np.split(b.tokens, islands), np.split(b.targets, islands)))
    tokens = [client.put(t, m, P("data", None)) for (t, _), m in zip(halves, meshes)]
    targets = [client.put(y, m, P("data", None)) for (_, y), m in zip(halves, meshes)]
    state = [params]

    def one() -> Sequence[Any]:
        out = step(*state[0], *tokens, *targets)
        state[0] = list(out[: len(state[0])])
        return out

    return b.timed(one)


# -- the run -------------------------------------------------------------------------
def run(cfg: Config, out: str = "bench-results", echo: Echo = print) -> dict[str, Any]:
    """Run every row on real LocalSystems (threads), print the table, write JSON and traces."""
    b = Bench(cfg)
    echo(f"pathdask bench pipeline: {cfg.devices} devices, batch {cfg.batch} x {b.modelled.seq} modelled "
         f"tokens, 3B-class model ({b.modelled.params() / 1e9:.1f}e9 parameters modelled, "
         f"{b.model.d_model}-wide values computed)")
    rows: list[dict[str, Any]] = []

    def add(name: str, seconds: float, stages: int | None = None, micro: int | None = None) -> None:
        tps = b.tokens_per_s(seconds)
        bubble = micro / (micro + stages - 1) if stages and micro else None
        rows.append({"row": name, "step_s": seconds, "tokens_per_s": tps, "efficiency": tps / b.peak,
                     "bubble": bubble, "S": stages, "M": micro})
        echo(f"  {name}: {seconds:.3f} s/step")

    traces: dict[str, Any] = {}
    dcn_s = 0.0  # modelled seconds the busiest NIC spent receiving, over the two-island data-parallel row
    for islands in (1, *cfg.islands):
        with LocalSystem(_topology(cfg, islands), processes=False, dashboard_address=None) as system:
            client = system.client(name=f"bench-{islands}")
            if islands == 1:
                add("SPMD", spmd(b, client))
                for s in cfg.stages:
                    add(f"pipeline S={s} M={4 * s}", pipelined(b, client, s, 1)[0], s, 4 * s)
                add("data parallel, 1 island", data_parallel(b, client, 1))
            else:
                s = max(cfg.stages)
                client.reset_observations()
                seconds, pipe = pipelined(b, client, s, islands)
                add(f"pipeline S={s} M={4 * s}, {islands} islands", seconds, s, 4 * s)
                if islands == max(cfg.islands):
                    traces["pipeline"] = client.trace()
            if islands == 2:
                client.reset_observations()
                before = _nic_busy(system)
                add("data parallel, 2 islands", data_parallel(b, client, 2))
                traces["dp"], traces["dp_transfers"] = client.trace(), client.transfers()
                dcn_s = max(busy - before.get(nic, 0.0) for nic, busy in _nic_busy(system).items())
            client.close()
    spmd_tps = rows[0]["tokens_per_s"]
    for r in rows:
        r["ratio_to_spmd"] = r["tokens_per_s"] / spmd_tps
        r["measured_over_bubble"] = r["efficiency"] / r["bubble"] if r["bubble"] else None
    echo(table(["configuration", "tokens/s", "ratio to SPMD", "efficiency", "bubble M/(M+S-1)", "measured/bubble"],
               [[r["row"], r["tokens_per_s"], r["ratio_to_spmd"], r["efficiency"], r["bubble"],
                 r["measured_over_bubble"]] for r in rows]))
    by = {r["row"]: r for r in rows}
    s = max(cfg.stages)
    ratios = {
        "dp_two_islands_over_one": by["data parallel, 2 islands"]["tokens_per_s"]
        / by["data parallel, 1 island"]["tokens_per_s"],
        "worst_pipeline_vs_bubble": max(abs(r["measured_over_bubble"] - 1) for r in rows if r["bubble"]),
        **{f"pipeline_S{s}_{i}_islands_over_one": by[f"pipeline S={s} M={4 * s}, {i} islands"]["tokens_per_s"]
           / by[f"pipeline S={s} M={4 * s}"]["tokens_per_s"] for i in cfg.islands},
    }
    ratios["dcn_s_per_step_over_step_s"] = dcn_s / (cfg.steps + 1) / by["data parallel, 2 islands"]["step_s"]
    echo("; ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    files = _plots(traces, out, s, max(cfg.islands))
    result = {"config": asdict(cfg), "rows": rows, "ratios": ratios, "files": files,
              "modelled": asdict(b.modelled), "computed": cfg.computed}
    write_json(f"{out}/pipeline.json", result)
    echo(f"wrote {out}/pipeline.json, {', '.join(files)}")
    return result


def _nic_busy(system: LocalSystem) -> dict[str, float]:
    """Modelled seconds each host NIC has spent receiving."""
    return {nic: sides.get("recv", {}).get("busy_s", 0.0) for nic, sides in system.device_stats()["nics"].items()}


def _plots(traces: dict[str, Any], out: str, stages: int, islands: int) -> list[str]:
    """Figure 10 (the pipeline over islands, by stage and microbatch) and Figure 12 (data parallel
    over two islands with its DCN transfers), as Bokeh HTML files."""
    import os

    from bokeh.embed import file_html
    from bokeh.palettes import Category20_20
    from bokeh.resources import INLINE

    os.makedirs(out, exist_ok=True)
    files = []

    def stage_colour(gang: str) -> str:
        """``s2.F.m5`` -> ``stage 2, odd microbatches``: a colour per stage, darker for even microbatches."""
        parts = gang.split(".")
        if len(parts) == 3 and parts[0][1:].isdigit() and parts[2][1:].isdigit():
            return f"stage {parts[0][1:]}, {'odd' if int(parts[2][1:]) % 2 else 'even'} microbatches"
        return "moves and sums"

    if "pipeline" in traces:
        colors = {f"stage {i}, {half} microbatches": Category20_20[(2 * i + (half == "odd")) % 20]
                  for i in range(stages) for half in ("even", "odd")}
        colors["moves and sums"] = "#d9d9d9"  # a receive waiting for its piece is the bubble
        fig = traces["pipeline"].pathdask.plot(
            color_by=stage_colour, colors=colors,
            title=f"Figure 10: {stages} pipeline stages over {islands} islands (colour: stage; "
                  "darker: even microbatches)")
        path = f"{out}/pipeline-trace.html"
        with open(path, "w") as f:
            f.write(file_html(fig, INLINE, "pathdask pipeline trace"))
        files.append(path)
    if "dp" in traces:
        fig = traces["dp"].pathdask.plot(
            color_by=lambda g: g.rstrip("0123456789"), transfers=traces["dp_transfers"],
            title="Figure 12: data parallel over two islands; grey rows: DCN transfers into each device")
        path = f"{out}/dcn-overlap.html"
        with open(path, "w") as f:
            f.write(file_html(fig, INLINE, "pathdask two-island data parallel"))
        files.append(path)
    return files
