"""``pathdask.simulate``: the same programs and policies on a virtual clock, for thousands of devices.

The real tracing and lowering (``trace_program``, ``lower``), the real island
scheduler and its policies, and the real link model run against a
discrete-event clock (simpy) instead of device threads and sockets; the
control plane's costs come from a calibration of the real embedded system
(:class:`CostModel`). A call on more than ``pathdask.fanout.threshold`` hosts
goes down a fan-out tree of its own hosts and its endings come back up it, as in
the runtime (:class:`Fanout`, :mod:`.fanout`). The output is the trace
``Dataset`` and the stats a real run gives.

Examples
--------
>>> import pathdask as pw
>>> from pathdask.simulate import AbstractArray, ClientScript, abstract_mesh, simulate
>>> from pathdask.client.tracing import trace_program
>>> topo = pw.Topology(islands=1, hosts_per_island=16, devices_per_host=8)
>>> mesh = abstract_mesh(topo, {"x": 128})
>>> prog = trace_program(chained, "chained", (AbstractArray((128,), "f8", mesh, pw.P("x")),),
...                      topo.device_flops)                                      # doctest: +SKIP
>>> def script(h):
...     call = yield from h.call(prog)
...     yield from h.result(call)
>>> result = simulate(topo, [ClientScript("bench", script)])                     # doctest: +SKIP
>>> result.trace.pathdask.plot()                                                 # doctest: +SKIP
"""

from .abstract import AbstractArray, abstract_mesh
from .fanout import Fanout
from .model import CostModel
from .run import Call, ClientScript, SimResult, Simulation, Tenant, simulate

__all__ = ["AbstractArray", "Call", "ClientScript", "CostModel", "Fanout", "SimResult", "Simulation", "Tenant",
           "abstract_mesh", "simulate"]
