"""Devices on the virtual clock: every device's ops, run as the real device threads run them.

Each device runs its programs in slot order and its ops in plan order
(``worker/device.py``). Per device the engine keeps two clocks, as the real
thread has them (``worker/execute.run_op``): ``modelled``, the modelled end of
its last op, and ``real``, where its thread is. A program's ops on a host may
start once that host has it (dispatched and slotted: ``ready``).

- A kernel starts at ``begin = max(modelled, ready)``; its thread spends
  ``device_op_s`` and the body's measured compute (``real``); its collectives
  sync the members of each group (the latest member's arrival, plus the link
  time of its pieces); it ends at ``max(begin + cost_s, real, last collective)``.
  Back to back, a device is thus busy ``max(cost_s, device_op_s + compute)``
  per kernel, as the real one is.
- A move's send leaves at the device's modelled clock and takes no device time;
  each piece books the sender's and the receiver's ports of the real
  :class:`~pathdask.worker.links.LinkModel` on the virtual clock; the receive
  ends when the last piece arrived.

Approximation: a collective inside a kernel is timed from its group's bytes and
widest link (latency plus bytes over bandwidth), without booking ports: at 2,048
devices a psum has millions of pieces. Moves book every piece.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..topology import Topology
from ..worker.links import LinkModel
from .clock import Processor
from .model import CostModel
from .schedule import Schedule, Step

__all__ = ["DeviceEngine", "own_seconds"]


def own_seconds(step: Step, costs: CostModel) -> float:
    """A device thread's own time for one kernel: its op, its body's compute and its collectives."""
    return costs.device_op_s + step.compute + sum(costs.exchange_s + ex.remote_hosts * costs.exchange_host_s
                                                  for ex in step.exchanges)


class DeviceEngine:
    """The state of every device of a topology, and the trace of what they ran."""

    def __init__(self, topology: Topology, costs: CostModel, trace_gangs: int = 20000,
                 shared: Processor | None = None) -> None:
        n = topology.num_devices
        #: with one shared processor (one GIL), the device threads' own time queues on it too
        self.shared = shared
        self.topology, self.costs = topology, costs
        self.modelled = np.zeros(n)
        self.real = np.zeros(n)
        self.busy = np.zeros(n)
        self.gangs_run = np.zeros(n, dtype=np.int64)
        self.links = LinkModel(topology)
        self.trace_gangs = trace_gangs
        self.recorded = 0
        self._records: list[tuple[Any, ...]] = []
        self.device_ops = 0
        #: per client, busy device-seconds inside ``window`` (when set), and ops begun inside it
        self.window: tuple[float, float] | None = None
        self.client_busy: dict[str, float] = defaultdict(float)
        self.client_ops: dict[str, int] = defaultdict(int)

    def run(self, sched: Schedule, ready: np.ndarray, pid: str, client: str,
            lead: np.ndarray | None = None) -> np.ndarray:
        """Run one program whose hosts have it at ``ready`` (per entry of ``sched.hosts``); returns,
        per host, when its last device popped it. ``lead``: per host, CPU the program costs its
        host when it starts, beside its devices' work (its ops wait for it only as they wait for
        any work on a busy processor)."""
        at = np.zeros(int(sched.hosts.max()) + 1)
        at[sched.hosts] = ready
        if lead is not None:
            if self.shared is not None:  # on the one processor, once the devices are free for it
                t0 = max(float(self.modelled[sched.devices].max()), float(ready.min()))
                self.shared.book(t0, float(lead.sum()))
            else:  # on the devices' threads' own clocks
                per_host = np.zeros_like(at)
                per_host[sched.hosts] = lead
                host_of = sched.devices // self.topology.devices_per_host
                self.real[sched.devices] = np.maximum(self.real[sched.devices], at[host_of]) + per_host[host_of]
        arrivals: dict[tuple[int, int], float] = {}
        for step in sched.steps:
            r = at[step.hosts]
            if step.kind == "kernel":
                begin, end = self._kernel(step, r)
            elif step.kind == "send":
                begin, end = self._send(step, r, arrivals)
            else:
                begin, end = self._recv(step, r, arrivals)
            self._account(step, begin, end, pid, sched.name, client)
        done = np.maximum(self.modelled[sched.devices], self.real[sched.devices])
        out = np.zeros_like(at)
        np.maximum.at(out, sched.devices // self.topology.devices_per_host, done)
        return out[sched.hosts]

    def _kernel(self, step: Step, ready: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        devs, c = step.devs, self.costs
        begin = np.maximum(self.modelled[devs], ready)
        own_s = own_seconds(step, c)
        if self.shared is not None:  # every thread's own time, one after another, on the one processor
            own = self.shared.book(float(begin.min()), len(devs) * own_s)
            end = np.maximum(begin + step.cost, own)
        else:
            end = np.maximum(begin + step.cost, np.maximum(self.real[devs], ready) + own_s)
        t = begin
        for ex in step.exchanges:
            t = np.broadcast_to(t.reshape(step.shape).max(axis=ex.axes, keepdims=True), step.shape).ravel() + ex.seconds
        if step.exchanges:
            end = np.maximum(end, t)
        self.modelled[devs] = end
        self.real[devs] = end
        return begin, end

    def _send(self, step: Step, ready: np.ndarray, arrivals: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray]:
        devs = step.devs
        begin = np.maximum(self.modelled[devs], ready)
        self.real[devs] = np.maximum(self.real[devs], ready) + self.costs.device_op_s
        self.modelled[devs] = begin
        start = dict(zip(devs.tolist(), begin.tolist()))
        links, gang = self.links, step.gang
        for src, dst, nbytes in step.pieces:
            stamp = links.depart(src, dst, nbytes, start[src.id], step.scale)
            arrival = links.arrival(src.id, dst, nbytes, stamp, step.scale)
            key = (gang, dst.id)
            arrivals[key] = max(arrivals.get(key, arrival), arrival)
        return begin, begin

    def _recv(self, step: Step, ready: np.ndarray, arrivals: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray]:
        devs = step.devs
        begin = np.maximum(self.modelled[devs], ready)
        came = np.array([arrivals.pop((step.gang, d), 0.0) for d in devs.tolist()])
        end = np.maximum(begin, came)
        self.real[devs] = np.maximum(np.maximum(self.real[devs], ready) + self.costs.device_op_s, came)
        self.modelled[devs] = end
        return begin, end

    def _account(self, step: Step, begin: np.ndarray, end: np.ndarray, pid: str, name: str, client: str) -> None:
        devs = step.devs
        self.device_ops += len(devs)
        self.busy[devs] += end - begin
        self.gangs_run[devs] += 1
        if self.window is not None:
            t0, t1 = self.window
            self.client_busy[client] += float((np.clip(end, t0, t1) - np.clip(begin, t0, t1)).sum())
            self.client_ops[client] += int(((begin >= t0) & (begin < t1)).sum())
        if self.recorded < self.trace_gangs:
            nbytes = sum(e.nbytes for e in step.exchanges)
            self._records.append((devs, begin, end, pid, step.name, client, nbytes, name))
            self.recorded += len(devs)

    def gangs(self) -> dict[str, list[Any]]:
        """The recorded ops as the timeline view's columns (``dashboard.record.COLUMNS``)."""
        cols: dict[str, list[Any]] = {c: [] for c in ("device", "start", "end", "program", "gang", "client",
                                                         "bytes_in", "bytes_out", "name")}
        for devs, begin, end, pid, gang, client, nbytes, name in self._records:
            n = len(devs)
            cols["device"] += devs.tolist()
            cols["start"] += begin.tolist()
            cols["end"] += end.tolist()
            cols["program"] += [pid] * n
            cols["gang"] += [gang] * n
            cols["client"] += [client] * n
            cols["bytes_in"] += [nbytes] * n
            cols["bytes_out"] += [nbytes] * n
            cols["name"] += [name] * n
        return cols

    def stats(self) -> dict[str, Any]:
        """As ``device_stats()`` has them: per device busy time and ops run; per link class; per NIC."""
        return {"devices": {int(d): {"busy_s": float(self.busy[d]), "gangs_run": int(self.gangs_run[d])}
                            for d in np.nonzero(self.gangs_run)[0]},
                "links": self.links.stats(), "nics": self.links.nics()}
