"""``pathdask simulate --calibrate``: measure the control costs on the real embedded system.

On a real ``LocalSystem(processes=False)`` of one island of 4 hosts x 2 devices
(the dispatch benchmark's scalar all-reduce + add at zero modelled cost) it
times, on meshes of 1, 2 and 4 hosts (each cost is a least-squares line over them):

- the client's calls (the loop of ``k`` calls, before any result): client CPU
  per call and per host;
- every host's dispatch (its handler of calls is wrapped with a timer), for
  one op and for ``k`` ops per device: host CPU per dispatch and per op;
- a program of ``k`` chained gangs: the devices' own time per op, beyond the
  body's NumPy, which is timed as the simulation times every body;
- ``k`` one-gang calls back to back: the scheduler's CPU is what is left of each
  call's time once the client's, the hosts' and the devices' are taken out (one
  process: they all queue on one GIL); of it, its handler's taking in of each call
  is timed apart (a wrapped ``SchedulerPlugin._call``);
- several clients that each wait for every result, so that each call's messages
  travel alone: what a call costs beyond its share above is the lone-call cost;
- ``k`` one-gang calls back to back again, with gangs :data:`ALONE_STRETCHES` times
  the CPU of a call of zero cost: the longer the gangs, the more of the programs'
  endings come to an idle process and travel alone. The process's CPU time per
  call beyond that of the calls of zero cost is, at the longest gangs, the
  lone-done cost, and at each shorter one the share of it that the calls pay
  (``lone_done_share``);
- :data:`CROWDS` of clients that each wait for every result, under FIFO and under
  proportional share in turn (on the same system), which slots a program when another
  ends (its window is full), so that its order goes to its hosts apart from its call: the
  late-order cost is the difference per program slotted late, a part per host and a part
  per program still waiting (a line through the two crowds);
- one call and its result, alone: what is left of it is the latency of its 4 messages
  and a wait per host; and how long after its last host ended it the scheduler learns
  of it (the done wait: the hosts' and the scheduler's handlers are wrapped with timers);
- the multi-controller loop: a host's cost to register a program itself;
- throughout, the scheduler plugin's own CPU per call by part (its ``CallMeter``).

Every call above goes to each of its hosts directly (the scheduler's fan-out threshold
is set above the meshes' hosts while they run). The fan-out trees' costs are measured
on a system of their own, one island of 8 hosts of one device, each call sent directly
and down a tree in turn (:mod:`.calibrate_tree`), and fitted with the costs above.

A :class:`~.measure.SpeedMeter` runs throughout: a repeat made while the CPU ran
more than 15% away from its mean speed so far is made again (up to three
times), and each repeat is scaled to the CPU's mean speed over the whole
calibration (its ``reference_s``).

Everything is fitted for the embedded system (``shared_cpu``); the same numbers
on separate processors are the cluster model (:meth:`CostModel.cluster`).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import dask
import numpy as np

from .. import P
from ..bench.dispatch import Kernels
from ..bench.multicontroller import run_multicontroller
from ..bench.tenancy import _throughput
from ..protocol import ProgramDone
from ..scheduler.meter import METERED
from ..system import LocalSystem
from . import calibrate_tree
from .measure import SpeedMeter, handled, timed, wrap_dispatch
from .model import RELAY_DONE_SHARE, CostModel
from .schedule import body_seconds

Echo = Callable[[str], Any]


def _timer(inner: Callable[..., Any], spans: list[float],
           calls: Callable[[dict[str, Any]], int] = lambda kwargs: 1,
           clock: Callable[[], float] = time.perf_counter) -> Callable[..., Any]:
    """``inner``, timed: each run's duration per call (``calls`` of its keyword arguments) lands in ``spans``."""
    def record(seconds: float, kwargs: dict[str, Any]) -> None:
        n = calls(kwargs)
        spans.extend([seconds / n] * n)

    return timed(inner, record, clock)


def _timed_dispatch(system: LocalSystem) -> list[float]:
    """Wrap every host's handler of calls (of ``protocol.Dispatch`` records: the output keys' handles
    and the registration) so that its CPU per call lands in the returned list. Its thread's CPU,
    not its duration: the handler hands the GIL to the devices it woke (``tuning.hand_over``),
    whose gangs then run before it goes on."""
    spans: list[float] = []
    wrap_dispatch(system, lambda handler: _timer(handler, spans, lambda kwargs: len(kwargs.get("calls", ())) or 1,
                                                 time.thread_time))
    return spans


def _timed_take(system: LocalSystem) -> list[float]:
    """Wrap the scheduler's taking in of each call (``SchedulerPlugin._call``, inside its handler
    of calls) so that its duration lands in the returned list."""
    assert system.cluster is not None
    plugin = system.cluster.scheduler.plugins["pathdask"]
    spans: list[float] = []
    plugin._call = _timer(plugin._call, spans)
    return spans


class _Endings:
    """When each host's runtime ended each program (``HostRuntime._ended``, on the event loop)
    and when the scheduler learned of it (its handler of ``protocol.ProgramDone``), both per
    program at its last host: their difference is how long the scheduler learns of an ending
    after the fact (the done wait)."""

    def __init__(self, system: LocalSystem) -> None:
        assert system.cluster is not None
        self.ended: dict[str, float] = {}
        self.told: dict[str, float] = {}
        scheduler = system.cluster.scheduler
        #: the scheduler plugin's ``CallMeter``: its own CPU on calls, by part
        self.meter = scheduler.plugins["pathdask"].meter
        handlers = scheduler.plugins["pathdask"].handlers
        inner = handlers[ProgramDone]

        def told(worker: str, msg: ProgramDone, _inner: Any = inner) -> Any:
            self.told[msg.pid] = time.perf_counter()
            return _inner(worker, msg)

        handlers[ProgramDone] = told
        for worker in system.cluster.workers.values():
            rt = worker.plugins["pathdask"]

            def ended(pid: str, _inner: Any = rt._ended) -> None:
                self.ended[pid] = time.perf_counter()
                _inner(pid)

            rt._ended = ended  # the device threads hand endings to the loop by this name

    def clear(self) -> None:
        self.ended.clear()
        self.told.clear()

    def waits(self, pids: set[str]) -> list[float]:
        """The done waits of ``pids`` that the scheduler learned of by now."""
        return [self.told[p] - self.ended[p] for p in pids if p in self.told and p in self.ended]


def _opbyop_cpu(kernels: Kernels, x: Any) -> float:
    """The process's CPU seconds per call of ``k`` one-gang calls back to back."""
    c0 = time.process_time()
    y = x
    for _ in range(kernels.k):
        y = kernels.step(y)
    y.result()
    return (time.process_time() - c0) / kernels.k


def _parts(meter: Any) -> tuple[int, float, float]:
    """The scheduler plugin's calls so far, and its CPU on them: on endings, and on the rest."""
    ended = meter.parts["ended"]
    return meter.calls, ended, sum(meter.parts.values()) - ended


def _repeat(client: Any, kernels: Kernels, alone: dict[float, Kernels], x: Any,
            timers: dict[str, list[float]], endings: _Endings) -> dict[str, list[float]]:
    """One repeat of every timing (``timers``: the dispatches' and the take-ins' spans)."""
    k = kernels.k
    meter = endings.meter
    before = _parts(meter)
    out: dict[str, list[float]] = {"single": [], "result": []}
    spans, takes = timers["dispatch"], timers["take"]
    spans.clear()
    takes.clear()
    c0 = time.process_time()
    t0 = time.perf_counter()
    y = x
    for _ in range(k):
        y = kernels.step(y)
    t1 = time.perf_counter()
    y.result()
    t2 = time.perf_counter()
    out["call"] = [(t1 - t0) / k]
    out["opbyop"] = [(t2 - t0) / k]
    out["opbyop_cpu"] = [(time.process_time() - c0) / k]
    handled(client)
    out["dispatch1"] = [statistics.median(spans)]
    out["take"] = [statistics.mean(takes)]  # the mean: a slice holds CALL_SLICE of their sum
    for stretch, longer in alone.items():
        out[f"alone_cpu@{stretch:g}"] = [_opbyop_cpu(longer, x)]
    spans.clear()
    t0 = time.perf_counter()
    kernels.chained(x).result()
    out["chained"] = [(time.perf_counter() - t0) / k]
    handled(client)
    out["dispatchk"] = [statistics.median(spans)]
    t0 = time.perf_counter()
    kernels.fused(x).result()
    out["fused"] = [(time.perf_counter() - t0) / k]
    endings.clear()
    for _ in range(5):
        t0 = time.perf_counter()
        y = kernels.step(x)
        y.result()
        t1 = time.perf_counter()
        y.result()
        out["single"].append(t1 - t0)
        out["result"].append(time.perf_counter() - t1)
    singles = set(endings.ended)
    out["mc"] = [run_multicontroller(client, kernels.op, x, k) / k]
    out["done_wait"] = endings.waits(singles)  # the scheduler has learned of them all by now
    calls, ended, rest = (a - b for a, b in zip(_parts(meter), before))
    if calls:  # every call of the repeat is on this mesh: the plugin's CPU per call, by part
        out["meter_ended"], out["meter_rest"] = [ended / calls], [rest / calls]
    return out


def _measure(client: Any, kernels: Kernels, x: Any, timers: dict[str, list[float]], endings: _Endings, repeats: int,
             meter: SpeedMeter) -> dict[str, float]:
    """The medians over ``repeats`` of each timing, each in seconds per reference second of the
    meter (its CPU seconds for a fixed piece of work) during its repeat."""
    out: dict[str, list[float]] = {}
    kernels.chained(x).result()
    kernels.fused(x).result()
    kernels.step(x).result()
    cpu = _opbyop_cpu(kernels, x)
    alone = {stretch: Kernels(stretch * cpu, kernels.k) for stretch in ALONE_STRETCHES}
    for longer in alone.values():
        longer.step(x).result()
    for _ in range(repeats):
        one, speed = meter.during(_repeat, client, kernels, alone, x, timers, endings, near=meter.mean())
        for name, v in one.items():
            out.setdefault(name, []).extend(t / speed for t in v)
    # typical, as validation's real figures (a done wait the scheduler never learned of in time is none)
    return {name: statistics.median(v) for name, v in out.items() if v}


#: the calibration's topology: one island of four hosts, so that meshes span 1, 2 and 4 hosts
TOPOLOGY = {"islands": 1, "hosts_per_island": 4, "devices_per_host": 2}
HOSTS = (1, 2, 4)
#: clients of the measurements of late orders: enough that proportional share's window is full
#: on every mesh, so that (nearly) every program is slotted late; a late program costs more
#: the more clients wait (a policy looks at each of their queues, and fewer of the control
#: plane's messages share a turn of its loop), so two crowds, the ends of Figure 8's 4-16
CROWDS = (4, 16)
#: raw entries that are not timings in reference seconds: the mesh's size, the body's
#: NumPy (timed as the simulation times it, in seconds), and the share of programs slotted late
NOT_TIMED = ("devices", "compute", *(f"late_share@{n}" for n in CROWDS))
#: clients, and seconds, of the measurement of calls that travel alone
LONE_CLIENTS, LONE_SECONDS = 4, 1.0
#: gangs this many times a call's CPU at zero cost: from half as long (the control plane is
#: never idle, and few endings travel alone) to twice as long (every one does)
ALONE_STRETCHES = (0.5, 1.0, 1.25, 1.5, 2.0)


def measure(k: int = 64, repeats: int = 5, echo: Echo = print) -> dict[str, Any]:
    """The raw timings on meshes of 1, 2 and 4 hosts (:data:`TOPOLOGY`)."""
    from ..topology import Topology

    topology = Topology.from_dict(TOPOLOGY)
    raw: dict[str, Any] = {}
    with SpeedMeter() as meter:
        _measure_all(topology, raw, k, repeats, meter, echo)
        tree = calibrate_tree.measure(k, repeats, meter, echo)
        reference = meter.mean()
    echo(f"  the speed meter's work took {reference * 1e3:.3f} ms of CPU (at its mean speed); {meter.redone} measurement(s) "
         f"made again, the CPU having run more than {meter.tolerance:.0%} away from that")
    raw["redone"] = meter.redone
    for hosts in HOSTS:  # from seconds per reference second to seconds at the mean speed
        raw[str(hosts)].update({n: v * reference for n, v in raw[str(hosts)].items() if n not in NOT_TIMED})
    raw["tree"] = calibrate_tree.in_seconds(tree, reference)
    raw["reference_s"] = reference
    raw["k"] = k
    raw["topology"] = topology.to_dict()
    return raw


def _measure_all(topology: Any, raw: dict[str, Any], k: int, repeats: int, meter: SpeedMeter, echo: Echo) -> None:
    with dask.config.set(METERED), \
            LocalSystem(topology, processes=False, dashboard_address=None) as system:
        assert system.cluster is not None
        # every call to each of its hosts directly: the trees are measured apart (calibrate_tree)
        system.cluster.scheduler.plugins["pathdask"].core.threshold = sys.maxsize
        timers = {"dispatch": _timed_dispatch(system), "take": _timed_take(system)}
        endings = _Endings(system)
        client = system.client(name="calibrate")
        kernels = Kernels(0.0, k)
        for hosts in HOSTS:
            size = hosts * topology.devices_per_host
            mesh = client.mesh({"x": size}, island=0)
            if len(mesh.hosts) != hosts:
                raise RuntimeError(f"calibration needs a mesh of {size} devices on {hosts} host(s); got {mesh.hosts}")
            x = client.put(np.zeros(size), mesh, P("x"))
            raw[str(hosts)] = {"devices": size, **_measure(client, kernels, x, timers, endings, repeats, meter)}
            # the body's own NumPy, which the simulation times per kernel (``schedule.body_seconds``)
            raw[str(hosts)]["compute"] = body_seconds(kernels.step.body, mesh, [np.zeros(1)])
            # one GIL: clients that each wait for every result saturate it; a call takes 1/rate of it
            raw[str(hosts)]["lone"] = _lone(system, size, repeats, meter)
            for crowd in CROWDS:
                raw[str(hosts)].update(_crowd(system, size, repeats, meter, crowd))
            echo(f"  {hosts} host(s), in reference seconds: " + ", ".join(
                f"{n} {v:.3f}" for n, v in raw[str(hosts)].items() if n not in NOT_TIMED)
                 + "; slotted late: " + ", ".join(f"{raw[str(hosts)][f'late_share@{n}']:.0%} of {n} clients' programs"
                                                  for n in CROWDS))
        client.close()


def _per_call(system: LocalSystem, clients: int, devices: int, meter: SpeedMeter) -> float:
    """Time per call of ``clients`` clients that each wait for every result, for
    :data:`LONE_SECONDS`, in reference seconds of the meter during the run."""
    rate, speed = meter.during(_throughput, system, clients, 0.0, LONE_SECONDS, devices=devices, near=meter.mean())
    return 1.0 / rate / speed


def _lone(system: LocalSystem, devices: int, repeats: int, meter: SpeedMeter) -> float:
    """Time per call of :data:`LONE_CLIENTS` clients that each wait for every result, in
    reference seconds (the median of ``repeats`` runs)."""
    return statistics.median(_per_call(system, LONE_CLIENTS, devices, meter) for _ in range(repeats))


def _crowd(system: LocalSystem, devices: int, repeats: int, meter: SpeedMeter, clients: int) -> dict[str, float]:
    """``clients`` clients that each wait for every result, under FIFO and under proportional
    share in turn, ``repeats`` pairs of runs back to back (so that a CPU that changes speed
    meets both policies alike): FIFO's time per call (``crowd@N``) and how much longer
    proportional share's took (``late_extra@N``), in reference seconds (medians), and the
    share of programs proportional share slotted late (``late_share@N``)."""
    assert system.cluster is not None
    order = system.cluster.scheduler.plugins["pathdask"].order
    times: dict[str, list[float]] = {"fifo": [], "proportional": []}
    late = slotted = 0
    found = order.policy.name
    try:
        for _ in range(repeats):
            for policy, runs in times.items():
                order.use(policy)
                before = order.late, order.next_slot
                runs.append(_per_call(system, clients, devices, meter))
                if policy == "proportional":
                    late, slotted = late + order.late - before[0], slotted + order.next_slot - before[1]
    finally:
        order.use(found)
    return {f"crowd@{clients}": statistics.median(times["fifo"]),
            f"late_extra@{clients}": statistics.median(p - f for f, p in zip(times["fifo"], times["proportional"])),
            f"late_share@{clients}": late / max(slotted, 1)}


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope, each at least 0 (a negative one is noise)."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    if slope < 0:
        return max(float(np.mean(ys)), 0.0), 0.0
    if intercept < 0:
        return 0.0, max(float(np.dot(xs, ys) / np.dot(xs, xs)), 0.0)
    return float(intercept), float(slope)


def fit(raw: dict[str, Any]) -> CostModel:
    """The cost model that reproduces ``raw`` (see the module docstring), by least squares over
    the meshes of 1, 2 and 4 hosts, and the trees' (:func:`.calibrate_tree.fit`)."""
    k = raw["k"]
    hosts = [int(h) for h in raw if h.isdigit()]
    r = {h: raw[str(h)] for h in hosts}
    dph = r[hosts[0]]["devices"] // hosts[0]
    client_call, client_host = _line(hosts, [r[h]["call"] for h in hosts])
    # one dispatch holds 1 op per local device (OpByOp) or k per device (Chained)
    host_op = max(statistics.median((r[h]["dispatchk"] - r[h]["dispatch1"]) / ((k - 1) * dph) for h in hosts), 0.0)
    host_dispatch = max(statistics.median(r[h]["dispatch1"] for h in hosts) - host_op * dph, 0.0)
    # collectives: a fused gang of k psums over all the mesh's devices, every thread on one GIL; each
    # member sends to and collects from every host of the mesh
    # (beyond the body's compute, which the simulation adds per kernel)
    compute = {h: r[h].get("compute", 0.0) for h in hosts}
    exchange, exchange_host = _line([h - 1 for h in hosts], [r[h]["fused"] / r[h]["devices"] - compute[h]
                                                             for h in hosts])
    # devices: gangs of one psum back to back; what is not the psum is the op's own time
    device_op = max(statistics.median(r[h]["chained"] / r[h]["devices"] - compute[h] - exchange
                                      - exchange_host * (h - 1) for h in hosts), 0.0)

    def own(h: int) -> float:
        return (device_op + compute[h] + exchange + exchange_host * (h - 1)) * r[h]["devices"]

    # scheduler: what is left of each back-to-back call
    left = [r[h]["opbyop"] - r[h]["call"] - h * (host_dispatch + host_op * dph) - own(h) for h in hosts]
    sched_call, sched_host = _line(hosts, left)
    # of which the scheduler's handler takes each call in (it cuts a message's calls into slices)
    take_call, take_host = _line(hosts, [r[h]["take"] for h in hosts])
    # messages: a lone call and its result is 4 messages plus every cost on the way
    result = statistics.median(r[h]["result"] for h in hosts)

    def cpu(h: int) -> float:
        return (client_call + client_host * h + sched_call + sched_host * h + h * (host_dispatch + host_op * dph)
                + own(h) + result)

    # lone calls: what a call of clients that each wait for their results costs beyond the above
    lone_call, lone_host = _line(hosts, [max(r[h].get("lone", 0.0) - cpu(h), 0.0) for h in hosts])

    def lone(h: int) -> float:
        return lone_call + lone_host * h

    # orders sent apart from their calls (a program slotted when another ended): a crowd's time per
    # call under proportional share beyond FIFO's, per program slotted late. A line through the two
    # crowds: per program still waiting when one is slotted (each of n clients has one call, the
    # window holds 2 programs and one is being slotted: n - 3 wait), and per host (the median over
    # the meshes: on one processor it grows faster than the hosts, and a cluster's hosts each pay
    # their own)
    few, many = CROWDS

    def per_late(h: int, n: int) -> float:
        share = r[h].get(f"late_share@{n}", 0.0)
        return max(r[h].get(f"late_extra@{n}", 0.0), 0.0) / share if share else 0.0

    waiting = statistics.median(max(per_late(h, many) - per_late(h, few), 0.0) / (many - few) for h in hosts)
    late_order_host = statistics.median(max(per_late(h, few) - waiting * (few - 3), 0.0) / h for h in hosts)
    # the scheduler learns of a lone call's ending after its last host ended it
    done_wait, done_wait_host = _line(hosts, [r[h].get("done_wait", 0.0) for h in hosts])
    # program endings that travel alone: the CPU per call beyond that of calls of zero cost, all of
    # it with the longest gangs, and a share of it with shorter ones
    def extra(h: int, stretch: float) -> float:
        return max(r[h][f"alone_cpu@{stretch:g}"] - r[h]["opbyop_cpu"], 0.0)

    longest = ALONE_STRETCHES[-1]
    lone_done, lone_done_host = _line(hosts, [extra(h, longest) for h in hosts])
    measured = [min(statistics.median(extra(h, stretch) / extra(h, longest) if extra(h, longest) else 1.0
                                      for h in hosts), 1.0) for stretch in ALONE_STRETCHES[:-1]]
    # longer gangs never leave fewer endings alone: each share at least the one before it
    share = tuple(zip(ALONE_STRETCHES, np.maximum.accumulate([*measured, 1.0]).tolist()))
    # a lone call and its result: 4 messages, and a wait per host, beyond every CPU cost on the way
    latency, lone_wait_host = _line(hosts, [max(r[h]["single"] - cpu(h) - lone(h), 0.0) for h in hosts])
    message = latency / 4
    # multi-controller: each host registers k programs; the devices' share of the GIL comes on top
    mc = max(statistics.median((r[h]["mc"] - own(h)) / h for h in hosts), 0.0)
    mc_op = host_op
    mc_call = max(mc - mc_op * dph, 0.0)
    costs = CostModel(client_call_s=client_call, client_host_s=client_host, scheduler_call_s=sched_call,
                     scheduler_host_s=sched_host, scheduler_take_s=take_call, scheduler_take_host_s=take_host,
                     host_dispatch_s=host_dispatch, host_op_s=host_op,
                     device_op_s=device_op, exchange_s=exchange, exchange_host_s=exchange_host, message_s=message, result_s=result,
                     lone_call_s=lone_call, lone_host_s=lone_host, lone_wait_host_s=lone_wait_host, lone_done_s=lone_done,
                     late_order_host_s=late_order_host, late_order_waiting_s=waiting, done_wait_s=done_wait,
                     done_wait_host_s=done_wait_host,
                     lone_done_host_s=lone_done_host, lone_done_share=share, mc_call_s=mc_call, mc_op_s=mc_op,
                     reference_s=raw.get("reference_s", 0.0), shared_cpu=False, source=_source(raw))
    if "tree" not in raw:  # measured before the trees were: their costs derived from the per-host ones
        done_share = relay_done_share(r)
        return replace(costs, scheduler_tree_s=sched_host, relay_forward_s=sched_host * (1 - done_share),
                       relay_done_s=sched_host * done_share, relay_root_s=0.0)
    tree = calibrate_tree.fit(raw["tree"], costs)
    source = {**costs.source, "fanout": calibrate_tree.describe(tree, raw["tree"], "measured with the rest")}
    return calibrate_tree.with_tree(costs, tree, source)


def relay_done_share(r: dict[int, dict[str, float]]) -> float:
    """Of the scheduler plugin's own CPU per call, the share of its growth per host that is the
    hosts' endings, fitted over the meshes ``r`` (:data:`~.model.RELAY_DONE_SHARE` where not
    measured, or where nothing grew): how a calibration without the trees' own timings splits
    their derived costs."""
    hosts = sorted(h for h in r if "meter_ended" in r[h] and "meter_rest" in r[h])
    if len(hosts) < 2:
        return RELAY_DONE_SHARE
    ended = _line(hosts, [r[h]["meter_ended"] for h in hosts])[1]
    rest = _line(hosts, [r[h]["meter_rest"] for h in hosts])[1]
    return ended / (ended + rest) if ended + rest > 0 else RELAY_DONE_SHARE


def _source(raw: dict[str, Any]) -> dict[str, Any]:
    import os

    import dask
    import distributed

    return {"made_by": "pathdask simulate --calibrate", "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU(s), {platform.system()} "
                       f"{platform.release()}", "python": platform.python_version(),
            "dask": dask.__version__, "distributed": distributed.__version__,
            "system": "LocalSystem(processes=False), 1 island x 4 hosts x 2 devices", "raw": raw}


def calibrate(path: str | None = None, k: int = 64, repeats: int = 5, echo: Echo = print) -> CostModel:
    """Measure, fit and save (to ``path``, by default the calibration shipped with pathdask)."""
    from .model import DEFAULT

    echo(f"pathdask simulate --calibrate: timing the embedded system ({k} calls per measurement)")
    costs = fit(measure(k, repeats, echo))
    costs.save(path or DEFAULT)
    echo("  " + ", ".join(f"{n} {v * 1e6:.1f} us" for n, v in costs.to_dict().items() if n.endswith("_s")))
    echo(f"wrote {path or DEFAULT}")
    return costs
