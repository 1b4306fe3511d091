"""What a stress run randomises: the configuration, and each run's plan of clients and chaos."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import DeviceLostError, DispatchError, GangAbortedError, PlanMissingError
from ...core.fanout import DEFAULT_THRESHOLD
from ...topology import Topology

Echo = Callable[[str], Any]
Sink = Callable[..., None]

TYPED = (DeviceLostError, GangAbortedError, DispatchError, PlanMissingError)
MESH_SHAPES: tuple[dict[str, int], ...] = ({"a": 1}, {"a": 2}, {"a": 4}, {"a": 2, "b": 2})
WEIGHTS = (1.0, 2.0, 4.0, 8.0)


def topology() -> Topology:
    """The stress topology: 8 devices in 2 islands of 4."""
    return Topology(islands=2, hosts_per_island=2, devices_per_host=2, hbm=64 * 2**20)  # 64 MiB


@dataclass
class Config:
    """What ``pathdask bench stress`` randomises, and how far.

    Parameters
    ----------
    runs : int
        Fresh systems, one after another.
    seed : int
        Run ``r`` draws everything from ``random.Random(seed * 1000 + r)``.
    processes : bool
        Worker processes (and then worker kills) or all hosts in this process.
    hang_seconds : float
        No program ended for this long (or one result waited twice this long): a hang.
    min_clients, max_clients, programs_per_client, max_depth, max_steps : int
        Bounds of the random clients, their programs, in-flight depth and steps.
    chaos : bool
        Close or SIGKILL clients mid-stream, and kill a worker (with ``processes``).
    process_clients : float
        Chance that a client runs in a process of its own.
    process_client_budget : int or None
        At most this many process clients over all runs (``None``: no limit).
    client_chaos : float
        Chance, per thread client, that it closes itself mid-stream.
    process_kill : float
        Chance, per process client, that it is SIGKILLed mid-stream.
    worker_kill : float
        Chance, per run with ``processes``, that one worker process is SIGKILLed.
    dispatch_fail : float
        Chance, per run, that one host's next dispatch fails mid-stream.
    """

    runs: int = 20
    seed: int = 0
    processes: bool = False
    hang_seconds: float = 30.0
    min_clients: int = 1
    max_clients: int = 8
    programs_per_client: int = 24
    max_depth: int = 16
    max_steps: int = 4
    chaos: bool = True
    process_clients: float = 0.25
    process_client_budget: int | None = None
    client_chaos: float = 0.25
    process_kill: float = 0.5
    worker_kill: float = 0.5
    dispatch_fail: float = 0.3

    @classmethod
    def small(cls) -> Config:
        """CI size: 4 runs of up to 3 thread clients; at most 2 process clients, SIGKILLed."""
        return cls(runs=4, min_clients=2, max_clients=3, programs_per_client=10, max_depth=6,
                   process_clients=0.4, process_client_budget=2, client_chaos=0.3, process_kill=1.0)


@dataclass
class ClientPlan:
    """One client of one run; picklable, so that a process client gets it as it is."""

    index: int
    name: str
    weight: float
    process: bool
    depth: int
    programs: int
    max_steps: int
    seed: int
    shapes: tuple[dict[str, int], ...]
    islands: tuple[int, ...]
    close_after: int | None = None  # a thread client closes itself after submitting this many
    kill_after: int | None = None  # a process client asks to be SIGKILLed after submitting this many


@dataclass
class RunPlan:
    seed: int
    policy: str
    jitter: float
    clients: list[ClientPlan]
    kill_worker_after: int | None = None  # SIGKILL a worker once this many programs ended (and all started)
    victim: int = 0  # which worker, as an index into the sorted worker addresses
    fail_dispatch_after: int | None = None  # one host's next dispatch fails once this many ended
    #: ``pathdask.fanout.threshold``: 1 sends every program on two hosts or more down a fan-out
    #: tree (so a killed worker may be a relay), the default (2) those on 3 or 4 hosts, 4 none
    fanout: int = DEFAULT_THRESHOLD


def plan_run(cfg: Config, run: int, budget: list[int | None]) -> RunPlan:
    """Everything random about run ``run``; ``budget[0]`` counts process clients still allowed."""
    rng = random.Random(cfg.seed * 1000 + run)
    topo = topology()
    clients = []
    for i in range(rng.randint(min(cfg.min_clients, cfg.max_clients), cfg.max_clients)):
        process = rng.random() < cfg.process_clients and budget[0] != 0
        if process and budget[0] is not None:
            budget[0] -= 1
        programs = rng.randint(max(2, cfg.programs_per_client // 2), cfg.programs_per_client)
        shapes = tuple(dict(rng.choice(MESH_SHAPES)) for _ in range(2))
        island = rng.randrange(topo.islands)
        islands = (island, island if rng.random() < 0.5 else rng.randrange(topo.islands))
        plan = ClientPlan(i, f"stress-{'p' if process else 't'}{i}", rng.choice(WEIGHTS), process,
                          rng.randint(1, cfg.max_depth), programs, cfg.max_steps, rng.randrange(2**32),
                          shapes, islands)
        if cfg.chaos and rng.random() < (cfg.process_kill if process else cfg.client_chaos):
            at = rng.randint(max(1, programs // 3), programs - 1)  # mid-stream, after some results
            if process:
                plan.kill_after = at
            else:
                plan.close_after = at
        clients.append(plan)
    kill = None
    if cfg.chaos and cfg.processes and rng.random() < cfg.worker_kill:
        kill = rng.randint(1, max(1, sum(c.programs for c in clients) // 2))
    fail = None
    if cfg.chaos and rng.random() < cfg.dispatch_fail:
        fail = rng.randint(1, max(1, sum(c.programs for c in clients) // 2))
    return RunPlan(cfg.seed * 1000 + run, rng.choice(["fifo", "proportional"]), rng.uniform(0, 0.003),
                   clients, kill, rng.randrange(topo.num_hosts), fail, rng.choice([1, DEFAULT_THRESHOLD, 4]))
