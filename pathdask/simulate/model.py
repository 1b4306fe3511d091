"""The cost model of the control plane: what the simulation charges for each message.

Device time is not here: a kernel's time is its gang's modelled ``cost_s`` and a
move's is the link model's, exactly as in the real runtime. What the real system
adds on top is the *control plane*: a client builds and submits each call, the
Dask scheduler and its pathdask plugin take it in and slot it, each host's
call reaches each host, which registers its part, and each device thread spends some time per op
in Python. These costs are measured on the real embedded system
(``pathdask simulate --calibrate``, :mod:`.calibrate`) and stored as JSON; the
package ships one such file (:data:`DEFAULT`).

Two kinds of cost:

- *CPU* seconds, which occupy a processor: the client's, the scheduler's, or a
  host's. With ``shared_cpu`` (the embedded ``LocalSystem(processes=False)``,
  one process, one GIL) they all queue on one processor; otherwise each client,
  the scheduler and each host has its own, as on a real cluster.
- *latency* (``message_s``): the time a control message takes to arrive, during
  which no processor is busy.

Dask's streams batch the messages sent close together, so a client that pipelines
its calls pays the comms' CPU once per batch, which the per-call costs above
include. A call that travels alone (its client has no other call in flight, as a
client that waits for each result) pays it for each of its own messages: the
*lone-call* costs, charged to the scheduler's processor and to each of its hosts'.
Likewise a pipelined call's program ending travels alone when it comes to an idle
control plane (gangs longer than the control plane's work per call): the
*lone-done* costs, of which a call pays a share that grows with how much its
gangs outlast that work (``lone_done_share``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

__all__ = ["DEFAULT", "RELAY_DONE_SHARE", "CostModel"]

#: the calibration shipped with pathdask (made by ``pathdask simulate --calibrate``)
DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration.json")

#: the share of the scheduler's own work per host of a call that is the host's ending (its
#: ``ProgramDone``), of that work's growth per host (``CallMeter``'s ``ended`` of all its parts):
#: what a relay's CPU per child splits by where a calibration did not measure it
RELAY_DONE_SHARE = 0.28


@dataclass(frozen=True)
class CostModel:
    """Per-message control costs, in seconds.

    Parameters
    ----------
    client_call_s, client_host_s
        Client CPU per call of a program, and per host that the call's plan names
        (its output keys and its message part per host).
    scheduler_call_s, scheduler_host_s
        Scheduler CPU per program taken in and slotted, and per host of it (its
        output keys, its dispatch and order messages and its done message).
    scheduler_take_s, scheduler_take_host_s
        Of that, what the scheduler's handler of calls spends taking one in, per call and per
        host (``SchedulerPlugin._call``): it cuts a message's calls into slices of
        :data:`~pathdask.scheduler.plugin.CALL_SLICE`, each host's of a slice going as one
        dispatch. The rest of a pipelined call's comes once its slice's dispatches went (Dask's
        own work for its keys, and the comms). A call that travels alone pays all of it as it
        is taken in. By default (``inf``) all of every call's is taken in.
    host_dispatch_s, host_op_s
        A host's CPU per call it registers, and per op it registers for its devices.
    device_op_s
        A device thread's own time per op (Python around the kernel); a device is
        busy ``max(cost, device_op_s)`` per kernel when gangs run back to back.
    exchange_s
        A device's own time per collective it takes part in.
    exchange_host_s
        A device's own time per collective and per other host in its group (the
        runtime sends one message per remote host and collects the answers).
    message_s
        One-way latency of a control message (client, scheduler, host).
    result_s
        Client CPU to fetch one result once its program is done.
    lone_call_s, lone_host_s
        CPU a call pays on top when it travels alone (its client has no other call in
        flight): the scheduler's, and each of its hosts' (their messages, and the fetch
        of its result, each a batch of their own).
    lone_wait_host_s
        Time a call that travels alone waits per host of it beyond the CPU and messages above
        (each host's threads handing its call and its ending to one another); its client
        learns of its result that much later.
    done_wait_s, done_wait_host_s
        How long after its last host ended a call that travelled alone the scheduler learns of
        it (the host's done message waits behind the answer to the result's fetch, and the
        client's next call), and per host of it: only then may a policy slot another program in
        its place. Its client learns of its result sooner (``lone_wait_host_s``).
    lone_done_s, lone_done_host_s
        CPU a pipelined call's program ending pays when its messages travel alone (its
        gangs outlast the control plane's work for a call, so that each ending comes to
        an idle control plane): the scheduler's, and each of its hosts' (their
        ``program-done`` messages and Dask's key reports).
    lone_done_share
        The share of the lone-done costs a pipelined call pays, by how many times its gangs
        outlast the control plane's work for a call (the stretch): ``(stretch, share)`` points,
        in order, linear in between and from none at 0, and the last share beyond the last
        point. Empty (the default): all of them beyond a stretch of 1, none below.
    late_order_s, late_order_host_s
        CPU of an order sent apart from its call, when a policy slots a program after its call
        was taken in (proportional share slots one when another ends): the scheduler's, and
        each of its hosts' (its message, and the loop's turns that each such ending and order
        take on their own, which calls slotted with their dispatch share).
    late_order_waiting_s
        Scheduler CPU of an order sent apart from its call per program still waiting for a slot
        then: a late program costs more the more clients wait (the policy looks at each of their
        queues, and fewer of the control plane's messages share a turn of its loop).
    scheduler_tree_s
        Scheduler CPU per call that goes down a fan-out tree (:mod:`.fanout`: a call on more
        than ``pathdask.fanout.threshold`` hosts), in place of ``scheduler_host_s`` per host:
        the call's records to its first host, its one ending from it, its output keys and
        releases. Of it, its handler takes in as for one host (``scheduler_take_host_s``). By
        default (NaN) ``scheduler_host_s``: what one host of a call cost the scheduler without
        a tree.
    relay_forward_s, relay_done_s
        A host's CPU per child in a call's tree: to forward the call's records (its call, its
        order, its output's release) to the child, the child's reading them included, and to
        take the child's endings (the program's and the release's), the child's report
        included. Measured by ``pathdask simulate --calibrate`` (:mod:`.calibrate_tree`). By
        default (NaN) ``scheduler_host_s`` split by :data:`RELAY_DONE_SHARE` (what the
        scheduler paid per host, an upper bound, for calibrations made before the runtime
        had trees).
    relay_root_s
        A tree call's first host's CPU per call beyond its own part and its children (its
        records come one at a time, where calls' dispatches without a tree come a slice at
        a time). By default (NaN) 0.
    mc_call_s, mc_op_s
        Multi-controller: a host's CPU per program it runs from its own loop, and per op
        of it. Its loop registers each (as a dispatch does: ``host_dispatch_s`` and
        ``host_op_s``); the rest comes once the program is registered.
    reference_s
        The CPU's speed during calibration: the seconds it took for the speed meter's fixed
        work (:class:`~.measure.SpeedMeter`; 0 where unknown). Every cost above is seconds
        of that CPU; :meth:`at_speed` gives them on a CPU of another speed.
    shared_cpu
        Every CPU cost above queues on one processor (one process with one GIL).
    source
        Where the numbers came from (machine, date), for the record.
    """

    client_call_s: float = 500e-6
    client_host_s: float = 50e-6
    scheduler_call_s: float = 500e-6
    scheduler_host_s: float = 100e-6
    scheduler_take_s: float = math.inf
    scheduler_take_host_s: float = 0.0
    host_dispatch_s: float = 100e-6
    host_op_s: float = 10e-6
    device_op_s: float = 50e-6
    exchange_s: float = 50e-6
    exchange_host_s: float = 100e-6
    message_s: float = 2e-3
    result_s: float = 500e-6
    lone_call_s: float = 0.0
    lone_host_s: float = 0.0
    lone_wait_host_s: float = 0.0
    done_wait_s: float = 0.0
    done_wait_host_s: float = 0.0
    lone_done_s: float = 0.0
    lone_done_host_s: float = 0.0
    lone_done_share: tuple[tuple[float, float], ...] = ()
    late_order_s: float = 0.0
    late_order_host_s: float = 0.0
    late_order_waiting_s: float = 0.0
    scheduler_tree_s: float = math.nan
    relay_forward_s: float = math.nan
    relay_done_s: float = math.nan
    relay_root_s: float = math.nan
    mc_call_s: float = 50e-6
    mc_op_s: float = 10e-6
    reference_s: float = 0.0
    shared_cpu: bool = False
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # the trees' costs left NaN (a calibration made before the runtime had trees): from the per-host ones
        derived = {"scheduler_tree_s": self.scheduler_host_s,
                   "relay_forward_s": self.scheduler_host_s * (1 - RELAY_DONE_SHARE),
                   "relay_done_s": self.scheduler_host_s * RELAY_DONE_SHARE, "relay_root_s": 0.0}
        for name, value in derived.items():
            if isinstance(getattr(self, name), float) and math.isnan(getattr(self, name)):
                object.__setattr__(self, name, value)
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("_s") and not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"CostModel.{f.name} must be seconds >= 0, got {v!r}")
        points = tuple((float(s), float(f)) for s, f in self.lone_done_share)  # JSON gives lists
        if any(not (s > 0 and 0 <= f <= 1) for s, f in points) or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ValueError(f"CostModel.lone_done_share must be (stretch, share) points with rising stretches "
                             f"and shares in [0, 1], got {self.lone_done_share!r}")
        object.__setattr__(self, "lone_done_share", points)

    def scheduler_s(self, hosts: int, lone: bool = False, tree: bool = False) -> tuple[float, float]:
        """The scheduler's CPU for a call of a program on ``hosts`` hosts, which it sends to each
        host itself, or (``tree``) down a fan-out tree of them: what its handler spends taking the
        call in, and what comes once the call's dispatches went (none if ``lone``)."""
        whole = self.scheduler_call_s + (self.scheduler_tree_s if tree else self.scheduler_host_s * hosts)
        if lone:
            return whole + self.lone_call_s, 0.0
        take = min(self.scheduler_take_s + self.scheduler_take_host_s * (1 if tree else hosts), whole)
        return take, whole - take

    def lone_done_at(self, stretch: float) -> float:
        """The share of the lone-done costs a pipelined call pays whose gangs are ``stretch``
        times the control plane's work for a call (:attr:`lone_done_share`)."""
        if not self.lone_done_share:
            return 1.0 if stretch > 1.0 else 0.0
        xs, ys = zip(*self.lone_done_share)
        return float(np.interp(stretch, (0.0, *xs), (0.0, *ys)))

    # -- files ----------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | None = None) -> CostModel:
        """The calibration at ``path`` (by default the one shipped with pathdask)."""
        path = path or DEFAULT
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"No calibration file {path}; run `pathdask simulate --calibrate` to make one") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data.get("costs", {})) - known)
        if unknown:
            raise ValueError(f"Calibration {path} has unknown cost(s) {unknown}; known: {sorted(known)}")
        return cls(**data.get("costs", {}), source=data.get("source", {}))

    def save(self, path: str) -> None:
        data = asdict(self)
        source = data.pop("source")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"source": source, "costs": data}, f, indent=2, sort_keys=True)
            f.write("\n")

    # -- variants ---------------------------------------------------------------------
    def embedded(self) -> CostModel:
        """As on the machine it was measured on: one process, every CPU cost on one processor."""
        return replace(self, shared_cpu=True)

    def cluster(self) -> CostModel:
        """As on a cluster: the client, the scheduler and every host on processors of their own."""
        return replace(self, shared_cpu=False)

    def at_speed(self, reference_s: float) -> CostModel:
        """The costs on a CPU that does the speed meter's work in ``reference_s`` seconds: each
        scaled by ``reference_s / self.reference_s`` (unchanged where either is unknown, 0)."""
        if not (self.reference_s > 0 and reference_s > 0):
            return self
        scale = reference_s / self.reference_s
        return replace(self, reference_s=reference_s, **{
            f.name: getattr(self, f.name) * scale for f in fields(self)
            if f.name.endswith("_s") and f.name != "reference_s"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
