"""The benchmarks' programs and call patterns, traced on abstract meshes for the simulation.

Each builder traces the *same* ``@pathdask.program`` the real benchmark runs
(``bench/dispatch.py``'s kernels, ``bench/tenancy.py``'s tenant program,
``bench/pipeline.py``'s Transformer rows) on :class:`~.abstract.AbstractArray`
stand-ins, and each ``*_rate`` plays the benchmark's call pattern on a
:class:`~.run.Simulation` and measures what the benchmark measures.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .. import P
from ..bench.dispatch import Kernels
from ..bench.tenancy import _programs
from ..client.program import ProgramFunction
from ..client.tracing import Program, trace_program
from ..mesh import Mesh
from ..topology import Topology
from .abstract import AbstractArray, abstract_mesh
from .fanout import Fanout
from .model import CostModel
from .run import ClientScript, SimResult, Tenant, simulate


def traced(fn: ProgramFunction | Any, topology: Topology, *args: AbstractArray, name: str | None = None) -> Program:
    """``fn`` (a ``@program`` or a plain function of traced values) traced on ``args``."""
    body = fn.fn if isinstance(fn, ProgramFunction) else fn
    return trace_program(body, str(name or getattr(fn, "name", "program")), args, topology.device_flops)


def island_mesh(topology: Topology, size: int | None = None) -> Mesh:
    """What the dispatch and tenancy benchmarks use: one axis ``x`` over island 0."""
    return abstract_mesh(topology, {"x": size or topology.devices_per_island}, island=0)


# -- dispatch (Figures 5 and 6) ---------------------------------------------------------
def dispatch_programs(topology: Topology, cost: float, k: int, mesh: Mesh | None = None) -> dict[str, Program]:
    """OpByOp (one gang), Chained (``k`` gangs) and Fused (one gang of ``k`` steps) for ``cost``."""
    kernels = Kernels(cost, k)
    mesh = mesh or island_mesh(topology)
    x = AbstractArray((mesh.size,), "float64", mesh, P("x"))
    return {"OpByOp": traced(kernels.op, topology, x), "Chained": traced(kernels.chained, topology, x),
            "Fused": traced(kernels.fused, topology, x)}


def dispatch_rate(topology: Topology, costs: CostModel, programs: dict[str, Program], shape: str, k: int,
                  system: str = "pathdask", fanout: Fanout | None = None) -> tuple[float, SimResult]:
    """Computations/s of ``k`` computations of ``shape`` on ``system`` (``pathdask`` or
    ``multi-controller``), timed as the dispatch benchmark times them; ``fanout``: the relay
    trees' shape (default: the dask config's)."""
    seconds: list[float] = []

    def script(h: Tenant) -> Generator[Any, Any, None]:
        start = h.now
        if system == "multi-controller":
            if shape == "OpByOp":
                seconds.append((yield from h.mc(programs["OpByOp"], k)))
            else:
                seconds.append((yield from h.mc(programs[shape], 1)))
            return
        call = None
        for _ in range(k if shape == "OpByOp" else 1):
            call = yield from h.call(programs[shape], after=call)
        assert call is not None
        yield from h.result(call)
        seconds.append(h.now - start)

    result = simulate(topology, [ClientScript("bench", script)], costs, fanout=fanout)
    return k / seconds[0], result


# -- tenancy (Figures 8 and 9) ------------------------------------------------------------
def tenant_program(topology: Topology, cost: float, gangs: int, mesh: Mesh | None = None) -> Program:
    mesh = mesh or island_mesh(topology)
    return traced(_programs(cost, gangs), topology, AbstractArray((mesh.size,), "float64", mesh, P("x")))


def shares(topology: Topology, costs: CostModel, weights: tuple[float, ...], cost: float, gangs: int,
           inflight: int, seconds: float, measure: str = "busy_s",
           fanout: Fanout | None = None) -> tuple[list[float], SimResult]:
    """Each client's share of device time under proportional share, as ``bench tenancy`` measures it:
    of the devices' busy seconds (``measure="busy_s"``), or of the ops begun (``"ops"``: each
    gang's modelled time, as its program's cost counts it)."""
    prog = tenant_program(topology, cost, gangs)

    def script(h: Tenant) -> Generator[Any, Any, None]:
        pending = []
        for _ in range(inflight):
            pending.append((yield from h.call(prog)))
        while h.now < seconds:
            yield from h.result(pending.pop(0))
            pending.append((yield from h.call(prog)))
        for c in pending:
            yield from h.result(c)

    result = simulate(topology, [ClientScript(f"w{w:g}-{i}", script, w) for i, w in enumerate(weights)], costs,
                      policy="proportional", window=(0.0, seconds), fanout=fanout)
    busy = [result.stats["clients"][t.id][measure] for t in result.tenants.values()]
    total = sum(busy) or 1.0
    return [b / total for b in busy], result


def throughput(topology: Topology, costs: CostModel, clients: int, cost: float, seconds: float,
               policy: str = "proportional", prog: Program | None = None,
               fanout: Fanout | None = None) -> tuple[float, SimResult]:
    """Aggregate calls/s of ``clients`` clients that each wait for every result (Figure 8)."""
    prog = prog or tenant_program(topology, cost, 1)
    counts = [0] * clients

    def make(i: int) -> Any:
        def script(h: Tenant) -> Generator[Any, Any, None]:
            while h.now < seconds:
                call = yield from h.call(prog)
                yield from h.result(call)
                if h.now <= seconds:
                    counts[i] += 1
        return script

    result = simulate(topology, [ClientScript(f"t{i}", make(i)) for i in range(clients)], costs, policy=policy,
                      fanout=fanout)
    return sum(counts) / seconds, result


def mc_throughput(topology: Topology, costs: CostModel, cost: float, iterations: int = 64) -> float:
    """The multi-controller's calls/s of the same one-gang program (Figure 8's JAX line)."""
    prog = tenant_program(topology, cost, 1)
    out: list[float] = []

    def script(h: Tenant) -> Generator[Any, Any, None]:
        out.append((yield from h.mc(prog, iterations)))

    simulate(topology, [ClientScript("mc", script)], costs)
    return iterations / out[0]
