"""Pipeline parallelism: stages on their own meshes, microbatches, GPipe and 1F1B schedules.

A :class:`Pipeline` turns ``S`` stage functions on ``S`` stage meshes (in one
island or spread over several) and ``M`` microbatches into ONE
``@pathdask.program``: one submission runs every forward, loss and backward
gang, moves activations and their gradients between the stage meshes, and
returns the mean loss and the mean gradient of every stage's parameters.

The schedule is set by trace order alone. Every device runs its ops in the
order the program called them, so the library simulates the schedule on a
clock (a forward takes 1 unit, a backward 2; ``F(s, m)`` waits for
``F(s-1, m)``, ``B(s, m)`` for ``B(s+1, m)``) and calls the functions in the
order of their simulated start times. Each move between stage meshes is
recorded when its value is ready (the end of the gang that makes it), so the
sending stage sends before it goes on and the receiving stage finds it in
time.

- ``"gpipe"``: each stage runs the forwards of microbatches ``0..M-1``, then
  their backwards. All ``M`` activations of a stage are live at once.
- ``"1f1b"`` (PipeDream-flush): stage ``s`` runs ``S-s-1`` warm-up forwards,
  then alternates one forward and one backward, then the cool-down
  backwards. At most ``S-s`` activations of stage ``s`` are live at once.

Both have the same ideal efficiency, :meth:`Pipeline.bubble`
``= M / (M + S - 1)``.

Stage contract
--------------
- ``forward(params, x) -> y``;
- ``backward(params, x, dy) -> (dparams, dx)``: it may recompute the forward
  from ``x``; the first stage's ``dx`` is not used;
- ``loss(y, targets) -> (loss, dy)`` on the last stage's mesh: ``loss`` is the
  microbatch's mean loss, a replicated scalar (``P()``, shape ``()``), and
  ``dy`` its gradient with respect to ``y``;
- each stage has one parameter array, on that stage's mesh.

The pipeline returns the mean of the microbatch losses and, per stage, the
mean of the microbatch ``dparams``: with microbatches of equal size these are
the full batch's mean loss and its gradient.

Gangs are named for traces (devices x time, coloured by stage and
microbatch): ``s2.F.m5`` is stage 2's forward of microbatch 5, ``s2.B.m5``
its backward, ``s3.L.m5`` the loss on the last stage, ``s2.acc.m5`` the
gradient accumulation after a backward and ``s2.mean`` a final mean; moves
between meshes are named for their stages, ``s1>s2 m5`` forward and ``s2>s1 m5`` back.

Examples
--------
>>> import numpy as np
>>> import pathdask as pw
>>> from pathdask import P
>>> @pw.function(in_specs=(P(), P()), out_specs=P())
... def forward(w, x):
...     return np.tanh(x @ w)
>>> @pw.function(in_specs=(P(), P(), P()), out_specs=(P(), P()))
... def backward(w, x, dy):
...     dz = dy * (1.0 - np.tanh(x @ w) ** 2)
...     return x.T @ dz, dz @ w.T
>>> @pw.function(in_specs=(P(), P()), out_specs=(P(), P()))
... def mse(y, t):
...     err = y - t
...     return np.mean(err * err), (2.0 / err.size) * err
>>> meshes = [client.mesh({"d": 1}, island=i) for i in (0, 1)]        # doctest: +SKIP
>>> pipe = pw.pipeline.Pipeline([pw.pipeline.Stage(forward, backward, m) for m in meshes],
...                             mse, microbatches=4, schedule="1f1b")  # doctest: +SKIP
>>> params = [client.put(w, m) for w, m in zip(weights, meshes)]       # doctest: +SKIP
>>> xs, ys = pipe.put_batch(client, x, y)                              # doctest: +SKIP
>>> loss, grads = pipe(params, xs, ys)         # one program; futures  # doctest: +SKIP
>>> float(loss.result()), [g.result() for g in grads]                  # doctest: +SKIP

The package: :mod:`.schedules` (GPipe and 1F1B, and the clock that orders the
calls) and :mod:`.program` (:class:`Stage`, and :class:`Pipeline`, which builds
the one program).
"""

from __future__ import annotations

# ACCUMULATIONS, REPLICATED, Step and trace_order: importable from here, as before the split
from .program import ACCUMULATIONS, REPLICATED, Pipeline, Stage  # noqa: F401
from .schedules import SCHEDULES, Step, schedule_table, simulate, trace_order  # noqa: F401

__all__ = ["SCHEDULES", "Pipeline", "Stage", "schedule_table", "simulate"]
