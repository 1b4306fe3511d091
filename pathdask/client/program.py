"""``@pathdask.program``: calls of functions traced into one program, dispatched as one.

A :class:`ProgramFunction` traces its body once per input signature
(``tracing.py``) and hands the :class:`~.tracing.Program` to the client of its
arguments, which lowers and dispatches it; calling it returns futures at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from ..errors import MeshError
from ..html import card, table
from ..mesh import Mesh
from ..spec import PartitionSpec
from .graph import ProgramGraph, layered_graph
from .protocols import Sharded
from .tracing import Program, current_trace, trace_program

__all__ = ["ProgramFunction", "move_program", "program"]


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
        with self._lock:
            traced = list(self._cache.values())
        if not traced:
            return card("pathdask.program", self.name, table([
                ("traced", "not yet: call it, or .trace(*arrays), to see its gangs")]))
        return card("pathdask.program", self.name, traced[-1]._html_body(("signatures traced", len(traced))))

    def trace(self, *arrays: Sharded) -> Program:
        """The :class:`Program` for these arguments (cached per signature)."""
        for i, a in enumerate(arrays):
            if not isinstance(a, Sharded):
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

    def dask_graph(self, *arrays: Sharded) -> ProgramGraph:
        """The program on these arguments as a Dask graph: one layer per gang, one task per shard.

        For looking at (its HTML repr in a notebook, ``dask.visualize``); calling the
        program submits this graph fused into one task per host.

        Examples
        --------
        >>> g = step.dask_graph(x, w)                  # doctest: +SKIP
        >>> list(g.layers)                             # doctest: +SKIP
        ['layer-0', 'reshard-1', 'layer-2']
        """
        return layered_graph(self.trace(*arrays))

    def __call__(self, *args: Any) -> Any:
        tr = current_trace()
        if tr is not None:  # a program called inside another one is inlined
            return self.fn(*args)
        prog = self.trace(*args)
        return args[0].client._run(prog, args)


@functools.lru_cache(maxsize=256)
def move_program(mesh: Mesh, spec: PartitionSpec, model_nbytes: float | None) -> ProgramFunction:
    """The one-gang program that ``x.to(mesh, spec)`` runs outside a program (cached)."""
    return ProgramFunction(lambda x: x.to(mesh, spec, model_nbytes=model_nbytes), name="to")



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
