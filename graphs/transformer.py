"""A decoder-only Transformer language model: data parallel, split into pipeline stages.

What is **computed** and what is **modelled**:

- *Computed*: every value. Tokens, activations, logits, the loss, gradients
  and parameter updates are real NumPy ``float64`` arrays of a small model
  (:class:`Config`, by default vocabulary 64, width 32, 4 heads, MLP 64,
  sequence 16, 4 blocks), and match the NumPy reference
  (:func:`reference_loss_and_grads`, a hand-written backward pass).
- *Modelled*: device time and transfer sizes. Each gang's ``cost=`` returns the
  FLOPs that its examples would take at a :class:`Modelled` size (for example
  the 3B model of the Pathways paper, :data:`MODELLED`); pathdask divides them
  by the topology's ``device_flops``. :func:`modelled_activation_bytes` and
  :func:`modelled_param_bytes` give the bf16 bytes that activations and stage
  parameters would have at that size, for modelling transfers. The number of
  examples (batch rows) in each device's block is the one real quantity a
  cost reads.

The model: a token embedding plus a learned position embedding, ``L`` blocks
each ``x + attn(rms(x))`` then ``h + mlp(rms(h))`` (pre-RMSNorm with a gain,
causal multi-head self-attention without biases, a tanh-GELU MLP with biases),
a final RMSNorm and an unembedding. The loss is the softmax cross-entropy of
the next tokens, the mean over all tokens of the batch.

A *stage* (:class:`Stage`) is a contiguous range of blocks; the first stage
also holds the embeddings, the last the final norm and the unembedding. The
parameters of a stage are one flat 1-D vector (:func:`pack`,
:func:`unpack`), replicated over the stage's mesh (``P()``); the whole model
is the single stage ``stage_of(cfg, 0, 1)``.

Sharding (data parallel, mesh axis ``"data"``):

- tokens and targets, ``(batch, seq)`` integers: ``P("data", None)``;
- activations and logits, ``(batch, seq, width)``: ``P("data", None, None)``;
- parameters and their gradients, flat: ``P()``. The loss gang scales each
  device's gradient by the token count of the whole batch, so ``backward``
  sums (``psum``) its parameter gradients over ``"data"`` and gets exactly
  the gradient of the global mean loss.

:func:`make_stage` returns a stage's gangs (:class:`StageFunctions`):
``forward(params, x) -> y``, ``backward(params, x, dy) -> (dparams, dx)``,
``loss(y, targets) -> (loss, dy)`` on the last stage and
``sgd(params, grads) -> params``. :func:`make_train_step` is the whole-model
SPMD training step on one mesh, :func:`run_step` runs it on NumPy inputs and
:func:`run_stages` runs the stages one after another on several meshes.

Examples
--------
>>> cfg = Config()
>>> params = init_params(cfg, seed=0)
>>> tokens, targets = make_batch(cfg, batch=8, seed=1)
>>> with pw.LocalSystem(processes=False) as system:
...     client = system.client()
...     out = run_step(client, client.mesh({"data": 4}), params, tokens, targets, lr=0.1)
>>> ref_loss, _ = reference_loss_and_grads(params, tokens, targets)
>>> bool(np.isclose(out["loss"], ref_loss))
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pathdask as pw
from pathdask import P

__all__ = [
    "ACTIVATIONS",
    "MODELLED",
    "REPLICATED",
    "TOKENS",
    "Config",
    "Modelled",
    "Params",
    "Stage",
    "StageFunctions",
    "init_params",
    "make_batch",
    "make_stage",
    "make_train_step",
    "modelled_activation_bytes",
    "modelled_param_bytes",
    "pack",
    "param_shapes",
    "reference_forward",
    "reference_loss_and_grads",
    "reference_sgd",
    "run_stages",
    "run_step",
    "stage_of",
    "unpack",
]

TOKENS = P("data", None)  # tokens and targets: (batch, seq) integers
ACTIVATIONS = P("data", None, None)  # activations (batch, seq, d_model) and logits (batch, seq, vocab)
REPLICATED = P()  # flat parameters, their gradients, the loss

EPS = 1e-6  # RMSNorm
GELU_C = math.sqrt(2.0 / math.pi)
#: modelled FLOPs per logit of the softmax cross-entropy (max, exp, sum, log, subtract)
LOSS_FLOPS_PER_LOGIT = 5
#: bytes per modelled value (bf16)
MODELLED_BYTES = 2


# -- sizes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """The computed model's size: small, so that every value is really computed."""

    vocab: int = 64
    d_model: int = 32
    heads: int = 4
    d_ff: int = 64
    seq: int = 16
    layers: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "heads", "d_ff", "seq", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"Config.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")

    def modelled(self) -> Modelled:
        """This size as a :class:`Modelled` one: costs of the computed model itself."""
        return Modelled(self.d_model, self.d_ff, self.heads, self.seq, self.layers, self.vocab)


@dataclass(frozen=True)
class Stage:
    """Stage ``index`` of ``count``: computed blocks ``start..stop-1``.

    The first stage (``index == 0``) also holds the embeddings, the last the
    final norm, the unembedding and the loss. Make one with :func:`stage_of`.
    """

    index: int
    count: int
    start: int
    stop: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def modelled_layers(self, layers: int) -> int:
        """How many of ``layers`` modelled layers this stage holds (the same even split)."""
        start, stop = _split(layers, self.count, self.index)
        return stop - start


def _split(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part ``i`` of ``range(n)`` cut into ``parts`` contiguous parts, the larger ones first."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def stage_of(cfg: Config, index: int = 0, count: int = 1) -> Stage:
    """Stage ``index`` of ``count`` equal splits of ``cfg.layers`` blocks (``count=1``: the whole model)."""
    if not 1 <= count <= cfg.layers:
        raise ValueError(f"{count} stages need 1 <= stages <= layers ({cfg.layers})")
    if not 0 <= index < count:
        raise ValueError(f"stage index {index} is not in 0..{count - 1}")
    return Stage(index, count, *_split(cfg.layers, count, index))


@dataclass(frozen=True)
class Modelled:
    """The size that costs and byte counts are modelled at (the values are computed at :class:`Config`).

    Parameter counts follow the computed architecture: per block four
    ``d_model x d_model`` attention matrices, the MLP's two matrices and
    biases and two norm gains; embeddings of ``vocab`` tokens and ``seq``
    positions; a final gain and an untied unembedding.
    """

    d_model: int
    d_ff: int
    heads: int
    seq: int
    layers: int
    vocab: int

    def block_params(self) -> int:
        d, f = self.d_model, self.d_ff
        return 4 * d * d + 2 * d * f + f + d + 2 * d

    def stage_params(self, stage: Stage) -> int:
        """Parameters of ``stage``'s share of the modelled layers, embeddings and unembedding."""
        d, v = self.d_model, self.vocab
        n = stage.modelled_layers(self.layers) * self.block_params()
        if stage.first:
            n += v * d + self.seq * d
        if stage.last:
            n += d + d * v
        return n

    def params(self) -> int:
        """Parameters of the whole modelled model."""
        return self.stage_params(Stage(0, 1, 0, self.layers))

    def forward_flops(self, stage: Stage, examples: int) -> float:
        """Forward FLOPs of ``examples`` sequences through ``stage``.

        ``2 * matmul parameters * tokens`` (the embedding lookup is free) plus
        the attention scores and the weighted values, ``4 * seq**2 * d_model``
        per layer and sequence (no discount for the causal mask).
        """
        t, d = self.seq, self.d_model
        layers = stage.modelled_layers(self.layers)
        matmul = layers * (4 * d * d + 2 * d * self.d_ff) + (d * self.vocab if stage.last else 0)
        return float(examples) * (2.0 * t * matmul + layers * 4.0 * t * t * d)

    def backward_flops(self, stage: Stage, examples: int, recompute: bool = False) -> float:
        """Backward FLOPs: twice the forward (three times with the forward recomputed)."""
        return (3.0 if recompute else 2.0) * self.forward_flops(stage, examples)

    def loss_flops(self, examples: int) -> float:
        """Softmax cross-entropy and its gradient over ``examples`` sequences of logits."""
        return float(examples) * self.seq * self.vocab * LOSS_FLOPS_PER_LOGIT

    def sgd_flops(self, stage: Stage) -> float:
        """One multiply-add per parameter of the stage."""
        return 2.0 * self.stage_params(stage)

    def activation_bytes(self, examples: int) -> int:
        """bf16 bytes of ``examples`` sequences of activations, ``(examples, seq, d_model)``."""
        return MODELLED_BYTES * examples * self.seq * self.d_model

    def param_bytes(self, stage: Stage) -> int:
        """bf16 bytes of the parameters of ``stage``."""
        return MODELLED_BYTES * self.stage_params(stage)


#: Modelled sizes. Each has ``12 * layers * d_model**2`` (plus embeddings)
#: parameters with a plain 4x MLP, which is how the names are met.
MODELLED: dict[str, Modelled] = {
    # The Pathways paper's 3B decoder: 62 layers, d_model 2048, d_ff 8192 (3.2e9
    # parameters here). heads 16, seq 1024 and vocab 32000 are assumptions.
    "3B": Modelled(d_model=2048, d_ff=8192, heads=16, seq=1024, layers=62, vocab=32000),
    # The shape of LLaMA-65B (Touvron et al. 2023: 80 layers, d_model 8192, 64
    # heads) with a plain 4x MLP: 6.5e10 parameters. seq and vocab assumed.
    "64B": Modelled(d_model=8192, d_ff=32768, heads=64, seq=1024, layers=80, vocab=32000),
    # The width of GPT-3 175B (Brown et al. 2020: d_model 12288, 96 heads) with 75
    # instead of 96 layers: 1.36e11 parameters. seq and vocab assumed.
    "136B": Modelled(d_model=12288, d_ff=49152, heads=96, seq=1024, layers=75, vocab=32000),
}


def _modelled(modelled: Modelled | str | None, cfg: Config) -> Modelled:
    if modelled is None:
        return cfg.modelled()
    if isinstance(modelled, str):
        try:
            return MODELLED[modelled]
        except KeyError:
            raise ValueError(f"no modelled size {modelled!r}; pick one of {sorted(MODELLED)}") from None
    return modelled


def modelled_activation_bytes(examples: int, modelled: Modelled | str = "3B") -> int:
    """bf16 bytes of ``examples`` sequences of activations at the ``modelled`` size."""
    return _modelled(modelled, Config()).activation_bytes(examples)


def modelled_param_bytes(stage: Stage, modelled: Modelled | str = "3B") -> int:
    """bf16 bytes of ``stage``'s parameters at the ``modelled`` size."""
    return _modelled(modelled, Config()).param_bytes(stage)


# -- parameters -------------------------------------------------------------------------
class Params(dict[str, np.ndarray]):
    """Named parameter arrays and the :class:`Config` they are of.

    Names: ``embed`` ``(vocab, d_model)``, ``pos`` ``(seq, d_model)``; for each
    block ``i``, ``blocks.{i}.ln1``, ``.wq``, ``.wk``, ``.wv``, ``.wo``,
    ``.ln2``, ``.w1``, ``.b1``, ``.w2``, ``.b2``; ``lnf`` and ``unembed``
    ``(d_model, vocab)``. A stage's ``Params`` hold only that stage's names.
    """

    def __init__(self, items: Mapping[str, np.ndarray] | Iterator[tuple[str, np.ndarray]], cfg: Config) -> None:
        super().__init__(items)
        self.cfg = cfg


def param_shapes(cfg: Config, stage: Stage | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes of ``stage``'s parameters, in packing order (default: the whole model)."""
    stage = stage if stage is not None else stage_of(cfg)
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab
    out: list[tuple[str, tuple[int, ...]]] = []
    if stage.first:
        out += [("embed", (v, d)), ("pos", (cfg.seq, d))]
    for i in range(stage.start, stage.stop):
        b = f"blocks.{i}."
        out += [(b + "ln1", (d,)), (b + "wq", (d, d)), (b + "wk", (d, d)), (b + "wv", (d, d)), (b + "wo", (d, d)),
                (b + "ln2", (d,)), (b + "w1", (d, f)), (b + "b1", (f,)), (b + "w2", (f, d)), (b + "b2", (d,))]
    if stage.last:
        out += [("lnf", (d,)), ("unembed", (d, v))]
    return out


def pack(params: Mapping[str, np.ndarray], stage: Stage | None = None, cfg: Config | None = None) -> np.ndarray:
    """``stage``'s parameters as one flat ``float64`` vector (default: the whole model).

    ``cfg`` defaults to ``params.cfg`` (a :class:`Params`).
    """
    cfg = _cfg_of(params, cfg)
    shapes = param_shapes(cfg, stage)
    for name, shape in shapes:
        if params[name].shape != shape:
            raise ValueError(f"parameter {name!r} has shape {params[name].shape}, expected {shape}")
    return np.concatenate([np.asarray(params[n], dtype=np.float64).ravel() for n, _ in shapes])


def unpack(flat: np.ndarray, cfg: Config, stage: Stage | None = None) -> Params:
    """The named parameters of ``stage`` in ``flat`` (views, no copies); the inverse of :func:`pack`."""
    shapes = param_shapes(cfg, stage)
    total = sum(math.prod(s) for _, s in shapes)
    if flat.shape != (total,):
        raise ValueError(f"flat parameters have shape {flat.shape}, expected ({total},)")
    out, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        out[name] = flat[at:at + n].reshape(shape)
        at += n
    return Params(out, cfg)


def _cfg_of(params: Mapping[str, np.ndarray], cfg: Config | None) -> Config:
    if cfg is not None:
        return cfg
    if isinstance(params, Params):
        return params.cfg
    raise TypeError("pass cfg=, or parameters as a Params (from init_params or unpack), which carry it")


def init_params(cfg: Config, seed: int = 0) -> Params:
    """Random parameters (norm gains near 1, small random biases, scaled matrices)."""
    rng = np.random.default_rng(seed)
    out = {}
    out_scale = 1.0 / math.sqrt(2 * cfg.layers)
    for name, shape in param_shapes(cfg):
        kind = name.rsplit(".", 1)[-1]
        z = rng.standard_normal(shape)
        if kind in ("ln1", "ln2", "lnf"):
            out[name] = 1.0 + 0.1 * z
        elif kind in ("b1", "b2"):
            out[name] = 0.1 * z
        elif kind in ("embed", "pos"):
            out[name] = 0.5 * z
        else:
            scale = 1.0 / math.sqrt(shape[0]) * (out_scale if kind in ("wo", "w2") else 1.0)
            out[name] = scale * z
    return Params(out, cfg)


def make_batch(cfg: Config, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, targets)``, each ``(batch, seq)`` int64: sequences ``x[t+1] = (a * x[t] + b) % vocab``
    with a random start and one of two rules per sequence; targets are the next tokens."""
    rng = np.random.default_rng(seed)
    rules = np.array([[5, 3], [7, 1]])[rng.integers(0, 2, batch)]
    seqs = np.empty((batch, cfg.seq + 1), dtype=np.int64)
    seqs[:, 0] = rng.integers(0, cfg.vocab, batch)
    for t in range(cfg.seq):
        seqs[:, t + 1] = (rules[:, 0] * seqs[:, t] + rules[:, 1]) % cfg.vocab
    return seqs[:, :-1].copy(), seqs[:, 1:].copy()


# -- the model: forward and hand-written backward --------------------------------------
def _rms(x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    n = x / r
    return n * g, (n, r)


def _rms_back(dy: np.ndarray, g: np.ndarray, cache: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    n, r = cache
    dn = dy * g
    dg = np.sum(dy * n, axis=tuple(range(dy.ndim - 1)))
    return (dn - n * np.mean(dn * n, axis=-1, keepdims=True)) / r, dg


def _gelu(u: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * u * (1.0 + np.tanh(GELU_C * (u + 0.044715 * u ** 3))))


def _gelu_grad(u: np.ndarray) -> np.ndarray:
    t = np.tanh(GELU_C * (u + 0.044715 * u ** 3))
    return np.asarray(0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * u * u))


def _heads(a: np.ndarray, h: int) -> np.ndarray:
    b, t, d = a.shape
    return a.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)


def _merge(a: np.ndarray) -> np.ndarray:
    b, h, t, k = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, t, h * k)


def _mm(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w`` over the last axis of ``a``."""
    return np.asarray(a @ w)


def _wgrad(a: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The gradient of ``w`` in ``a @ w``: ``a^T dy`` summed over all leading axes."""
    return np.asarray(a.reshape(-1, a.shape[-1]).T @ dy.reshape(-1, dy.shape[-1]))


def _attention(p: Mapping[str, np.ndarray], b: str, xn: np.ndarray, heads: int) -> tuple[np.ndarray, tuple[Any, ...]]:
    q, k, v = (_heads(_mm(xn, p[b + w]), heads) for w in ("wq", "wk", "wv"))
    t = xn.shape[1]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    a = e / e.sum(axis=-1, keepdims=True)
    o = _merge(a @ v)
    return _mm(o, p[b + "wo"]), (q, k, v, a, o)


def _attention_back(p: Mapping[str, np.ndarray], b: str, xn: np.ndarray, cache: tuple[Any, ...], dy: np.ndarray,
                    grads: dict[str, np.ndarray]) -> np.ndarray:
    q, k, v, a, o = cache
    heads = q.shape[1]
    grads[b + "wo"] = _wgrad(o, dy)
    do = _heads(_mm(dy, p[b + "wo"].T), heads)
    da = do @ v.transpose(0, 1, 3, 2)
    dv = a.transpose(0, 1, 3, 2) @ do
    ds = a * (da - np.sum(da * a, axis=-1, keepdims=True)) / math.sqrt(q.shape[-1])
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    dxn = np.zeros_like(xn)
    for w, dz in (("wq", dq), ("wk", dk), ("wv", dv)):
        dz = _merge(dz)
        grads[b + w] = _wgrad(xn, dz)
        dxn += _mm(dz, p[b + w].T)
    return dxn


def _block(p: Mapping[str, np.ndarray], i: int, x: np.ndarray, heads: int) -> tuple[np.ndarray, tuple[Any, ...]]:
    b = f"blocks.{i}."
    xn, c1 = _rms(x, p[b + "ln1"])
    att, ca = _attention(p, b, xn, heads)
    h = x + att
    hn, c2 = _rms(h, p[b + "ln2"])
    u = _mm(hn, p[b + "w1"]) + p[b + "b1"]
    gu = _gelu(u)
    return h + _mm(gu, p[b + "w2"]) + p[b + "b2"], (xn, c1, ca, hn, c2, u, gu)


def _block_back(p: Mapping[str, np.ndarray], i: int, cache: tuple[Any, ...], dy: np.ndarray,
                grads: dict[str, np.ndarray]) -> np.ndarray:
    b = f"blocks.{i}."
    xn, c1, ca, hn, c2, u, gu = cache
    grads[b + "b2"] = dy.sum(axis=(0, 1))
    grads[b + "w2"] = _wgrad(gu, dy)
    du = _mm(dy, p[b + "w2"].T) * _gelu_grad(u)
    grads[b + "b1"] = du.sum(axis=(0, 1))
    grads[b + "w1"] = _wgrad(hn, du)
    dhn = _mm(du, p[b + "w1"].T)
    dh, grads[b + "ln2"] = _rms_back(dhn, p[b + "ln2"], c2)
    dh += dy
    dxn = _attention_back(p, b, xn, ca, dh, grads)
    dx, grads[b + "ln1"] = _rms_back(dxn, p[b + "ln1"], c1)
    return np.asarray(dx + dh)


def _stage_forward(p: Mapping[str, np.ndarray], x: np.ndarray, cfg: Config,
                   stage: Stage) -> tuple[np.ndarray, list[Any]]:
    """The stage's output (activations, or logits on the last stage) and what its backward needs."""
    caches: list[Any] = []
    h = p["embed"][x] + p["pos"][: x.shape[1]] if stage.first else x
    for i in range(stage.start, stage.stop):
        h, c = _block(p, i, h, cfg.heads)
        caches.append(c)
    if stage.last:
        hn, cf = _rms(h, p["lnf"])
        caches.append((hn, cf))
        h = _mm(hn, p["unembed"])
    return h, caches


def _stage_backward(p: Mapping[str, np.ndarray], x: np.ndarray, dy: np.ndarray, cfg: Config,
                    stage: Stage) -> tuple[Params, np.ndarray]:
    """Gradients of the stage's parameters and of its input, recomputing the forward from ``x``.

    The first stage's input is integer tokens: its input gradient is zeros of their shape.
    """
    _, caches = _stage_forward(p, x, cfg, stage)
    grads: dict[str, np.ndarray] = {}
    dh = dy
    if stage.last:
        hn, cf = caches.pop()
        grads["unembed"] = _wgrad(hn, dy)
        dh, grads["lnf"] = _rms_back(_mm(dy, p["unembed"].T), p["lnf"], cf)
    for i in reversed(range(stage.start, stage.stop)):
        dh = _block_back(p, i, caches.pop(), dh, grads)
    if stage.first:
        grads["embed"] = np.zeros_like(p["embed"])
        np.add.at(grads["embed"], x, dh)
        grads["pos"] = np.zeros_like(p["pos"])
        grads["pos"][: x.shape[1]] = dh.sum(axis=0)
        dh = np.zeros(x.shape)
    return Params(grads, cfg), dh


def _xent(logits: np.ndarray, targets: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Summed cross-entropy of ``targets``, and its gradient divided by ``count`` (the mean's)."""
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - lse
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)
    dlogits = np.exp(logp)
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1.0,
                      axis=-1)
    return np.asarray(-picked.sum()), dlogits / count


# -- the NumPy reference ----------------------------------------------------------------
def reference_forward(params: Mapping[str, np.ndarray], tokens: np.ndarray, cfg: Config | None = None) -> np.ndarray:
    """Logits ``(batch, seq, vocab)`` of integer ``tokens`` ``(batch, seq)`` (``cfg`` from a :class:`Params`)."""
    cfg = _cfg_of(params, cfg)
    return _stage_forward(params, np.asarray(tokens), cfg, stage_of(cfg))[0]


def reference_loss_and_grads(params: Mapping[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray,
                             cfg: Config | None = None) -> tuple[float, Params]:
    """The mean next-token cross-entropy over all tokens and its gradient for every parameter."""
    cfg = _cfg_of(params, cfg)
    stage = stage_of(cfg)
    logits = reference_forward(params, tokens, cfg)
    total, dlogits = _xent(logits, np.asarray(targets), targets.size)
    grads, _ = _stage_backward(params, np.asarray(tokens), dlogits, cfg, stage)
    return float(total) / targets.size, grads


def reference_sgd(params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], lr: float,
                  cfg: Config | None = None) -> Params:
    """``params - lr * grads``, name by name."""
    return Params({k: v - lr * grads[k] for k, v in params.items()}, _cfg_of(params, cfg))


# -- the gangs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageFunctions:
    """The gangs of one stage, for meshes with a ``"data"`` axis.

    Attributes
    ----------
    forward : pathdask.Function
        ``forward(params, x) -> y``. ``params`` is the stage's flat vector,
        ``P()``. ``x`` is tokens ``(batch, seq)`` int, ``P("data", None)``, on
        the first stage, else activations ``(batch, seq, d_model)``,
        ``P("data", None, None)``. ``y`` is activations, or logits
        ``(batch, seq, vocab)`` on the last stage, ``P("data", None, None)``.
    backward : pathdask.Function
        ``backward(params, x, dy) -> (dparams, dx)``: recomputes the forward
        from ``x``; ``dparams`` (flat, ``P()``) is summed over ``"data"``, so
        with ``dy`` from ``loss`` (on the last stage, or passed back from the
        next stage) it is the gradient of the batch's mean loss. ``dx`` has
        ``x``'s shape and spec; on the first stage it is float64 zeros.
        Called on one microbatch, it gives the gradient of that microbatch's
        mean loss: the mean over equal microbatches is the batch's gradient.
    loss : pathdask.Function or None
        On the last stage only: ``loss(logits, targets) -> (loss, dlogits)``;
        ``loss`` is the mean cross-entropy over all the batch's tokens, shape
        ``()``, ``P()``; ``dlogits`` its gradient, ``P("data", None, None)``.
    sgd : pathdask.Function
        ``sgd(params, grads) -> params - lr * grads``, all ``P()``.
    """

    cfg: Config
    stage: Stage
    modelled: Modelled
    lr: float
    forward: pw.Function
    backward: pw.Function
    loss: pw.Function | None
    sgd: pw.Function
    n_params: int = field(default=0)

    def modelled_activation_bytes(self, examples: int) -> int:
        """bf16 bytes of ``examples`` sequences of activations at the modelled size."""
        return self.modelled.activation_bytes(examples)

    def modelled_param_bytes(self, stage: Stage | None = None) -> int:
        """bf16 bytes of the stage's parameters (or another ``stage``'s) at the modelled size."""
        return self.modelled.param_bytes(stage if stage is not None else self.stage)

    def pack(self, params: Mapping[str, np.ndarray]) -> np.ndarray:
        """This stage's part of ``params`` (a whole model's or this stage's) as its flat vector."""
        return pack(params, self.stage, self.cfg)

    def unpack(self, flat: np.ndarray) -> Params:
        return unpack(flat, self.cfg, self.stage)


def make_stage(cfg: Config, stage_index: int = 0, n_stages: int = 1, modelled: Modelled | str | None = None, *,
               lr: float = 0.1, recompute_cost: bool = False) -> StageFunctions:
    """The gangs of stage ``stage_index`` of ``n_stages`` (see :class:`StageFunctions`).

    Parameters
    ----------
    cfg : Config
        The computed size.
    stage_index, n_stages
        Which stage of how many even splits of the blocks; ``0, 1`` is the whole model.
    modelled : Modelled or str, optional
        The size costs are modelled at: a :class:`Modelled`, a name in
        :data:`MODELLED` (``"3B"``, ``"64B"``, ``"136B"``), or ``None`` for
        ``cfg`` itself. The stage holds the same share of the modelled layers.
    lr : float
        The learning rate of ``sgd``.
    recompute_cost : bool
        Charge the backward three forwards (the forward recomputed) instead of two.
    """
    stage = stage_of(cfg, stage_index, n_stages)
    mod = _modelled(modelled, cfg)
    lr = float(lr)
    x_spec = TOKENS if stage.first else ACTIVATIONS
    tag = "" if n_stages == 1 else str(stage_index)

    def forward(params: np.ndarray, x: np.ndarray) -> np.ndarray:
        return _stage_forward(unpack(params, cfg, stage), x, cfg, stage)[0]

    def backward(params: np.ndarray, x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        grads, dx = _stage_backward(unpack(params, cfg, stage), x, dy, cfg, stage)
        return pw.psum(pack(grads, stage, cfg), "data"), dx

    def loss(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count = targets.size * pw.axis_size("data")
        total, dlogits = _xent(logits, targets, count)
        return np.asarray(pw.psum(total, "data") / count), dlogits

    def sgd(params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        return params - lr * grads

    def forward_cost(params: np.ndarray, x: np.ndarray) -> float:
        return mod.forward_flops(stage, x.shape[0])

    def backward_cost(params: np.ndarray, x: np.ndarray, dy: np.ndarray) -> float:
        return mod.backward_flops(stage, x.shape[0], recompute_cost)

    def loss_cost(logits: np.ndarray, targets: np.ndarray) -> float:
        return mod.loss_flops(logits.shape[0])

    def sgd_cost(params: np.ndarray, grads: np.ndarray) -> float:
        return mod.sgd_flops(stage)

    return StageFunctions(
        cfg, stage, mod, lr,
        forward=pw.function(forward, in_specs=(REPLICATED, x_spec), out_specs=ACTIVATIONS, cost=forward_cost,
                            name=f"forward{tag}"),
        backward=pw.function(backward, in_specs=(REPLICATED, x_spec, ACTIVATIONS), out_specs=(REPLICATED, x_spec),
                             cost=backward_cost, name=f"backward{tag}"),
        loss=pw.function(loss, in_specs=(ACTIVATIONS, TOKENS), out_specs=(REPLICATED, ACTIVATIONS),
                         cost=loss_cost, name="loss") if stage.last else None,
        sgd=pw.function(sgd, in_specs=(REPLICATED, REPLICATED), out_specs=REPLICATED, cost=sgd_cost,
                        name=f"sgd{tag}"),
        n_params=sum(math.prod(s) for _, s in param_shapes(cfg, stage)),
    )


def make_train_step(cfg: Config, lr: float, modelled: Modelled | str | None = None) -> pw.ProgramFunction:
    """The whole-model SPMD training step, one program of four gangs on the mesh of ``params``:
    ``(params, tokens, targets) -> (params, loss)``; ``loss`` is that of the parameters it started from.

    ``params`` is the whole model's flat vector (:func:`pack`), ``P()``;
    ``tokens`` and ``targets`` are ``(batch, seq)`` integers, ``P("data", None)``.
    """
    st = make_stage(cfg, 0, 1, modelled, lr=lr)
    assert st.loss is not None
    loss_fn = st.loss

    @pw.program
    def train_step(params: Any, tokens: Any, targets: Any) -> tuple[Any, Any]:
        logits = st.forward(params, tokens)
        loss, dlogits = loss_fn(logits, targets)
        grads, _ = st.backward(params, tokens, dlogits)
        return st.sgd(params, grads), loss

    return train_step


def _cfg_for(params: Params, tokens: np.ndarray) -> Config:
    if tokens.ndim != 2 or tokens.shape[1] > params.cfg.seq:
        raise ValueError(f"tokens must be (batch, seq <= {params.cfg.seq}), got shape {tokens.shape}")
    return params.cfg


def run_step(client: pw.Client, mesh: pw.Mesh, params: Params, tokens: np.ndarray, targets: np.ndarray, *,
             lr: float = 0.1, steps: int = 1, modelled: Modelled | str | None = None) -> dict[str, Any]:
    """Train the whole model for ``steps`` SPMD steps on one ``{"data": N}`` mesh, from NumPy.

    Returns
    -------
    dict
        ``losses`` (one per step, of the parameters it started from), ``loss``
        (the first), ``params`` (:class:`Params` after the last step), ``gangs``
        (per step) and ``wall_s`` (the steps, from dispatch to the last result).
    """
    cfg = _cfg_for(params, tokens)
    step = make_train_step(cfg, lr, modelled)
    arrays: list[pw.ShardedArray] = []
    try:
        flat = client.put(pack(params), mesh, REPLICATED)
        tok = client.put(np.asarray(tokens), mesh, TOKENS)
        tgt = client.put(np.asarray(targets), mesh, TOKENS)
        arrays += [flat, tok, tgt]
        gangs = len(step.trace(flat, tok, tgt).gangs)
        flat.result()
        start = time.perf_counter()
        losses = []
        for _ in range(steps):
            flat, loss = step(flat, tok, tgt)
            arrays += [flat, loss]
            losses.append(loss)
        values = [float(x.result()) for x in losses]
        new = flat.result()
        wall = time.perf_counter() - start
    finally:
        for a in arrays:
            a.delete()
    return {"losses": np.asarray(values), "loss": values[0], "params": unpack(new, cfg), "gangs": gangs,
            "wall_s": wall}


def run_stages(client: pw.Client, meshes: Sequence[pw.Mesh], params: Params, tokens: np.ndarray,
               targets: np.ndarray, modelled: Modelled | str | None = None) -> tuple[float, Params]:
    """The loss and gradients of the model split into ``len(meshes)`` stages, stage ``i`` on ``meshes[i]``.

    Runs the stages one after another, without pipelining: forward through
    every stage, the loss on the last mesh, backward through every stage in
    reverse. Activations and their gradients move between meshes as each
    gang's inputs are moved to its mesh.
    """
    cfg = _cfg_for(params, tokens)
    stages = [make_stage(cfg, i, len(meshes), modelled) for i in range(len(meshes))]
    held: list[pw.ShardedArray] = []
    try:
        flats = [client.put(st.pack(params), m, REPLICATED) for st, m in zip(stages, meshes)]
        tok = client.put(np.asarray(tokens), meshes[0], TOKENS)
        tgt = client.put(np.asarray(targets), meshes[-1], TOKENS)
        held += [*flats, tok, tgt]
        xs = [tok]
        for st, flat, m in zip(stages, flats, meshes):
            xs.append(st.forward(flat, xs[-1], mesh=m))
        held += xs[1:]
        loss_fn = stages[-1].loss
        assert loss_fn is not None
        loss, dy = loss_fn(xs[-1], tgt, mesh=meshes[-1])
        held += [loss, dy]
        grads: dict[str, np.ndarray] = {}
        for st, flat, x, m in reversed(list(zip(stages, flats, xs[:-1], meshes))):
            dflat, dy = st.backward(flat, x, dy, mesh=m)
            held += [dflat, dy]
            grads.update(st.unpack(dflat.result()))
        value = float(loss.result())
    finally:
        for a in held:
            a.delete()
    return value, Params(grads, cfg)
