"""The harness side of one stress run: what its clients reported."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .scenario import Sink


@dataclass
class RunState:
    """What the clients of one run reported; every change notifies ``cond``."""

    n: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    last_progress: float = field(default_factory=time.time)
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    victims: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)  # meshes made: a worker kill cannot fail them
    finished: set[int] = field(default_factory=set)
    kill_requests: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    ended: int = 0

    def sink(self, index: int) -> Sink:
        def report(kind: str, **data: Any) -> None:
            self.apply(index, kind, data)

        return report

    def apply(self, index: int, kind: str, data: dict[str, Any]) -> None:
        with self.cond:
            now = time.time()
            self.last_progress = now
            if kind == "program":
                self.ended += 1
                self.records.append({"client": index, **data})
                if data["outcome"] == "timeout":
                    self.timeouts.append(f"client {index} program {data['k']}: {data['detail']}")
            elif kind == "chaos":
                self.victims.add(index)
                self.events.append({"t": data.get("t", now), "kind": data["what"], "client": index})
            elif kind == "started":
                self.started.add(index)
            elif kind == "kill_me":
                self.kill_requests.append(index)
            elif kind == "crash" and index not in self.victims:
                self.records.append({"client": index, "k": -1, "t0": now, "t1": now,
                                     "outcome": "typed" if data["typed"] else "wrong",
                                     "detail": f"client crashed: {data['error']}"})
            elif kind == "eof" and index not in self.finished:
                self.problems.append(f"process client {index} died without finishing")
            if kind in ("finished", "eof"):
                self.finished.add(index)
            self.cond.notify_all()

    def chaos(self, kind: str, **data: Any) -> None:
        with self.cond:
            self.events.append({"t": time.time(), "kind": kind, **data})
            self.last_progress = time.time()


def read_reports(conn: Connection, index: int, state: RunState) -> None:
    while True:
        try:
            kind, data = conn.recv()
        except Exception:  # noqa: BLE001 - EOF, or a message cut short by a SIGKILL
            conn.close()
            state.apply(index, "eof", {})
            return
        state.apply(index, kind, data)
