"""The fan-out trees' costs, measured on the real embedded system (part of ``pathdask simulate --calibrate``).

On a real ``LocalSystem(processes=False)`` of one island of :data:`TOPOLOGY`'s 8 hosts
of one device each, on meshes of :data:`HOSTS` hosts, ``k`` one-gang calls of the
dispatch benchmark's all-reduce at zero cost go back to back, twice per repeat: each
call's records sent to each of its hosts by the scheduler (its threshold set above the
mesh's hosts), then down a tree of its hosts (threshold 1, the configured degree). Each
run waits until every program ended and every output was released (the releases go
down the trees too), so a run holds all of its calls' records and endings. Measured in
each run, per call:

- in CPU seconds of the thread doing the work (``time.thread_time``: a wait for the GIL
  is not counted), each host's handlers of the scheduler's records (``Dispatch``, ``Order``,
  ``ReleaseOutputs``, or a tree's ``Fan``), of its peers' records (``Fan`` and
  ``SubtreeDone``, their decoding included), its relay thread's sends to its peers
  (encoding and hand-over), and its endings (``HostRuntime._ended``);
- the scheduler plugin's own CPU on calls (``CallMeter``), and its count of calls that
  went down a tree (``fanned``, which checks that each run used the path meant),
  from ``client.device_stats()["scheduler"]``;
- the process's CPU per call (``time.process_time``, up to the last result: one process
  on one CPU, the embedded model's one processor).

The fit (:func:`fit`), where a tree call on ``n`` hosts has ``n - 1`` children in all:

- the timers give what the hosts' handlers spend per child: on a tree call's records
  down (their ``Fan`` handlers and relay sends beyond their handler of calls without the
  tree, ``Dispatch``, whose CPU is ``host_dispatch_s`` as before), and on its endings up
  (``SubtreeDone`` handlers, relay sends of them, and their endings beyond the direct
  ones): the slopes of two lines over the children. The lines' intercepts are what a
  tree call costs its first host beyond its children (``relay_root_s``: its records come
  one ``Fan`` at a time, where calls' dispatches without the tree come a slice at a time).
- the process's CPU gives the whole: a tree call's beyond the same call's without the
  tree, plus what the model's scheduler pays for the latter (``scheduler_call_s`` and
  ``scheduler_host_s`` per host), is what the tree costs the scheduler and the hosts. A
  line over the children: its slope is all the hosts' CPU per child, the timed work and
  what no handler holds (the thread hand-offs and event-loop turns of each record one
  host relays to another), split into ``relay_forward_s`` and ``relay_done_s`` as the
  timers split theirs; its intercept, less ``scheduler_call_s`` and ``relay_root_s``, is
  ``scheduler_tree_s``.
- a second estimate of ``scheduler_tree_s``, for the record: a call on one host's
  scheduler CPU in the model, times the plugin's metered CPU per tree call over per call
  on one host (the meter leaves out Dask's own work on the records, which this scales
  with it).

Every timing is in reference seconds of the :class:`~.measure.SpeedMeter` during its run,
so that the costs come at the calibration's mean speed (or, merged into another
calibration by :func:`merge`, at that one's).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dask
import numpy as np

from .. import P
from ..bench.dispatch import Kernels
from ..bench.hosts import _settled
from ..protocol import Dispatch, Fan, Order, ReleaseOutputs
from ..scheduler.meter import METERED
from ..system import LocalSystem
from ..topology import Topology
from .measure import SpeedMeter
from .model import RELAY_DONE_SHARE, CostModel

Echo = Callable[[str], Any]

__all__ = ["HOSTS", "TOPOLOGY", "TreeClock", "describe", "fit", "in_seconds", "measure", "merge", "with_tree"]

#: one island of 8 hosts of one device: trees of 1, 3 and 7 children
TOPOLOGY = {"islands": 1, "hosts_per_island": 8, "devices_per_host": 1}
#: the meshes' hosts: one (the scheduler's CPU per call on one host), then trees
HOSTS = (1, 2, 4, 8)
#: what each timed part is, by the name the raw timings give it
PARTS = {
    "dispatch": "hosts' handlers of the scheduler's Dispatch records (a call's parts without the tree)",
    "order": "of its Order records", "release": "of its ReleaseOutputs records",
    "fan": "of Fan records, the scheduler's and peers' (a tree's records down, decoding included)",
    "relay_fan": "relay threads' sends of Fan records to peers",
    "subtree": "hosts' handlers of peers' SubtreeDone records (endings up)",
    "relay_subtree": "relay threads' sends of SubtreeDone records",
    "ended": "hosts' endings of programs (their report to the scheduler, or to their parent)",
}


class TreeClock:
    """Every host's handlers of records, relay sends and endings of an embedded system, timed
    in CPU seconds of their threads and summed by part (:data:`PARTS`)."""

    def __init__(self, system: LocalSystem) -> None:
        assert system.cluster is not None
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.counts: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Lock()  # the relay threads add to it too
        names = {Dispatch: "dispatch", Order: "order", ReleaseOutputs: "release", Fan: "fan"}
        for worker in system.cluster.workers.values():
            rt = worker.plugins["pathdask"]
            for kind, name in names.items():
                rt.handlers[kind] = self._timed(rt.handlers[kind], lambda *_a, _n=name: _n)
            # peers' records come as fields (decoded in the handler), relays as records
            rt.on_peer_record = self._timed(rt.on_peer_record,
                                            lambda f: "fan" if f.get("kind") == Fan.kind else "subtree")
            rt._relay = self._timed(rt._relay, lambda _addr, m: "relay_fan" if isinstance(m, Fan) else "relay_subtree")
            rt._ended = self._timed(rt._ended, lambda _pid: "ended")

    def _timed(self, inner: Callable[..., Any], part: Callable[..., str]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            t = time.thread_time()
            try:
                return inner(*args)
            finally:
                spent = time.thread_time() - t
                with self._lock:
                    name = part(*args)
                    self.spent[name] += spent
                    self.counts[name] += 1

        return wrapper

    def clear(self) -> None:
        with self._lock:
            self.spent.clear()
            self.counts.clear()

    def per_call(self, calls: int) -> dict[str, float]:
        with self._lock:
            return {part: self.spent.get(part, 0.0) / calls for part in PARTS}


def _run(client: Any, step: Any, k: int, x: Any, core: Any, threshold: int, clock: TreeClock,
         base: int) -> dict[str, float]:
    """``k`` calls of ``step`` back to back, every record and ending through, with the scheduler's
    tree threshold at ``threshold``: the timings per call."""
    core.threshold = threshold
    _settled(client, base)
    clock.clear()
    before = client.device_stats()["scheduler"]
    c0 = time.process_time()
    y = x
    for _ in range(k):
        y = step(y)
    y.result()
    cpu = (time.process_time() - c0) / k  # the last call's ending and release are 1/k of it: left out
    del y
    _settled(client, base)  # every program ended and every output released, down and up the trees
    after = client.device_stats()["scheduler"]
    calls = after["calls"] - before["calls"]
    if calls != k:
        raise RuntimeError(f"tree calibration: {calls} calls metered, {k} made")
    return {**clock.per_call(k), "process_cpu": cpu, "plugin": (after["plugin_cpu_s"] - before["plugin_cpu_s"]) / k,
            "fanned": (after["fanned"] - before["fanned"]) / k}


def measure(k: int, repeats: int, meter: SpeedMeter, echo: Echo = print) -> dict[str, Any]:
    """The raw timings per mesh, ``"direct"`` and ``"tree"``, each the median over ``repeats``
    of reference seconds per call (divided by the meter's reading during its run)."""
    topology = Topology.from_dict(TOPOLOGY)
    raw: dict[str, Any] = {}
    with dask.config.set(METERED), \
            LocalSystem(topology, processes=False, dashboard_address=None) as system:
        assert system.cluster is not None
        core = system.cluster.scheduler.plugins["pathdask"].core
        found = core.threshold
        clock = TreeClock(system)
        client = system.client(name="calibrate-tree")
        kernels = Kernels(0.0, k)
        try:
            # Each mesh's array is released before the next is put, and its buffers awaited: a
            # release still on its way would be counted in the next mesh's base, and be missing
            # from every count after it.
            empty = _settled(client, None)
            for hosts in HOSTS:
                mesh = client.mesh({"x": hosts}, island=0)
                if len(mesh.hosts) != hosts:
                    raise RuntimeError(f"tree calibration needs a mesh on {hosts} host(s); got {mesh.hosts}")
                x = client.put(np.zeros(hosts), mesh, P("x"))
                x.result()
                base = _settled(client, None)
                modes = {"direct": hosts} if hosts == 1 else {"direct": hosts, "tree": 1}
                runs: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in modes}
                for threshold in modes.values():  # warm: traces, plans, the peers' connections
                    _run(client, kernels.step, 4, x, core, threshold, clock, base)
                for _ in range(repeats):
                    for mode, threshold in modes.items():  # in turn, so that both meet the CPU alike
                        one, speed = meter.during(_run, client, kernels.step, k, x, core, threshold, clock, base,
                                                  near=meter.mean())
                        for name, v in one.items():
                            runs[mode][name].append(v if name == "fanned" else v / speed)
                raw[str(hosts)] = {m: {name: statistics.median(v) for name, v in r.items()} for m, r in runs.items()}
                for mode, r in raw[str(hosts)].items():
                    if r["fanned"] != (mode == "tree"):
                        raise RuntimeError(f"tree calibration: on {hosts} hosts, {r['fanned']:.0%} of the calls "
                                           f"meant to go {mode} went down a tree")
                now = meter.mean()
                echo(f"  trees, {hosts} host(s), us per call: " + "; ".join(
                    f"{mode}: " + ", ".join(f"{n} {v * now * 1e6:.1f}" for n, v in r.items() if n != "fanned" and v)
                    for mode, r in raw[str(hosts)].items()))
                del x
                _settled(client, empty)
        finally:
            core.threshold = found
            client.close()
    raw["k"] = k
    raw["degree"] = core.degree
    raw["topology"] = topology.to_dict()
    return raw


def in_seconds(raw: dict[str, Any], reference: float) -> dict[str, Any]:
    """``raw`` (:func:`measure`'s, per reference second) in seconds of a CPU whose meter reads
    ``reference``."""
    return {h: {mode: {n: v if n == "fanned" else v * reference for n, v in r.items()} for mode, r in runs.items()}
            if h.isdigit() else runs for h, runs in raw.items()}


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope (the slope at least 0: a negative one is noise)."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    if slope < 0:
        return float(np.mean(ys)), 0.0
    return float(intercept), float(slope)


def fit(raw: dict[str, Any], costs: CostModel) -> dict[str, float]:
    """The tree's costs from ``raw`` (:func:`in_seconds`; see the module docstring) and the
    calibration ``costs`` they go with (its scheduler's CPU for calls without a tree).

    Returns the four costs, and what they were fitted from: ``timed_per_child_s`` (the timed
    forward and ending per child), ``per_child_s`` (all the process's CPU per child), and
    ``scheduler_tree_by_meter_s`` (:attr:`~.model.CostModel.scheduler_tree_s` by the plugin's
    meter instead: a call on one host's, times its metered CPU per tree call over per call on
    one host)."""
    trees = sorted(int(h) for h in raw if h.isdigit() and "tree" in raw[h])
    children = [h - 1.0 for h in trees]
    r = {h: raw[str(h)] for h in trees}
    # the timers: the records down beyond the hosts' own registrations, and the endings up
    down = [r[h]["tree"]["fan"] + r[h]["tree"]["relay_fan"] - r[h]["direct"]["dispatch"] for h in trees]
    up = [r[h]["tree"]["subtree"] + r[h]["tree"]["relay_subtree"] + r[h]["tree"]["ended"] - r[h]["direct"]["ended"]
          for h in trees]
    down0, forward = _line(children, down)
    up0, done = _line(children, up)
    root = max(down0 + up0, 0.0)
    # the process's CPU: a tree call's beyond the same call's without the tree, plus what the model's
    # scheduler pays for the latter, is what the tree costs the scheduler and the hosts
    base = costs.scheduler_call_s
    left = [r[h]["tree"]["process_cpu"] - r[h]["direct"]["process_cpu"] + base + costs.scheduler_host_s * h
            for h in trees]
    flat, per_child = _line(children, left)
    timed = forward + done
    per_child = max(per_child, timed)  # the timers' work is done, whatever else the noise says
    share = forward / timed if timed > 0 else 1 - RELAY_DONE_SHARE
    one = raw["1"]["direct"]["plugin"] if "1" in raw else 0.0
    ratio = statistics.median(r[h]["tree"]["plugin"] for h in trees) / one if one > 0 else math.nan
    return {"scheduler_tree_s": max(flat - base - root, 0.0), "relay_forward_s": per_child * share,
            "relay_done_s": per_child * (1 - share), "relay_root_s": root, "timed_per_child_s": timed,
            "per_child_s": per_child, "scheduler_tree_by_meter_s": (base + costs.scheduler_host_s) * ratio - base}


#: what :func:`fit` returns beside the costs
FITTED_FROM = ("timed_per_child_s", "per_child_s", "scheduler_tree_by_meter_s")


def merge(path: str | None = None, k: int = 64, repeats: int = 5, echo: Echo = print) -> CostModel:
    """Measure the tree's costs here and put them into the calibration at ``path`` (default: the
    one shipped), at that calibration's speed (its ``reference_s``); the rest stays as it is."""
    from .model import DEFAULT

    costs = CostModel.load(path)
    with SpeedMeter() as meter:
        raw = measure(k, repeats, meter, echo)
        speed = meter.mean()
    reference = costs.reference_s or speed
    raw = in_seconds(raw, reference)
    fitted = fit(raw, costs)
    source = {**costs.source, "fanout": describe(fitted, raw, (
        f"measured on {time.strftime('%Y-%m-%d')} by pathdask simulate --calibrate's tree part (merged by "
        f"calibrate_tree.merge) at a speed meter reading of {speed * 1e3:.3f} ms, scaled to this calibration's "
        f"{reference * 1e3:.3f} ms")), "raw_tree": raw}
    merged = with_tree(costs, fitted, source)
    merged.save(path or DEFAULT)
    echo("  " + ", ".join(f"{n} {v * 1e6:.1f} us" for n, v in fitted.items()))
    echo(f"wrote {path or DEFAULT}")
    return merged


def with_tree(costs: CostModel, fitted: dict[str, float], source: dict[str, Any]) -> CostModel:
    """``costs`` with the tree's costs of :func:`fit`, and ``source``."""
    return replace(costs, scheduler_tree_s=fitted["scheduler_tree_s"], relay_forward_s=fitted["relay_forward_s"],
                   relay_done_s=fitted["relay_done_s"], relay_root_s=fitted["relay_root_s"], source=source)


def describe(fitted: dict[str, float], raw: dict[str, Any], when: str) -> str:
    """The calibration's ``source`` note on its tree costs."""
    return (f"the fan-out trees' costs {when} (calibrate_tree: one island of 8 hosts x 1 device, meshes of "
            f"{', '.join(map(str, HOSTS))} hosts, k={raw['k']} calls each, sent directly and down trees of degree "
            f"{raw['degree']} in turn): per child {fitted['per_child_s'] * 1e6:.1f} us of the process's CPU, of which "
            f"the hosts' timed handlers and relay sends {fitted['timed_per_child_s'] * 1e6:.1f} us; the scheduler's "
            f"per tree call by its plugin's meter instead {fitted['scheduler_tree_by_meter_s'] * 1e6:.1f} us")
