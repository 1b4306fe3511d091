"""Tracing: a ``@pathdask.program``'s body, run on symbolic values, becomes a :class:`Program`.

A :class:`Program` is immutable: values (logical sharded arrays) and gangs
(one per function call or resharding), in program order. It is traced once
per input signature and cached (``program.py``); lowering (``lowering.py``)
turns it into one plan per host. A trace needs of a ``@pathdask.function``
only what :class:`Kernel` says, so this module sits below ``function.py``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ShardingError
from ..html import card, columns, details, host_label, table
from ..mesh import Mesh
from ..sharding import Sharding
from ..spec import PartitionSpec

__all__ = ["Aval", "GangNode", "Kernel", "Program", "Traced", "ValueInfo", "check_move", "compose",
           "current_trace", "move_scale", "trace_program"]


@dataclass(frozen=True)
class Aval:
    """An abstract value: a block's or array's shape and dtype."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Kernel(Protocol):
    """What a trace needs from a ``@pathdask.function`` (:class:`~pathdask.Function` is one)."""

    name: str
    body: Callable[..., Any]
    in_specs: tuple[PartitionSpec, ...]
    out_specs: tuple[PartitionSpec, ...]
    multiple_outputs: bool

    def check_args(self, avals: Sequence[Aval], mesh: Mesh) -> list[Sharding]:
        """The inputs' shardings on ``mesh``; raises if they do not fit the in_specs."""

    def infer(self, mesh: Mesh, avals: Sequence[Aval],
              device_flops: float) -> tuple[tuple[Aval, ...], tuple[Aval, ...], float]:
        """Per-device output blocks, global outputs and modelled seconds."""


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
    function: Kernel | None = None
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
        return card("pathdask.Program", self.name, self._html_body())

    def _html_body(self, *rows: tuple[str, Any]) -> str:
        """``rows`` and this program's own rows, then its gangs."""
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

    def call(self, fn: Kernel, args: tuple[Traced, ...], mesh: Mesh | None) -> Any:
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


def current_trace() -> _Trace | None:
    """The trace this thread is in (inside a ``@pathdask.program`` being traced), else ``None``."""
    return getattr(_state, "trace", None)


def trace_program(fn: Callable[..., Any], name: str, arrays: tuple[Any, ...], device_flops: float) -> Program:
    """Trace ``fn`` on symbolic stand-ins for ``arrays`` (ShardedArrays or Traced)."""
    if current_trace() is not None:
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


def compose(name: str, calls: Sequence[tuple[Program, tuple[tuple[int] | tuple[int, int], ...]]], n_inputs: int,
            outputs: Sequence[tuple[int, int]]) -> Program:
    """Calls of programs, one after another, as one program (a batch: ``batching.py``).

    Each call names its arguments: ``(i,)`` is input ``i`` of the composed program,
    ``(e, j)`` output ``j`` of call ``e`` before it. The composed program runs every
    call's gangs in call order; its outputs are ``outputs``, as ``(call, output)``. A
    value no output names lives only between the gangs that make and read it.
    """
    values: list[ValueInfo | None] = [None] * n_inputs
    gangs: list[GangNode] = []
    maps: list[dict[int, int]] = []
    for program, args in calls:
        vid: dict[int, int] = {}
        for i, ref in enumerate(args):
            if len(ref) == 1:
                k = ref[0]
                if values[k] is None:
                    values[k] = dataclasses.replace(program.values[i], vid=k)
                vid[i] = k
            else:
                e, j = ref  # type: ignore[misc]
                vid[i] = maps[e][calls[e][0].outputs[j]]
        for v in program.values[program.n_inputs:]:
            vid[v.vid] = len(values)
            values.append(dataclasses.replace(v, vid=len(values)))
        for g in program.gangs:
            gangs.append(dataclasses.replace(g, index=len(gangs), inputs=tuple(vid[i] for i in g.inputs),
                                             outputs=tuple(vid[o] for o in g.outputs)))
        maps.append(vid)
    assert all(v is not None for v in values), "every input of a composed program is read by some call"
    return Program(name, n_inputs, tuple(values), tuple(gangs),  # type: ignore[arg-type]
                   tuple(maps[e][calls[e][0].outputs[j]] for e, j in outputs), True)
