"""Elastic training: the MLP of ``mlp.py`` loses a host mid-run and carries on.

Every ``checkpoint_every`` steps the weights are written to a zarr checkpoint
with ``client.checkpoint``: each host writes its own shards while the loop
trains on, and the checkpoint counts once committed (the loop settles the
previous one before asking for the next). When a step fails with
:class:`~pathdask.errors.DeviceLostError`, the loop:

1. asks which devices are gone (``client.lost_devices()``);
2. asks for a new mesh of the same shape among the live devices (another
   island, or the lost host's devices if a new worker took its place), or else
   of a smaller shape (the ``data`` axis halved);
3. restores the weights from the last committed checkpoint onto it
   (``client.resume(path, mesh=...)``), puts the data there again, and repeats
   the steps since that checkpoint.

Full-batch gradient descent does the same arithmetic on any mesh shape, so the
final loss matches an uninterrupted run up to floating-point rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import pathdask as pw

from . import mlp

#: called as ``event(kind, step, detail)``: kind is "step" (detail: the loss), "lost" (detail:
#: the error) or "recovered" (detail: the recovery record)
Event = Callable[[str, int, Any], None]


def smaller(shape: dict[str, int]) -> dict[str, int] | None:
    """The mesh shape to try after ``shape`` does not fit: the ``data`` axis halved."""
    if shape["data"] <= 1:
        return None
    return {**shape, "data": shape["data"] // 2}


def remesh(client: pw.Client, shape: dict[str, int]) -> pw.Mesh:
    """A mesh of ``shape`` among the live devices, else of ever smaller shapes."""
    want: dict[str, int] | None = dict(shape)
    while want is not None:
        try:
            return client.mesh(want)
        except pw.SliceTooLargeError:
            want = smaller(want)
    raise pw.SliceTooLargeError(f"No mesh of shape {shape} or smaller fits the live devices "
                                f"(lost: {client.lost_devices()})")


def train(client: pw.Client, steps: int, checkpoint: str | Path, *, checkpoint_every: int = 5,
          lr: float = 0.5, seed: int = 0, interrupt_at: int | None = None,
          interrupt: Callable[[], Any] | None = None, event: Event | None = None) -> dict[str, Any]:
    """Train for ``steps`` steps, surviving lost hosts; ``interrupt()`` runs before step ``interrupt_at``.

    Returns ``losses`` (one per step of the final history), ``reference`` (NumPy's),
    ``final_rel_diff`` (of the last loss), ``recoveries`` (each with its lost devices,
    new mesh, the step it resumed from, and ``seconds``: from the loss to the next
    completed step) and ``mesh_shape`` (the last mesh's shape).
    """
    prob = mlp.make_problem(seed)
    step = mlp.make_train_step(lr)
    shape = dict(mlp.MESH_SHAPE)
    mesh = client.mesh(shape)
    path = str(checkpoint)

    def place(mesh: pw.Mesh) -> tuple[pw.ShardedArray, pw.ShardedArray]:
        return client.put(prob["x"], mesh, mlp.BATCH), client.put(prob["y"], mesh, mlp.BATCH)

    x, y = place(mesh)
    w1, w2 = client.put(prob["w1"], mesh, mlp.W1), client.put(prob["w2"], mesh, mlp.W2)
    client.suspend(path, {"w1": w1, "w2": w2}, release=False)
    saved, losses, recoveries = 0, [], []
    lost_at: float | None = None
    writing: tuple[int, pw.CheckpointFuture] | None = None  # (its step, the checkpoint in flight)

    def settle() -> int:
        """The step of the last committed checkpoint, once the one in flight ended: committed,
        or failed (a host lost mid-write), which leaves the one before at ``path``."""
        nonlocal writing
        if writing is not None:
            at, future = writing
            writing = None
            try:
                future.result()
                return at
            except pw.DeviceLostError:
                pass
        return saved

    while len(losses) < steps:
        done = len(losses)
        try:
            if done == interrupt_at and interrupt is not None and not recoveries:
                interrupt()
            w1, w2, loss = step(x, y, w1, w2)
            losses.append(float(loss.result(timeout="60s")))
            if lost_at is not None:
                recoveries[-1]["seconds"] = time.perf_counter() - lost_at
                lost_at = None
            if event:
                event("step", done + 1, losses[-1])
            if (done + 1) % checkpoint_every == 0:
                saved = settle()
                writing = (done + 1, client.checkpoint(path, {"w1": w1, "w2": w2}))
        except pw.DeviceLostError as e:
            lost_at = lost_at or time.perf_counter()
            if event:
                event("lost", done, e)
            saved = settle()
            lost = client.lost_devices()
            mesh = remesh(client, shape)
            restored = client.resume(path, mesh=mesh)
            w1, w2 = restored["w1"], restored["w2"]
            x, y = place(mesh)
            del losses[saved:]
            recoveries.append({"lost_devices": lost, "mesh": dict(mesh.shape), "devices": list(mesh.device_ids),
                               "resumed_from_step": saved})
            if event:
                event("recovered", saved, recoveries[-1])
    settle()
    ref_losses, _, _ = mlp.reference_train(prob["x"], prob["y"], prob["w1"], prob["w2"], steps, lr)
    return {"losses": np.array(losses), "reference": ref_losses, "recoveries": recoveries,
            "final_rel_diff": abs(losses[-1] - ref_losses[-1]) / abs(ref_losses[-1]),
            "mesh_shape": dict(mesh.shape)}
