"""One stress run on a fresh system: start its clients, watch them, apply chaos, judge."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import dask

from ...system import LocalSystem
from .chaos import DispatchFailer, WorkerKiller, bounded
from .client import client_body, process_client
from .scenario import ClientPlan, Config, RunPlan, topology
from .state import RunState, read_reports


class Run:
    """One run: start its clients, watch them, apply chaos, and judge what they report."""

    def __init__(self, system: LocalSystem, cfg: Config, plan: RunPlan) -> None:
        self.system, self.cfg, self.plan = system, cfg, plan
        self.state = RunState(len(plan.clients))
        self.t0 = self.state.last_progress  # times in the report are seconds since this
        self.stop = threading.Event()
        # longer than a hang: a result that is slow but ends shows up in stall_end_s, not as a hang
        self.result_timeout = 2 * cfg.hang_seconds
        self.threads: list[threading.Thread] = []
        self.procs: dict[int, Any] = {}
        self.clients: list[Any] = []  # the thread clients, to close them after a hang
        self.killer: WorkerKiller | None = None
        self.failer: DispatchFailer | None = None

    def _thread_client(self, plan: ClientPlan) -> Any:
        c = self.system.client(name=plan.name, weight=plan.weight)
        self.clients.append(c)
        return c

    def start(self) -> None:
        import multiprocessing

        if self.plan.kill_worker_after is not None:
            self.killer = WorkerKiller(self.system, self.plan.kill_worker_after, self.plan.victim, self.state)
        if self.plan.fail_dispatch_after is not None:
            self.failer = DispatchFailer(self.system, self.plan.fail_dispatch_after, self.plan.victim + 1,
                                         self.state)
        ctx = multiprocessing.get_context("spawn")
        for c in self.plan.clients:
            if c.process:
                here, there = ctx.Pipe(duplex=False)
                p = ctx.Process(target=process_client, daemon=True,
                                args=(self.system.scheduler_address, c, there, self.result_timeout))
                p.start()
                there.close()
                self.procs[c.index] = p
                threading.Thread(target=read_reports, args=(here, c.index, self.state), daemon=True).start()
            else:
                t = threading.Thread(target=client_body, daemon=True, args=(
                    functools.partial(self._thread_client, c), c,
                    self.state.sink(c.index), self.stop, self.result_timeout))
                t.start()
                self.threads.append(t)

    def _kill_client(self, index: int) -> None:
        p = self.procs[index]
        with self.state.cond:
            if index in self.state.finished:
                return
            self.state.victims.add(index)
            self.state.finished.add(index)
            self.state.events.append({"t": time.time(), "kind": "kill-client", "client": index})
        os.kill(p.pid, signal.SIGKILL)  # a client process we started, by its PID

    def watch(self) -> str | None:
        """Until every client finished: ``None``; or the reason of a hang."""
        st = self.state
        while True:
            with st.cond:
                st.cond.wait(timeout=0.25)
                requests, st.kill_requests = st.kill_requests, []
                done = len(st.finished) == st.n
                all_started = len(st.started | st.finished) == st.n
                idle, ended, timeouts = time.time() - st.last_progress, st.ended, list(st.timeouts)
            for index in requests:
                self._kill_client(index)
            for agent in (self.killer, self.failer):
                if agent is not None and all_started and not done:
                    agent.maybe_fire(ended)
            if timeouts:
                return f"a result waited more than {self.result_timeout:g}s: {timeouts[0]}"
            if done:
                return None
            if idle > self.cfg.hang_seconds:
                return f"no client ended a program for {idle:.1f}s"

    def abandon(self) -> None:
        """After a hang: stop the threads, kill our client processes, close the clients."""
        self.stop.set()
        for p in self.procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # ours, by its PID
        for c in list(self.clients):
            with contextlib.suppress(Exception):  # best effort; the system closes next
                bounded(c.close, 10)

    def join(self) -> None:
        deadline = time.monotonic() + 15
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        for p in self.procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()  # ours, by its handle
                p.join(5)

    def leftover(self) -> tuple[int, str | None]:
        """Bytes left in the stores once every client closed (and the error, if not idle)."""
        try:
            if self.killer is not None and self.killer.fired:
                self.killer.wait_hosts()
            stats = self.system.wait_idle(timeout="20s")
        except Exception as e:  # noqa: BLE001 - a TimeoutError (or a lost scheduler) is a leftover
            return -1, f"{type(e).__name__}: {e}"
        left = sum(s["bytes_in_use"] for s in stats["devices"].values())
        buffers = sum(s["buffers"] for s in stats["devices"].values())
        return left, (f"{buffers} buffer(s) left" if buffers and not left else None)

    def stall_end(self) -> float | None:
        """Longest time from a chaos event until the programs of surviving clients then in flight ended."""
        st = self.state
        if not st.events:
            return None
        worst = 0.0
        for ev in st.events:
            for r in st.records:
                if r["client"] not in st.victims and r["t0"] <= ev["t"] <= r["t1"]:
                    worst = max(worst, r["t1"] - ev["t"])
        return worst

    def judge(self) -> tuple[list[str], list[str], int]:
        """(wrong results, typed failures, programs checked)."""
        st = self.state
        first_chaos = min((ev["t"] for ev in st.events), default=math.inf)
        wrong, typed = list(st.problems), list[str]()
        for r in st.records:
            where = f"client {r['client']} program {r['k']}: {r['detail']}"
            if r["outcome"] == "wrong":
                wrong.append(where)
            elif r["outcome"] == "typed" and r["t1"] >= first_chaos:
                typed.append(where)
            elif r["outcome"] == "typed":
                wrong.append(f"{where} (a typed error with no chaos before it)")
        return wrong, typed, sum(r["outcome"] in ("ok", "wrong") and r["k"] >= 0 for r in st.records)

    def close(self) -> None:
        for agent in (self.killer, self.failer):
            if agent is not None:
                with contextlib.suppress(Exception):  # best effort
                    bounded(agent.close, 10)


def run_once(cfg: Config, plan: RunPlan, index: int,
             make_system: Callable[[RunPlan], Any] | None = None) -> dict[str, Any]:
    """One fresh system, its clients and chaos; the run's report. ``make_system`` starts another
    kind of system for the plan (a :class:`~pathdask.netns.NetnsSystem`); chaos then needs
    ``cfg.chaos`` off, as it strikes a LocalSystem's workers."""
    start = time.perf_counter()
    if make_system is not None:
        system = make_system(plan)
    else:
        system = LocalSystem(topology(), processes=cfg.processes, dashboard_address=None, policy=plan.policy,
                             dispatch_jitter=plan.jitter)
        with dask.config.set({"pathdask.fanout.threshold": plan.fanout}):
            system.start()
    run = Run(system, cfg, plan)
    diagnosis = None
    try:
        run.start()
        hang = run.watch()
        if hang is not None:
            try:
                diagnosis = str(bounded(system.diagnose, 30))
            except Exception as e:  # noqa: BLE001 - the hang is the finding; this only explains it
                diagnosis = f"(diagnose failed: {type(e).__name__}: {e})"
            run.abandon()
        run.join()
        left, left_error = (0, None) if hang else run.leftover()
    finally:
        run.close()
        with contextlib.suppress(Exception):  # move on to the next fresh system
            bounded(system.close, 60)
    wrong, typed, checked = run.judge()
    return {
        "run": index, "seed": plan.seed, "policy": plan.policy, "dispatch_jitter": plan.jitter,
        "fanout_threshold": plan.fanout,
        "processes": cfg.processes, "clients": [asdict(c) for c in plan.clients],
        "kill_worker_after": plan.kill_worker_after,
        "chaos_events": [{**e, "t": e["t"] - run.t0} for e in run.state.events],
        "hang": hang is not None, "hang_reason": hang, "diagnosis": diagnosis,
        "wrong": wrong, "typed_failures": typed, "programs_checked": checked,
        "programs_ended": run.state.ended, "bytes_left": left, "leftover_error": left_error,
        "stall_end_s": run.stall_end(), "seconds": time.perf_counter() - start,
        "failed_programs": [{**r, "t0": r["t0"] - run.t0, "t1": r["t1"] - run.t0} for r in run.state.records
                            if r["outcome"] != "ok"],
    }
