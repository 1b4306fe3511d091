"""``@pathdask.function``: sharded computations with shard_map semantics.

A :class:`Function` infers its outputs once per signature (its "compilation").
Called inside a program trace it records one gang; called directly on sharded
arrays it runs a one-gang program (:func:`direct_program`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..blocks import as_block
from ..collectives import bind
from ..errors import ShapeMismatchError, ShardingError
from ..mesh import Mesh
from ..sharding import Sharding, global_shape
from ..spec import PartitionSpec
from .program import ProgramFunction
from .tracing import Aval, Traced, current_trace

__all__ = ["Function", "function"]

Cost = float | Callable[..., float] | None


class _InferContext:
    """Gang context used once per signature: collectives return zeros of the right shape."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.position = 0

    def exchange(self, sends: dict[int, np.ndarray], sources: Sequence[int], like: np.ndarray) -> dict[int, np.ndarray]:
        return {p: np.zeros_like(sends.get(p, like)) for p in sources}


def _as_specs(specs: Any, what: str) -> tuple[PartitionSpec, ...]:
    if isinstance(specs, PartitionSpec):
        return (specs,)
    if isinstance(specs, (tuple, list)) and all(isinstance(s, PartitionSpec) for s in specs):
        return tuple(specs)
    raise ShardingError(f"{what} must be a PartitionSpec or a tuple of them, got {specs!r}")


class Function:
    """A sharded computation: ``body`` runs on every device of a mesh, on its blocks.

    Calling it inside a ``@pathdask.program`` records one gang; calling it
    directly on sharded arrays runs a one-gang program and returns futures.
    """

    def __init__(self, body: Callable[..., Any], in_specs: Any, out_specs: Any, cost: Cost = None,
                 name: str | None = None) -> None:
        self.body = body
        self.in_specs = _as_specs(in_specs, "in_specs")
        self.multiple_outputs = not isinstance(out_specs, PartitionSpec)
        self.out_specs = _as_specs(out_specs, "out_specs")
        if cost is not None and not callable(cost) and not (isinstance(cost, (int, float)) and cost >= 0):
            raise ValueError(f"cost= must be seconds (a number >= 0) or a FLOPs callable, got {cost!r}")
        self.cost = cost
        self.name = str(name or getattr(body, "__name__", "function"))
        self._cache: dict[Any, tuple[tuple[Aval, ...], tuple[Aval, ...], float]] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, body)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<pathdask.function {self.name} in={self.in_specs} out={self.out_specs}>"

    def named(self, name: str) -> Function:
        """This function under another name: the name of the gangs that its calls record.

        The twin shares the body, specs, cost and the inference cache, so naming a
        call (for traces: stage, forward or backward, microbatch) costs no
        re-inference. Only the name differs, and the one-gang program that a
        direct call runs is the twin's own.

        Examples
        --------
        >>> f3 = forward.named("s0.F.m3")           # doctest: +SKIP
        >>> y = f3(w, x)                            # doctest: +SKIP  (a gang named "s0.F.m3")
        """
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)  # the same body, specs, cost, cache and its lock
        twin.__dict__.pop("_direct_programs", None)
        twin.name = str(name)
        return twin

    def __call__(self, *args: Any, mesh: Mesh | None = None) -> Any:
        """A gang in the current trace, or (outside one) a one-gang program run at once."""
        tr = current_trace()
        if tr is None:
            return direct_program(self, mesh)(*args)
        for i, a in enumerate(args):
            if not isinstance(a, Traced) or a.trace is not tr:
                raise TypeError(
                    f"Argument {i} of {self.name!r} inside a program is {type(a).__name__}; pass "
                    "sharded arrays in as arguments of the @pathdask.program, and static values "
                    "through closures or functools.partial"
                )
        return tr.call(self, args, mesh)

    def dask_graph(self, *args: Any, mesh: Mesh | None = None) -> Any:
        """The one-gang program that ``self(*args, mesh=mesh)`` runs, as a Dask graph
        (see :meth:`ProgramFunction.dask_graph <pathdask.ProgramFunction.dask_graph>`)."""
        return direct_program(self, mesh).dask_graph(*args)

    def check_args(self, avals: Sequence[Aval], mesh: Mesh) -> list[Sharding]:
        if len(avals) != len(self.in_specs):
            raise ShardingError(
                f"Function {self.name!r} takes {len(self.in_specs)} sharded input(s) per in_specs "
                f"{self.in_specs}, got {len(avals)}"
            )
        return [Sharding(a.shape, mesh, s) for a, s in zip(avals, self.in_specs)]

    def infer(self, mesh: Mesh, avals: Sequence[Aval], device_flops: float) -> tuple[tuple[Aval, ...], tuple[Aval, ...], float]:
        """Per-device output blocks, global outputs and modelled seconds, cached per signature.

        This is pathdask's "compilation": the body runs once on zero blocks, with
        collectives that only produce shapes.
        """
        key = (mesh.axes, tuple(avals))
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        shardings = self.check_args(avals, mesh)
        blocks = [np.zeros(s.shard_shape, dtype=a.dtype) for s, a in zip(shardings, avals)]
        with bind(_InferContext(mesh)), np.errstate(all="ignore"):
            outs = self.body(*blocks)
        values = outs if isinstance(outs, tuple) else (outs,)
        if len(values) != len(self.out_specs) or (isinstance(outs, tuple) != self.multiple_outputs):
            raise ShapeMismatchError(
                f"Function {self.name!r} returned {len(values)} output(s) "
                f"({'a tuple' if isinstance(outs, tuple) else 'one array'}), but out_specs "
                f"{self.out_specs if self.multiple_outputs else self.out_specs[0]} declares "
                f"{len(self.out_specs)}{'' if self.multiple_outputs else ' (not a tuple)'}"
            )
        block_avals, global_avals = [], []
        for i, (v, spec) in enumerate(zip(values, self.out_specs)):
            a = as_block(v, self.name, i)
            block_avals.append(Aval(tuple(a.shape), a.dtype.str))
            global_avals.append(Aval(global_shape(tuple(a.shape), mesh, spec), a.dtype.str))
        seconds = self._seconds(blocks, device_flops)
        result = (tuple(block_avals), tuple(global_avals), seconds)
        with self._lock:
            self._cache[key] = result
        return result

    def _seconds(self, blocks: list[np.ndarray], device_flops: float) -> float:
        if self.cost is None:
            return 0.0
        if callable(self.cost):
            flops = float(self.cost(*blocks))
            if flops < 0:
                raise ValueError(f"cost callable of {self.name!r} returned negative FLOPs {flops}")
            return flops / device_flops
        return float(self.cost)


def direct_program(fn: Function, mesh: Mesh | None) -> ProgramFunction:
    """The one-gang program that a direct call of ``fn`` runs (one per mesh, cached)."""
    direct = fn.__dict__.setdefault("_direct_programs", {})
    prog = direct.get(mesh)
    if prog is None:
        prog = direct[mesh] = ProgramFunction(lambda *xs: fn(*xs, mesh=mesh), name=fn.name)
    return prog



def function(body: Callable[..., Any] | None = None, *, in_specs: Any, out_specs: Any, cost: Cost = None,
             name: str | None = None) -> Any:
    """Declare a sharded computation with ``shard_map`` semantics.

    Parameters
    ----------
    in_specs : PartitionSpec or tuple of them
        How each positional input is split over the mesh; the body sees blocks.
    out_specs : PartitionSpec or tuple of them
        How the body's returned blocks form global outputs. Mesh axes that an
        out_spec does not name must hold identical blocks (replicated outputs).
    cost : float or callable, optional
        Modelled device time: seconds, or a callable of the input blocks that
        returns FLOPs, divided by the topology's ``device_flops``. A device stays
        busy at least this long for each call.

    Examples
    --------
    >>> @function(in_specs=(P("data", None),), out_specs=P())
    ... def total(x):
    ...     return psum(x.sum(), "data")
    """
    def wrap(f: Callable[..., Any]) -> Function:
        return Function(f, in_specs, out_specs, cost, name)

    return wrap(body) if body is not None else wrap
