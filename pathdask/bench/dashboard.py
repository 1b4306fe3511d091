"""``pathdask bench dashboard``: how fast the dashboard answers with a full activity record.

On the default topology (8 devices), tenants on both islands keep calling a
small program until the scheduler's record holds ``gangs`` gangs. Then, while
they go on, it times each JSON route (``/pathdask/api/<view>``) and each page
(``/pathdask/<view>``: the server builds the page's Bokeh document on each GET)
over ``repeats`` requests, and prints the median and the worst, beside the
goal of 200 ms; then it stops the tenants and times them all again (idle).
With LocalSystem the tenants share the scheduler's process and interpreter,
so the live figures include their contention. Writes ``dashboard.json``.

:class:`Workload` (tenants in threads) is what the dashboard's tests and the
README's screenshot use too.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np

from .. import P, function, program, psum
from ..dashboard.views import VIEWS
from ..system import LocalSystem
from .report import table, write_json

Echo = Callable[[str], Any]
GOAL_MS = 200.0


@function(in_specs=(P("x", None),), out_specs=P("x", None), cost=0.001)
def scale(a: Any) -> Any:
    return 2.0 * a


@function(in_specs=(P("x", None),), out_specs=P(None, None), cost=0.001)
def total(a: Any) -> Any:
    return psum(a, "x")


@program
def step(a: Any) -> Any:
    """Two gangs: a local one, then a psum across the mesh (bytes move on the links)."""
    return total(scale(a))


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0
    island: int | None = None
    devices: int = 4


class Workload:
    """Tenants in threads, each calling :func:`step` on its own mesh until :meth:`stop`.

    ``ready`` is set once every tenant has had a result; errors are raised by ``stop``.
    """

    def __init__(self, system: LocalSystem, tenants: Sequence[Tenant]) -> None:
        self.system, self.tenants = system, list(tenants)
        self.calls = dict.fromkeys((t.name for t in tenants), 0)
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(t,), name=f"tenant-{t.name}", daemon=True)
                         for t in tenants]

    def start(self) -> Workload:
        for t in self._threads:
            t.start()
        return self

    def _run(self, tenant: Tenant) -> None:
        try:
            client = self.system.client(name=tenant.name, weight=tenant.weight)
            mesh = client.mesh({"x": tenant.devices}, island=tenant.island)
            x = client.put(np.ones((2 * tenant.devices, 4)), mesh, P("x", None))
            while not self._stop.is_set():
                step(x).result(timeout=60)
                with self._lock:
                    self.calls[tenant.name] += 1
                    if all(self.calls.values()):
                        self.ready.set()
        except BaseException as e:  # noqa: BLE001 - raised again by stop()
            self._errors.append(e)
            self.ready.set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` while the tenants run; ``True`` once they were stopped."""
        return self._stop.wait(seconds)

    def stop(self) -> dict[str, int]:
        """Stop the tenants (their clients stay open until the system closes); calls per tenant."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        if self._errors:
            raise self._errors[0]
        return dict(self.calls)

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


TENANTS = (Tenant("alice", 2, 0), Tenant("bob", 1, 0), Tenant("carol", 1, 1))


@dataclass
class Config:
    gangs: int = 10_000
    repeats: int = 20
    tenants: tuple[Tenant, ...] = field(default=TENANTS)

    @classmethod
    def small(cls) -> Config:
        return cls(gangs=1_000, repeats=3)


def fetch(url: str) -> tuple[float, bytes]:
    """Seconds to GET ``url`` (the whole body), and the body."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read()
    return time.perf_counter() - start, body


def recorded(root: str) -> int:
    """Gangs in the scheduler's record now (asked through the JSON API)."""
    return int(json.loads(fetch(f"{root}/pathdask/api/timeline?limit=0")[1])["recorded"])


#: GETs of each page per measurement. Each GET opens a Bokeh session that lives on unused
#: for Bokeh's 15 s and is then destroyed with a full ``gc.collect()`` on the event loop
#: (``bokeh.document.Document.destroy``), whose cost grows with the sessions alive: a
#: browser opens a page once, and a hundred GETs in a row would time that pile-up instead.
PAGE_REPEATS = 5


def _time_routes(root: str, repeats: int) -> list[dict[str, Any]]:
    """Median and worst milliseconds of ``repeats`` GETs of each JSON route (of at most
    :data:`PAGE_REPEATS` of each page)."""
    rows = []
    for kind, path in [("api", f"pathdask/api/{v}") for v in VIEWS] + [("page", f"pathdask/{v}") for v in VIEWS]:
        n = repeats if kind == "api" else min(repeats, PAGE_REPEATS)
        times = [fetch(f"{root}/{path}")[0] * 1e3 for _ in range(n)]
        rows.append({"route": f"/{path}", "kind": kind, "median_ms": statistics.median(times), "max_ms": max(times)})
    return rows


def run(cfg: Config, out: str = "bench-results", echo: Echo = print, processes: bool = True) -> dict[str, Any]:
    with dask.config.set({"pathdask.dashboard.gangs": max(cfg.gangs, 20_000)}), \
            LocalSystem(processes=processes) as system:
        link = system.dashboard_link
        assert link is not None
        root = link.rsplit("/", 1)[0]
        with Workload(system, cfg.tenants) as work:
            work.ready.wait(120)
            start = time.perf_counter()
            while recorded(root) < cfg.gangs:  # the record fills as the tenants run
                work.wait(0.5)
            fill_s = time.perf_counter() - start
            live = _time_routes(root, cfg.repeats)
        gangs = recorded(root)
        idle = _time_routes(root, cfg.repeats)
        devices = len(system.devices())
    rows = [{**r, "live_median_ms": lv["median_ms"], "live_max_ms": lv["max_ms"]} for r, lv in zip(idle, live)]
    echo(f"pathdask bench dashboard: {devices} devices, {gangs} gangs recorded "
         f"(filled in {fill_s:.1f}s while {len(cfg.tenants)} tenants ran), {cfg.repeats} requests per route;")
    echo("idle: the record full, the tenants stopped; live: while the tenants run, in the scheduler's own "
         "process (LocalSystem), sharing its interpreter")
    echo(table(["route", "idle median ms", "idle max ms", f"under {GOAL_MS:g} ms", "live median ms", "live max ms"],
               [(r["route"], r["median_ms"], r["max_ms"], "yes" if r["max_ms"] < GOAL_MS else "NO",
                 r["live_median_ms"], r["live_max_ms"]) for r in rows]))
    result = {"devices": devices, "gangs_recorded": gangs, "repeats": cfg.repeats, "goal_ms": GOAL_MS,
              "routes": rows, "all_under_goal": all(r["max_ms"] < GOAL_MS for r in rows),
              "calls": work.calls}
    write_json(f"{out}/dashboard.json", result)
    return result
