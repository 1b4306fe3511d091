"""What a host reports about itself: stats, the state of each device, and stall warnings."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from tornado.ioloop import PeriodicCallback

from ..core.ledger import Ledger
from ..core.plans import PlanCache
from ..diagnosis import describe
from ..topology import DeviceInfo
from .device import DeviceStream
from .links import LinkModel
from .store import BufferStore
from .transfer import Mailbox

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("pathdask.worker")

#: device states that are waits (a stall when they last); "run" is work
WAITS = ("dispatch", "pieces", "memory", "release")


class Observed(Protocol):
    """What a report reads of a host (``HostRuntime`` is one)."""

    worker: Worker | None
    address: str
    island: int
    host: int
    devices: dict[int, DeviceInfo]
    streams: dict[int, DeviceStream]
    store: BufferStore
    mailbox: Mailbox
    links: LinkModel
    ledger: Ledger
    plans: PlanCache


def host_stats(rt: Observed) -> dict[str, Any]:
    mem = rt.store.stats()
    devices = {}
    for d, s in rt.streams.items():
        gaps = s.gaps_snapshot()
        devices[d] = {
            **mem[d],
            "island": rt.island,
            "host": rt.host,
            "index": rt.devices[d].index,
            "address": rt.address,
            "busy_s": s.busy_s,
            "gangs_run": s.gangs_run,
            "exchanges": s.exchanges,
            "exchange_wait_s": s.exchange_wait_s,
            "pending_programs": s.pending,
            "idle_gaps": len(gaps),
            "idle_gap_median_s": float(np.median(gaps)) if gaps else None,
        }
    dispatched, _ = rt.ledger.counts()
    return {"devices": devices, "links": rt.links.stats(), "nics": rt.links.nics(), "programs": dispatched,
            "mailbox": rt.mailbox.pending()}


def device_state(rt: Observed, device: int) -> dict[str, Any]:
    """What ``device`` does now: its state, the program and gang, what it waits for, its queue."""
    s = rt.streams[device]
    head, now = s.head, time.monotonic()
    out: dict[str, Any] = {"device": device, "island": rt.island, "host": rt.host, "address": rt.address,
                           "queued": s.pending, "queue": s.queue()}
    if head is None:
        return {**out, "state": "idle"}
    prog = rt.ledger.get(head.pid)
    out.update(program=head.pid, program_name=prog.plan.name if prog else None, gang=head.gang,
               client=rt.ledger.client_of(head.pid), state=head.phase, for_s=now - head.since)
    if head.phase != "run":
        return out
    pieces = rt.mailbox.waiting(device)
    if pieces is not None and pieces["program"] == head.pid:
        out.update(state="pieces", from_devices=pieces["from_devices"], collective=pieces["collective"],
                   for_s=now - pieces["since"])
    memory = rt.store.memory_wait(device)
    if memory is not None:
        out.update(state="memory", bytes=memory[0], for_s=now - memory[1])
    return out


def diagnose(rt: Observed) -> dict[str, Any]:
    dispatched, slotted = rt.ledger.counts()
    return {"address": rt.address, "island": rt.island, "host": rt.host, "dispatched": dispatched,
            "slotted": slotted, "plans": len(rt.plans),
            "devices": {d: device_state(rt, d) for d in rt.streams}}


class StallWatch:
    """Warns, once per wait, when a device has waited longer than ``pathdask.stall-warning``.

    The warning is logged and emitted as a Dask event (topic ``pathdask-stall``).
    Runs on the worker's event loop.
    """

    def __init__(self, rt: Observed, threshold: float) -> None:
        self.rt, self.threshold = rt, threshold
        self.warned: set[tuple[Any, ...]] = set()
        self.callback = PeriodicCallback(self.check, max(100.0, min(1000.0, threshold * 250)))

    def start(self) -> None:
        self.callback.start()

    def stop(self) -> None:
        self.callback.stop()

    def check(self) -> None:
        seen = set()
        for d in self.rt.streams:
            state = device_state(self.rt, d)
            if state["state"] not in WAITS or state["for_s"] < self.threshold:
                continue
            key = (d, state["program"], state["gang"], state["state"])
            seen.add(key)
            if key in self.warned:
                continue
            message = f"pathdask stall: {describe(state)}"
            logger.warning(message)
            assert self.rt.worker is not None
            self.rt.worker.log_event("pathdask-stall", {**state, "message": message})
        self.warned = seen  # forget waits that ended, so the set stays small
