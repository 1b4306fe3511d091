"""``@pathdask.program``: tracing calls of functions into a sharded dataflow graph.

A :class:`Program` is immutable: values (logical sharded arrays) and gangs
(one per function call or resharding), in program order. It is traced once
per input signature and cached; lowering (``lowering.py``) turns it into one
plan per host.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import MeshError, ShardingError
from ..mesh import Mesh
from ..sharding import Sharding
from ..spec import PartitionSpec
from .function import Aval, Function

if TYPE_CHECKING:
    from .array import ShardedArray
    from .graph import ProgramGraph

__all__ = ["Program", "ProgramFunction", "program"]


@dataclass(frozen=True)
class ValueInfo:
    vid: int
    shape: tuple[int, ...]
    dtype: str
    mesh: Mesh
    spec: PartitionSpec

    @property
    def sharding(self) -> Sharding:
        return Sharding(self.shape, self.mesh, self.spec)


@dataclass(frozen=True, eq=False)
class GangNode:
    """One gang: a function call (``kernel``) or a move to another mesh/spec (``reshard``)."""

    index: int
    kind: str
    name: str
    mesh: Mesh
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    function: Function | None = None
    block_avals: tuple[Aval, ...] = ()
    cost_s: float = 0.0
    scale: float = 1.0  # a reshard's modelled bytes per real byte


@dataclass(frozen=True, eq=False)
class Program:
    """A traced program: values ``0..n_inputs-1`` are its arguments."""

    name: str
    n_inputs: int
    values: tuple[ValueInfo, ...]
    gangs: tuple[GangNode, ...]
    outputs: tuple[int, ...]
    multiple_outputs: bool

    def __repr__(self) -> str:
        kinds = [g.name for g in self.gangs]
        return f"<Program {self.name}: {len(self.gangs)} gang(s) {kinds[:8]}{'...' if len(kinds) > 8 else ''}>"

    def _repr_html_(self) -> str:
        from ..html import card
        return card("pathdask.Program", self.name, self._html_body())

    def _html_body(self, *rows: tuple[str, Any]) -> str:
        """``rows`` and this program's own rows, then its gangs."""
        from ..html import columns, details, host_label, table

        rows += (("gangs", len(self.gangs)), ("inputs", self.n_inputs), ("outputs", len(self.outputs)))
        gangs = columns(("#", "gang", "kind", "mesh", "devices", "hosts", "cost (s)"), (
            (g.index, g.name, g.kind, ", ".join(f"{a}: {n}" for a, n in g.mesh.axes),
             " ".join(str(i) for i in g.mesh.device_ids),
             " ".join(dict.fromkeys(host_label(d) for d in g.mesh.devices)), f"{g.cost_s:g}")
            for g in self.gangs[:MAX_GANGS_SHOWN]))
        more = f"<p>... and {len(self.gangs) - MAX_GANGS_SHOWN} more</p>" if len(self.gangs) > MAX_GANGS_SHOWN else ""
        return table(rows) + details("Gangs", gangs + more, open_=len(self.gangs) <= 16)


#: gangs listed in a program's HTML repr
MAX_GANGS_SHOWN = 64


class Traced:
    """A symbolic sharded array inside a program trace."""

    __slots__ = ("info", "trace")

    def __init__(self, info: ValueInfo, trace: _Trace) -> None:
        self.info, self.trace = info, trace

    shape = property(lambda self: self.info.shape)
    mesh = property(lambda self: self.info.mesh)
    spec = property(lambda self: self.info.spec)
    dtype = property(lambda self: np.dtype(self.info.dtype))
    ndim = property(lambda self: len(self.info.shape))

    def __repr__(self) -> str:
        return f"Traced(v{self.info.vid}, shape={self.shape}, dtype={self.dtype}, spec={self.spec})"

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "A traced value has no data while a @pathdask.program is being traced; only "
            "@pathdask.function calls may use it"
        )

    def to(self, mesh: Mesh, spec: PartitionSpec | None = None, *, model_nbytes: float | None = None,
           name: str = "reshard") -> Traced:
        """This value moved onto ``mesh`` with ``spec`` (one gang of transfers); see
        :meth:`pathdask.ShardedArray.to`."""
        spec = self.spec if spec is None else spec
        check_move(mesh, spec, self.info.vid)
        if mesh == self.mesh and spec == self.spec:
            return self
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        return self.trace.reshard(self, mesh, spec, scale=move_scale(model_nbytes, nbytes), name=name)


class _Trace:
    def __init__(self, device_flops: float) -> None:
        self.device_flops = device_flops
        self.values: list[ValueInfo] = []
        self.gangs: list[GangNode] = []

    def new_value(self, shape: tuple[int, ...], dtype: str, mesh: Mesh, spec: PartitionSpec) -> Traced:
        info = ValueInfo(len(self.values), tuple(shape), np.dtype(dtype).str, mesh, spec)
        Sharding(info.shape, mesh, spec)  # validates
        self.values.append(info)
        return Traced(info, self)

    def reshard(self, x: Traced, mesh: Mesh, spec: PartitionSpec, scale: float = 1.0,
                name: str = "reshard") -> Traced:
        out = self.new_value(x.shape, x.info.dtype, mesh, spec)
        self.gangs.append(GangNode(len(self.gangs), "reshard", name, mesh, (x.info.vid,), (out.info.vid,),
                                   scale=scale))
        return out

    def call(self, fn: Function, args: tuple[Traced, ...], mesh: Mesh | None) -> Any:
        if not args and mesh is None:
            raise ShardingError(f"Function {fn.name!r} has no inputs; pass mesh= to say where it runs")
        mesh = mesh if mesh is not None else args[0].mesh
        fn.check_args([Aval(a.shape, a.info.dtype) for a in args], mesh)
        moved = tuple(
            a if (a.mesh == mesh and a.spec == spec) else self.reshard(a, mesh, spec)
            for a, spec in zip(args, fn.in_specs)
        )
        blocks, outs, seconds = fn.infer(mesh, [Aval(a.shape, a.info.dtype) for a in moved], self.device_flops)
        results = tuple(self.new_value(o.shape, o.dtype, mesh, s) for o, s in zip(outs, fn.out_specs))
        self.gangs.append(GangNode(
            len(self.gangs), "kernel", fn.name, mesh,
            tuple(a.info.vid for a in moved), tuple(r.info.vid for r in results),
            fn, blocks, seconds,
        ))
        return results if fn.multiple_outputs else results[0]


def check_move(mesh: Any, spec: Any, what: Any) -> None:
    """``x.to(mesh, spec)``'s arguments, with errors that say what came."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"x.to(mesh, spec): mesh must be a pathdask Mesh (client.mesh(...)), got "
                        f"{type(mesh).__name__} for value {what}")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"x.to(mesh, spec): spec must be a PartitionSpec such as P('data', None), got {spec!r}")


def move_scale(model_nbytes: float | None, nbytes: int) -> float:
    """Modelled bytes per real byte of a move (``model_nbytes=``; 1 when not given)."""
    if model_nbytes is None:
        return 1.0
    if not model_nbytes >= 0:
        raise ValueError(f"model_nbytes must be a number of bytes >= 0, got {model_nbytes!r}")
    return float(model_nbytes) / nbytes if nbytes else 1.0


_state = threading.local()


def _current() -> _Trace | None:
    return getattr(_state, "trace", None)


def trace_program(fn: Callable[..., Any], name: str, arrays: tuple[Any, ...], device_flops: float) -> Program:
    """Trace ``fn`` on symbolic stand-ins for ``arrays`` (ShardedArrays or Traced)."""
    if _current() is not None:
        raise RuntimeError("trace_program cannot be nested")
    tr = _Trace(device_flops)
    inputs = [tr.new_value(a.shape, np.dtype(a.dtype).str, a.mesh, a.spec) for a in arrays]
    _state.trace = tr
    try:
        out = fn(*inputs)
    finally:
        _state.trace = None
    multiple = isinstance(out, tuple)
    outs = out if multiple else (out,)
    for i, o in enumerate(outs):
        if not isinstance(o, Traced) or o.trace is not tr:
            raise TypeError(
                f"Program {name!r} output {i} is {type(o).__name__}; a program must return "
                "values computed by @pathdask.function calls (or its own arguments), or a tuple of them"
            )
    return Program(name, len(arrays), tuple(tr.values), tuple(tr.gangs),
                   tuple(o.info.vid for o in outs), multiple)


def call_function(fn: Function, args: tuple[Any, ...], mesh: Mesh | None) -> Any:
    """A call of a ``@function``: a gang in the current trace, or a one-gang program."""
    tr = _current()
    if tr is not None:
        for i, a in enumerate(args):
            if not isinstance(a, Traced) or a.trace is not tr:
                raise TypeError(
                    f"Argument {i} of {fn.name!r} inside a program is {type(a).__name__}; pass "
                    "sharded arrays in as arguments of the @pathdask.program, and static values "
                    "through closures or functools.partial"
                )
        return tr.call(fn, args, mesh)
    return direct_program(fn, mesh)(*args)


@functools.lru_cache(maxsize=256)
def move_program(mesh: Mesh, spec: PartitionSpec, model_nbytes: float | None) -> ProgramFunction:
    """The one-gang program that ``x.to(mesh, spec)`` runs outside a program (cached)."""
    return ProgramFunction(lambda x: x.to(mesh, spec, model_nbytes=model_nbytes), name="to")


def direct_program(fn: Function, mesh: Mesh | None) -> ProgramFunction:
    """The one-gang program that a direct call of ``fn`` runs (one per mesh, cached)."""
    direct = fn.__dict__.setdefault("_direct_programs", {})
    prog = direct.get(mesh)
    if prog is None:
        prog = direct[mesh] = ProgramFunction(lambda *xs: fn(*xs, mesh=mesh), name=fn.name)
    return prog


class ProgramFunction:
    """A ``@pathdask.program``: calling it traces (once per signature), lowers and dispatches.

    Returns :class:`~pathdask.ShardedArray` futures at once, before any device ran.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = str(name or getattr(fn, "__name__", "program"))
        self._cache: dict[Any, Program] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        with self._lock:
            n = len(self._cache)
        return f"<pathdask.program {self.name}: traced for {n} signature(s)>"

    def _repr_html_(self) -> str:
        from ..html import card, table

        with self._lock:
            traced = list(self._cache.values())
        if not traced:
            return card("pathdask.program", self.name, table([
                ("traced", "not yet: call it, or .trace(*arrays), to see its gangs")]))
        return card("pathdask.program", self.name, traced[-1]._html_body(("signatures traced", len(traced))))

    def trace(self, *arrays: ShardedArray) -> Program:
        """The :class:`Program` for these arguments (cached per signature)."""
        from .array import ShardedArray

        for i, a in enumerate(arrays):
            if not isinstance(a, ShardedArray):
                raise TypeError(
                    f"Argument {i} of program {self.name!r} is {type(a).__name__}; program "
                    "arguments must be ShardedArrays (client.put(...) or results of programs). "
                    "Pass static values through closures or functools.partial"
                )
        if not arrays:
            raise TypeError(f"Program {self.name!r} needs at least one ShardedArray argument")
        clients = {id(a.client) for a in arrays}
        if len(clients) > 1:
            raise MeshError(f"Arguments of program {self.name!r} belong to different clients")
        sig = tuple((a.shape, a.dtype.str, a.mesh, a.spec) for a in arrays)
        with self._lock:
            prog = self._cache.get(sig)
        if prog is None:
            prog = trace_program(self.fn, self.name, arrays, arrays[0].client.topology.device_flops)
            with self._lock:
                self._cache[sig] = prog
        return prog

    def dask_graph(self, *arrays: ShardedArray) -> ProgramGraph:
        """The program on these arguments as a Dask graph: one layer per gang, one task per shard.

        For looking at (its HTML repr in a notebook, ``dask.visualize``); calling the
        program submits this graph fused into one task per host.

        Examples
        --------
        >>> g = step.dask_graph(x, w)                  # doctest: +SKIP
        >>> list(g.layers)                             # doctest: +SKIP
        ['layer-0', 'reshard-1', 'layer-2']
        """
        from .graph import layered_graph

        return layered_graph(self.trace(*arrays))

    def __call__(self, *args: Any) -> Any:
        tr = _current()
        if tr is not None:  # a program called inside another one is inlined
            return self.fn(*args)
        prog = self.trace(*args)
        return args[0].client._run(prog, args)


def program(fn: Callable[..., Any]) -> ProgramFunction:
    """Bundle many ``@pathdask.function`` calls into one asynchronously dispatched program.

    Examples
    --------
    >>> @program
    ... def step(x, w):
    ...     return layer(layer(x, w), w)
    >>> y = step(x, w)          # returns at once: a ShardedArray future
    >>> y.result()              # -> numpy
    """
    return ProgramFunction(fn)
