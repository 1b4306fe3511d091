"""The pipeline as one program: its stages, and the trace that calls every gang in schedule order.

See :mod:`pathdask.pipeline` for the stage contract and the gang names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..client.function import Function
from ..client.program import ProgramFunction
from ..errors import MeshError, PipelineError
from ..mesh import Mesh
from ..spec import PartitionSpec
from .schedules import SCHEDULES, Step, schedule_table, simulate, trace_order

if TYPE_CHECKING:
    from ..client.array import ShardedArray
    from ..client.client import Client

__all__ = ["ACCUMULATIONS", "REPLICATED", "Pipeline", "Stage"]

#: how a :class:`Pipeline` accumulates gradients
ACCUMULATIONS = ("running", "final")

REPLICATED = PartitionSpec()


@dataclass(frozen=True, eq=False)
class Stage:
    """One pipeline stage: its forward and backward functions and the mesh they run on.

    Parameters
    ----------
    forward : Function
        ``forward(params, x) -> y``.
    backward : Function
        ``backward(params, x, dy) -> (dparams, dx)``; it may recompute the forward.
    mesh : Mesh
        The stage's mesh: its parameters live there, and its gangs run there.

    Examples
    --------
    >>> stage = Stage(layer_forward, layer_backward, client.mesh({"d": 2}))  # doctest: +SKIP
    """

    forward: Function
    backward: Function
    mesh: Mesh

    def __post_init__(self) -> None:
        for what, fn, n_in, n_out in (("forward", self.forward, 2, None), ("backward", self.backward, 3, 2)):
            if not isinstance(fn, Function):
                raise TypeError(f"Stage {what} must be a @pathdask.function, got {type(fn).__name__}")
            n_outs = len(fn.out_specs) if fn.multiple_outputs else None
            if len(fn.in_specs) != n_in or n_outs != n_out:
                want = "(params, x) -> y" if what == "forward" else "(params, x, dy) -> (dparams, dx)"
                got_out = "one output" if n_outs is None else f"a tuple of {n_outs}"
                raise PipelineError(
                    f"Stage {what} {fn.name!r} must be {what}{want}: {n_in} input(s) and "
                    f"{'one output' if n_out is None else f'a tuple of {n_out} outputs'}; its specs "
                    f"declare {len(fn.in_specs)} input(s) and {got_out}"
                )
        if not isinstance(self.mesh, Mesh):
            raise TypeError(f"Stage mesh must be a pathdask.Mesh (client.mesh(...)), got {type(self.mesh).__name__}")


class Pipeline:
    """Forward and backward of ``S`` stages over ``M`` microbatches, as one program.

    Parameters
    ----------
    stages : sequence of Stage
        The stages in order; stage ``s`` feeds stage ``s+1``.
    loss : Function
        ``loss(y, targets) -> (loss, dy)``, run on the last stage's mesh.
    microbatches : int
        ``M``: how many microbatches a call takes.
    schedule : {"1f1b", "gpipe"}
        The order in which each stage runs its forwards and backwards.
    accumulate : {"running", "final"}
        ``"running"`` adds each microbatch's gradient into one accumulator right
        after its backward (``M-1`` small gangs per stage, one gradient held);
        ``"final"`` sums all ``M`` in one gang per stage at the end (fewest
        gangs, ``M`` gradients held until then). Either way the ``1/M`` scale
        and the loss's mean ride in these gangs.
    name : str
        The program's name.
    move_nbytes : callable, optional
        ``move_nbytes(s)``: the bytes one microbatch's activation leaving stage ``s``
        (and its gradient coming back) is modelled to have; moves are timed as if
        they had that many (``x.to(..., model_nbytes=)``). By default, their real bytes.

    Calling the pipeline, ``pipe(params, xs, ys)``, returns ``(loss, grads)`` as
    futures at once: ``loss`` the mean loss (a replicated scalar on the last
    stage's mesh), ``grads[s]`` the mean gradient of ``params[s]`` on stage
    ``s``'s mesh. See :mod:`pathdask.pipeline` for the stage contract.

    Examples
    --------
    >>> pipe = Pipeline([Stage(f0, b0, m0), Stage(f1, b1, m1)], mse, microbatches=4)  # doctest: +SKIP
    >>> pipe.schedule_table()[0]                                                      # doctest: +SKIP
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('F', 3), ('B', 2), ('B', 3)]
    >>> xs, ys = pipe.put_batch(client, x, y)                                         # doctest: +SKIP
    >>> loss, grads = pipe([w0, w1], xs, ys)                                          # doctest: +SKIP
    """

    def __init__(self, stages: Sequence[Stage], loss: Function, microbatches: int, schedule: str = "1f1b", *,
                 accumulate: str = "running", name: str = "pipeline",
                 move_nbytes: Callable[[int], float] | None = None) -> None:
        self.stages = tuple(stages)
        self.move_nbytes = move_nbytes
        if not self.stages:
            raise PipelineError("A pipeline needs at least one Stage")
        for i, st in enumerate(self.stages):
            if not isinstance(st, Stage):
                raise TypeError(f"stages[{i}] must be a pathdask.pipeline.Stage, got {type(st).__name__}")
        if not isinstance(loss, Function):
            raise TypeError(f"loss must be a @pathdask.function, got {type(loss).__name__}")
        if len(loss.in_specs) != 2 or not loss.multiple_outputs or len(loss.out_specs) != 2:
            raise PipelineError(
                f"loss {loss.name!r} must be loss(y, targets) -> (loss, dy): 2 inputs and a tuple of 2 "
                f"outputs; its specs declare {len(loss.in_specs)} input(s) and "
                f"{len(loss.out_specs) if loss.multiple_outputs else 'one'} output(s)"
            )
        if loss.out_specs[0] != REPLICATED:
            raise PipelineError(
                f"loss {loss.name!r} must return its loss replicated, out_specs[0] = P(); got {loss.out_specs[0]}"
            )
        if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)) or microbatches < 1:
            raise PipelineError(f"microbatches must be an int >= 1, got {microbatches!r}")
        if schedule not in SCHEDULES:
            raise PipelineError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if accumulate not in ACCUMULATIONS:
            raise PipelineError(f"accumulate must be one of {ACCUMULATIONS}, got {accumulate!r}")
        self.loss = loss
        self.microbatches = int(microbatches)
        self.schedule = schedule
        self.accumulate = accumulate
        self._means: dict[Any, Function] = {}
        self.program = ProgramFunction(self._trace, name=name)

    def __repr__(self) -> str:
        return (f"<pathdask.pipeline.Pipeline {self.program.name}: {len(self.stages)} stage(s), "
                f"{self.microbatches} microbatch(es), {self.schedule}>")

    # -- the schedule --------------------------------------------------------------
    def schedule_table(self) -> list[list[Step]]:
        """Per stage, the order in which its devices run ``("F" | "B", microbatch)``.

        Examples
        --------
        >>> pipe.schedule_table()[-1]                  # doctest: +SKIP
        [('F', 0), ('B', 0), ('F', 1), ('B', 1), ...]
        """
        return schedule_table(len(self.stages), self.microbatches, self.schedule)

    def timeline(self, forward: float = 1.0, backward: float = 2.0) -> list[list[tuple[str, int, float, float]]]:
        """Per stage, ``(kind, microbatch, start, end)`` of each step on the simulated clock.

        This is the clock that orders the program's calls: a forward takes
        ``forward`` units, a backward ``backward``, and moves take no time.
        """
        times = simulate(self.schedule_table(), forward, backward)
        return [[(k, m, *times[(k, s, m)]) for k, m in steps] for s, steps in enumerate(self.schedule_table())]

    def bubble(self) -> float:
        """The ideal efficiency ``M / (M + S - 1)``: the busy fraction of each stage's time."""
        return self.microbatches / (self.microbatches + len(self.stages) - 1)

    # -- data ------------------------------------------------------------------------
    def put_batch(self, client: Client, x: Any, y: Any, spec_x: PartitionSpec | None = None,
                  spec_y: PartitionSpec | None = None) -> tuple[list[ShardedArray], list[ShardedArray]]:
        """Split a batch into ``M`` microbatches (by rows) and put them where they are used.

        Parameters
        ----------
        client : Client
        x, y : array_like
            Inputs and targets, with the batch along axis 0.
        spec_x, spec_y : PartitionSpec, optional
            How a microbatch is split over its mesh; by default the first
            stage's forward's ``x`` spec and the loss's ``targets`` spec.

        Returns
        -------
        (xs, ys)
            ``xs[m]`` on the first stage's mesh, ``ys[m]`` on the last stage's.
        """
        x, y = np.asarray(x), np.asarray(y)
        m = self.microbatches
        if x.ndim == 0 or y.ndim == 0:
            raise PipelineError("put_batch needs arrays with the batch along axis 0, got a scalar")
        if x.shape[0] != y.shape[0]:
            raise PipelineError(f"x and y must have the same batch size (axis 0), got {x.shape[0]} and {y.shape[0]}")
        if x.shape[0] % m:
            raise PipelineError(
                f"The batch of {x.shape[0]} rows does not split into {m} equal microbatches; use a batch "
                f"that is a multiple of {m}, or another number of microbatches"
            )
        spec_x = self.stages[0].forward.in_specs[1] if spec_x is None else spec_x
        spec_y = self.loss.in_specs[1] if spec_y is None else spec_y
        xs = [client.put(part, self.stages[0].mesh, spec_x) for part in np.split(x, m)]
        ys = [client.put(part, self.stages[-1].mesh, spec_y) for part in np.split(y, m)]
        return xs, ys

    # -- running -----------------------------------------------------------------------
    def __call__(self, params: Sequence[ShardedArray], xs: Sequence[ShardedArray],
                 ys: Sequence[ShardedArray]) -> tuple[ShardedArray, list[ShardedArray]]:
        """Run one forward and backward pass: ``(mean loss, [mean gradient per stage])``, as futures."""
        params, xs, ys = self._check(params, xs, ys)
        out = self.program(*params, *xs, *ys)
        return out[0], list(out[1:])

    def _check(self, params: Any, xs: Any, ys: Any) -> tuple[list[Any], list[Any], list[Any]]:
        s, m = len(self.stages), self.microbatches
        for what, seq, n, per, pers in (("params", params, s, "stage", "stages"),
                                        ("xs", xs, m, "microbatch", "microbatches"),
                                        ("ys", ys, m, "microbatch", "microbatches")):
            if not isinstance(seq, (list, tuple)):
                raise TypeError(f"{what} must be a list of sharded arrays, one per {per}; got {type(seq).__name__}")
            if len(seq) != n:
                raise PipelineError(
                    f"{what} holds {len(seq)} array(s); this pipeline has {n} {per if n == 1 else pers}: "
                    f"pass one array per {per}" + (" (pipe.put_batch splits a batch)" if what != "params" else "")
                )
        for i, (p, st) in enumerate(zip(params, self.stages)):
            if getattr(p, "mesh", None) != st.mesh:
                raise MeshError(
                    f"params[{i}] lives on mesh {getattr(getattr(p, 'mesh', None), 'shape', None)}, not on "
                    f"stage {i}'s mesh {st.mesh.shape}: put each stage's parameters on its own stage mesh"
                )
        return list(params), list(xs), list(ys)

    def _nbytes(self, stage: int) -> float | None:
        return None if self.move_nbytes is None else float(self.move_nbytes(stage))

    def _mean(self, specs: tuple[PartitionSpec, ...], n: int, scale: float) -> Function:
        """A gang that sums ``n`` arrays of each spec and scales the sums (one Function per kind)."""
        key = (specs, n, scale)
        fn = self._means.get(key)
        if fn is None:
            fn = self._means[key] = Function(_summer(len(specs), n, scale), tuple(s for s in specs for _ in range(n)),
                                             specs if len(specs) > 1 else specs[0], name="mean")
        return fn

    def _trace(self, *arrays: Any) -> tuple[Any, ...]:
        """The program's body: every gang of the schedule, in the order of the simulated clock."""
        stages, n_stages, n_micro = self.stages, len(self.stages), self.microbatches
        params = arrays[:n_stages]
        xs, ys = arrays[n_stages:n_stages + n_micro], arrays[n_stages + n_micro:]
        last = n_stages - 1
        inputs: dict[tuple[int, int], Any] = {(0, m): xs[m] for m in range(n_micro)}  # x of (stage, mb)
        outputs: dict[tuple[int, int], Any] = {}  # y of (stage, mb), until it moves on
        grads_in: dict[tuple[int, int], Any] = {}  # dy of (stage, mb)
        grads_out: dict[tuple[int, int], Any] = {}  # dx of (stage, mb), until it moves back
        losses: list[Any] = [None] * n_micro
        dparams: list[list[Any]] = [[] for _ in range(n_stages)]
        acc: list[Any] = [None] * n_stages
        acc_loss: Any = None
        made: dict[tuple[int, int], Any] = {}  # dparams of (stage, mb), until accumulated
        done = [0] * n_stages  # backwards accumulated per stage
        running = self.accumulate == "running" and n_micro > 1
        for kind, s, m in trace_order(self.schedule_table()):
            st = stages[s]
            if kind == "F":
                x = inputs[(s, m)] = inputs[(s, m)].to(st.mesh, st.forward.in_specs[1], name=f"in.m{m}")
                y = st.forward.named(f"s{s}.F.m{m}")(params[s], x, mesh=st.mesh)
                if s == last:
                    losses[m], grads_in[(s, m)] = self.loss.named(f"s{s}.L.m{m}")(y, ys[m], mesh=st.mesh)
                    if losses[m].shape != ():
                        raise PipelineError(
                            f"loss {self.loss.name!r} must return the microbatch's mean loss as a scalar "
                            f"(shape ()), got shape {losses[m].shape}"
                        )
                else:
                    outputs[(s, m)] = y
            elif kind == "B":
                dp, dx = st.backward.named(f"s{s}.B.m{m}")(params[s], inputs.pop((s, m)), grads_in.pop((s, m)),
                                                          mesh=st.mesh)
                if s > 0:
                    grads_out[(s, m)] = dx
                made[(s, m)] = dp
            elif kind == "acc":  # after the backward's dx has been sent on
                dp = made.pop((s, m))
                done[s] += 1
                if not running:
                    dparams[s].append(dp)
                elif done[s] == 1:
                    acc[s] = dp
                    if s == last:
                        acc_loss = losses[m]
                else:
                    scale = 1.0 / n_micro if done[s] == n_micro else 1.0
                    gspec = st.backward.out_specs[0]
                    name = f"s{s}.acc.m{m}"
                    if s == last:
                        acc[s], acc_loss = self._mean((gspec, REPLICATED), 2, scale).named(name)(
                            acc[s], dp, acc_loss, losses[m], mesh=st.mesh)
                    else:
                        acc[s] = self._mean((gspec,), 2, scale).named(name)(acc[s], dp, mesh=st.mesh)
            elif kind == "sendF":  # y of (s, m) moves on to stage s+1, as soon as it is made
                nxt = stages[s + 1]
                inputs[(s + 1, m)] = outputs.pop((s, m)).to(nxt.mesh, nxt.forward.in_specs[1], name=f"s{s}>s{s + 1} m{m}",
                                                            model_nbytes=self._nbytes(s))
            else:  # "sendB": dx of (s, m) moves back to stage s-1
                prev = stages[s - 1]
                grads_in[(s - 1, m)] = grads_out.pop((s, m)).to(prev.mesh, prev.backward.in_specs[2],
                                                                name=f"s{s}>s{s - 1} m{m}", model_nbytes=self._nbytes(s - 1))
        if n_micro == 1:
            return (losses[0], *(d[0] for d in dparams))
        if running:
            return (acc_loss, *acc)
        grads = []
        for s, st in enumerate(stages):
            gspec = st.backward.out_specs[0]
            if s == last:
                g, loss = self._mean((gspec, REPLICATED), n_micro, 1.0 / n_micro).named(f"s{s}.mean")(
                    *dparams[s], *losses, mesh=st.mesh)
            else:
                g = self._mean((gspec,), n_micro, 1.0 / n_micro).named(f"s{s}.mean")(*dparams[s], mesh=st.mesh)
            grads.append(g)
        return (loss, *grads)


def _summer(k: int, n: int, scale: float) -> Callable[..., Any]:
    """A body taking ``k`` groups of ``n`` blocks: per group, the scaled sum."""

    def mean(*blocks: np.ndarray) -> Any:
        outs = []
        for g in range(k):
            total = blocks[g * n]
            for b in blocks[g * n + 1:(g + 1) * n]:
                total = total + b
            outs.append(total * scale if scale != 1.0 else total)
        return tuple(outs) if k > 1 else outs[0]

    return mean
