"""The chaos that strikes a host of a stress run, and a bounded wait for best-effort calls."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from ...faults import fail_next_dispatch
from ...protocol import WaitHosts, ask
from ...system import LocalSystem
from .state import RunState


class Agent:
    """Strikes one host of a run's system once enough programs ended (see ``fire``)."""

    kind = ""

    def __init__(self, system: LocalSystem, after: int, victim: int, state: RunState) -> None:
        from distributed import Client as DaskClient

        self.dask = DaskClient(system.scheduler_address, set_as_default=False, timeout=30)
        pids = self.dask.run(os.getpid)
        self.address = sorted(pids)[victim % len(pids)]
        self.pid = int(pids[self.address])
        self.island = next(d["island"] for d in system.devices() if d["address"] == self.address)
        self.after, self.state, self.fired = after, state, False

    def maybe_fire(self, ended: int) -> None:
        if self.fired or ended < self.after:
            return
        self.fired = True
        self.state.chaos(self.kind, host=self.address, island=self.island)
        with contextlib.suppress(OSError, KeyError):  # the host left already: nothing to strike
            self.fire()

    def fire(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.dask.close()


class WorkerKiller(Agent):
    """SIGKILLs one worker process (started by the LocalSystem)."""

    kind = "kill-worker"

    def fire(self) -> None:
        os.kill(self.pid, signal.SIGKILL)  # a worker of our own LocalSystem, by its PID

    def wait_hosts(self) -> None:
        self.dask.sync(ask, self.dask.scheduler, WaitHosts(timeout="60s"))


class DispatchFailer(Agent):
    """Makes the next dispatch on one host fail."""

    kind = "fail-dispatch"

    def fire(self) -> None:
        self.dask.run(fail_next_dispatch, workers=[self.address])


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` in a daemon thread; its result, its exception, or ``TimeoutError`` after ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)!r} did not return within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
