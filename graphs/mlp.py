"""A two-layer MLP trained with data x model sharding, and its NumPy reference.

Global shapes: ``x`` is ``(batch, d_in)``, ``y`` is ``(batch, d_out)``, ``w1`` is
``(d_in, hidden)`` and ``w2`` is ``(hidden, d_out)``. On a mesh
``{"data": D, "model": M}`` (Megatron-style tensor parallelism):

- ``x`` and ``y`` are split by rows over ``"data"``: ``P("data", None)``;
- ``w1`` is split by columns over ``"model"``: ``P(None, "model")``, so each
  device computes its own ``hidden / M`` units, ``tanh(x @ w1)``;
- ``w2`` is split by rows over ``"model"``: ``P("model", None)``, so ``h @ w2``
  gives partial sums that a ``psum`` over ``"model"`` completes;
- the loss is the mean squared error; gradients of each data shard's mean are
  averaged with ``pmean`` over ``"data"``, which equals the gradient of the
  global mean because the shards are equal in size.

One training step is one ``@pathdask.program`` of four gangs (forward, loss,
backward, SGD). Parameters stay on the devices from step to step: the outputs
of a step are the inputs of the next one, as ``ShardedArray`` futures.

Examples
--------
>>> with pw.LocalSystem(processes=False) as system:
...     out = train(system.client(), steps=10)
>>> out["rel_diff"] < 1e-6
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import pathdask as pw
from pathdask import P

__all__ = [
    "MESH_SHAPE",
    "backward",
    "forward",
    "loss_and_grad",
    "make_evaluate",
    "make_problem",
    "make_sgd",
    "make_train_step",
    "mse",
    "reference_mse",
    "reference_train",
    "train",
]

MESH_SHAPE: dict[str, int] = {"data": 2, "model": 2}

BATCH = P("data", None)  # x, y, predictions and their gradients
HIDDEN = P("data", "model")  # activations: this device's rows and hidden units
W1 = P(None, "model")  # column parallel
W2 = P("model", None)  # row parallel
REPLICATED = P()  # the loss, identical on every device

Progress = Callable[[int, "float | None"], None]


# -- modelled device time: FLOPs of the per-device blocks -----------------------
def _forward_flops(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> float:
    return 2.0 * x.shape[0] * w1.shape[1] * (x.shape[1] + w2.shape[1])


def _mse_flops(x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> float:
    return _forward_flops(x, w1, w2)


def _backward_flops(x: np.ndarray, h: np.ndarray, dpred: np.ndarray, w2: np.ndarray) -> float:
    return 2.0 * x.shape[0] * h.shape[1] * (x.shape[1] + 2 * w2.shape[1])


# -- the gangs ---------------------------------------------------------------------
@pw.function(in_specs=(BATCH, W1, W2), out_specs=(HIDDEN, BATCH), cost=_forward_flops)
def forward(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden activations of this device's units and the full prediction."""
    h = np.tanh(x @ w1)
    pred = pw.psum(h @ w2, "model")  # each device holds partial sums over its hidden units
    return h, pred


@pw.function(in_specs=(BATCH, BATCH), out_specs=(REPLICATED, BATCH))
def loss_and_grad(pred: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The global mean squared error and its gradient with respect to this shard's predictions.

    The gradient is that of the shard's own mean; ``backward`` averages over ``"data"``.
    """
    err = pred - y
    loss = pw.pmean(np.mean(err * err), "data")
    return loss, (2.0 / err.size) * err


@pw.function(in_specs=(BATCH, HIDDEN, BATCH, W2), out_specs=(W1, W2), cost=_backward_flops)
def backward(x: np.ndarray, h: np.ndarray, dpred: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of both weight blocks, averaged over the data shards."""
    dw2 = pw.pmean(h.T @ dpred, "data")
    dz = (dpred @ w2.T) * (1.0 - h * h)  # only this device's hidden units: no model collective
    dw1 = pw.pmean(x.T @ dz, "data")
    return dw1, dw2


@pw.function(in_specs=(BATCH, BATCH, W1, W2), out_specs=REPLICATED, cost=_mse_flops)
def mse(x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """The mean squared error of the model on ``(x, y)``, without gradients."""
    pred = pw.psum(np.tanh(x @ w1) @ w2, "model")
    err = pred - y
    return pw.pmean(np.mean(err * err), "data")


def make_sgd(lr: float) -> pw.Function:
    """The SGD update with learning rate ``lr`` (a static value, closed over)."""
    lr = float(lr)

    def sgd(w1: np.ndarray, w2: np.ndarray, dw1: np.ndarray, dw2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w1 - lr * dw1, w2 - lr * dw2

    return pw.function(sgd, in_specs=(W1, W2, W1, W2), out_specs=(W1, W2))


def make_train_step(lr: float) -> pw.ProgramFunction:
    """One training step as one program: ``(x, y, w1, w2) -> (w1, w2, loss)``.

    ``loss`` is that of the weights the step started from.
    """
    sgd = make_sgd(lr)

    @pw.program
    def train_step(x: Any, y: Any, w1: Any, w2: Any) -> tuple[Any, Any, Any]:
        h, pred = forward(x, w1, w2)
        loss, dpred = loss_and_grad(pred, y)
        dw1, dw2 = backward(x, h, dpred, w2)
        new_w1, new_w2 = sgd(w1, w2, dw1, dw2)
        return new_w1, new_w2, loss

    return train_step


def make_evaluate() -> pw.ProgramFunction:
    """``(x, y, w1, w2) -> loss`` on the mesh of ``x``; weights elsewhere are moved there."""

    @pw.program
    def evaluate(x: Any, y: Any, w1: Any, w2: Any) -> Any:
        return mse(x, y, w1, w2, mesh=x.mesh)

    return evaluate


# -- the NumPy reference -----------------------------------------------------------
def make_problem(seed: int = 0, batch: int = 64, d_in: int = 16, hidden: int = 32,
                 d_out: int = 8) -> dict[str, np.ndarray]:
    """A regression problem: a random teacher MLP, training and held-out data, initial weights."""
    rng = np.random.default_rng(seed)
    t1 = rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)
    t2 = rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)

    def teacher(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.tanh(x @ t1) @ t2)

    x = rng.standard_normal((batch, d_in))
    x_eval = rng.standard_normal((batch, d_in))
    return {
        "x": x,
        "y": teacher(x),
        "x_eval": x_eval,
        "y_eval": teacher(x_eval),
        "w1": rng.standard_normal((d_in, hidden)) / np.sqrt(d_in),
        "w2": rng.standard_normal((hidden, d_out)) / np.sqrt(hidden),
    }


def reference_mse(x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> float:
    """The loss of ``train_step`` and ``mse``, on global arrays in one process."""
    err = np.tanh(x @ w1) @ w2 - y
    return float(np.mean(err * err))


def reference_train(x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray, steps: int,
                    lr: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-batch gradient descent on global arrays: ``(losses, w1, w2)``."""
    losses = np.empty(steps)
    for k in range(steps):
        h = np.tanh(x @ w1)
        err = h @ w2 - y
        losses[k] = np.mean(err * err)
        dpred = (2.0 / err.size) * err
        dw2 = h.T @ dpred
        dw1 = x.T @ ((dpred @ w2.T) * (1.0 - h * h))
        w1, w2 = w1 - lr * dw1, w2 - lr * dw2
    return losses, w1, w2


# -- training on a pathdask system -------------------------------------------------
def train(client: pw.Client, steps: int, *, mesh: pw.Mesh | None = None, eval_mesh: pw.Mesh | None = None,
          lr: float = 0.5, seed: int = 0, sizes: Mapping[str, int] | None = None, log_every: int = 5,
          progress: Progress | None = None) -> dict[str, Any]:
    """Train the MLP for ``steps`` steps and compare it with :func:`reference_train`.

    Parameters
    ----------
    client : pathdask.Client
    steps : int
        Training steps, one program each.
    mesh : Mesh, optional
        Where to train; by default ``client.mesh(MESH_SHAPE)``.
    eval_mesh : Mesh, optional
        If given, the trained weights are moved there (over DCN when it is on
        another island) and evaluated on held-out data.
    lr, seed
        Learning rate and problem seed.
    sizes : mapping, optional
        ``batch``, ``d_in``, ``hidden``, ``d_out`` for :func:`make_problem`.
    log_every : int
        Fetch the pending losses every this many steps; other steps only
        dispatch, so that devices never wait for the controller.
    progress : callable, optional
        Called as ``progress(steps_done, loss)`` after each dispatched step;
        ``loss`` is the newest fetched loss, or ``None`` if none was fetched.

    Returns
    -------
    dict
        ``losses``, ``w1``, ``w2`` (NumPy), ``reference`` (the same from
        NumPy), ``max_abs_diff`` and ``rel_diff`` (relative to the largest
        reference value of each array), ``gangs`` dispatched, ``wall_s``, and
        ``eval_loss`` / ``reference_eval_loss`` when ``eval_mesh`` is given.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if log_every < 1:
        raise ValueError(f"log_every must be >= 1, got {log_every}")
    prob = make_problem(seed, **dict(sizes or {}))
    mesh = mesh if mesh is not None else client.mesh(dict(MESH_SHAPE))
    step = make_train_step(lr)
    start = time.perf_counter()
    arrays: dict[str, pw.ShardedArray] = {}
    pending: list[pw.ShardedArray] = []
    losses: list[float] = []
    gangs = 0
    try:
        arrays["x"] = client.put(prob["x"], mesh, BATCH)
        arrays["y"] = client.put(prob["y"], mesh, BATCH)
        arrays["w1"] = client.put(prob["w1"], mesh, W1)
        arrays["w2"] = client.put(prob["w2"], mesh, W2)
        args = (arrays["x"], arrays["y"])
        n_gangs = len(step.trace(*args, arrays["w1"], arrays["w2"]).gangs)
        for k in range(steps):
            # Rebinding drops the previous weights; their buffers are freed once read.
            arrays["w1"], arrays["w2"], loss = step(*args, arrays["w1"], arrays["w2"])
            gangs += n_gangs
            pending.append(loss)
            latest = None
            if (k + 1) % log_every == 0 or k + 1 == steps:
                latest = _drain(pending, losses)
            if progress is not None:
                progress(k + 1, latest)
        w1, w2 = arrays["w1"].result(), arrays["w2"].result()
        eval_loss = None
        if eval_mesh is not None:
            arrays["x_eval"] = client.put(prob["x_eval"], eval_mesh, BATCH)
            arrays["y_eval"] = client.put(prob["y_eval"], eval_mesh, BATCH)
            evaluate = make_evaluate()
            out = evaluate(arrays["x_eval"], arrays["y_eval"], arrays["w1"], arrays["w2"])
            pending.append(out)
            gangs += len(evaluate.trace(arrays["x_eval"], arrays["y_eval"], arrays["w1"], arrays["w2"]).gangs)
            eval_loss = _drain(pending, [])
        wall = time.perf_counter() - start
    finally:
        for a in (*arrays.values(), *pending):
            a.delete()
        arrays.clear()
        pending.clear()

    ref_losses, ref_w1, ref_w2 = reference_train(prob["x"], prob["y"], prob["w1"], prob["w2"], steps, lr)
    result: dict[str, Any] = {
        "steps": steps,
        "losses": np.asarray(losses),
        "w1": w1,
        "w2": w2,
        "reference": {"losses": ref_losses, "w1": ref_w1, "w2": ref_w2},
        "gangs": gangs,
        "wall_s": wall,
    }
    pairs = [(result["losses"], ref_losses), (w1, ref_w1), (w2, ref_w2)]
    if eval_loss is not None:
        ref_eval = reference_mse(prob["x_eval"], prob["y_eval"], ref_w1, ref_w2)
        result["eval_loss"], result["reference"]["eval_loss"] = eval_loss, ref_eval
        pairs.append((np.asarray(eval_loss), np.asarray(ref_eval)))
    diffs = [float(np.max(np.abs(a - b))) for a, b in pairs]
    scales = [max(float(np.max(np.abs(b))), np.finfo(float).tiny) for _, b in pairs]
    result["max_abs_diff"] = max(diffs)
    result["rel_diff"] = max(d / s for d, s in zip(diffs, scales))
    return result


def _drain(pending: list[pw.ShardedArray], into: list[float]) -> float:
    """Fetch the pending scalar losses in order, free them, and return the newest."""
    for a in pending:
        into.append(float(a.result()))
        a.delete()
    pending.clear()
    return into[-1]
