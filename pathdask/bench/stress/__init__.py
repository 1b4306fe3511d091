"""``pathdask bench stress``: many fresh systems, random tenants, random chaos; nothing may hang.

Each run starts a new :class:`~pathdask.LocalSystem` (2 islands x 2 hosts x 2
devices, 64 MiB of HBM each) and draws, from ``random.Random(seed * 1000 + run)``:

- the policy (``fifo`` or ``proportional``) and a dispatch jitter in [0, 3] ms;
- ``pathdask.fanout.threshold``, 1, the default (2) or 4: with 1, every program on two
  hosts or more goes down a fan-out tree of its hosts, with 2 those on three or four
  (meshes across both islands), with 4 none; so the killed worker below may be a relay
  of programs in flight;
- 1 to ``max_clients`` clients, each a thread of this process or a process of its
  own (``pw.connect``), with a weight from (1, 2, 4, 8);
- per client, two meshes of shape ``{a: 1}``, ``{a: 2}``, ``{a: 4}`` or
  ``{a: 2, b: 2}``, on one island or on both; meshes of different clients overlap;
- per client, an in-flight depth from 1 to ``max_depth``, and random programs:
  chains of 1 to ``max_steps`` steps (element-wise kernels, ``psum`` over either
  axis, tiled ``all_gather``, ``ppermute`` shifts, tiled ``all_to_all``, moves to
  the other mesh and changes of partition spec), some reused (cached plans), some
  fed the previous program's still pending output;
- with ``chaos``: clients that ``close()`` mid-stream (threads) or are SIGKILLed
  mid-stream (processes), one host whose next dispatch fails, and, with worker
  processes, one SIGKILLed worker.

Every result is compared with a NumPy reference computed alongside. Programs hit
by chaos may fail, but only with ``DeviceLostError``, ``GangAbortedError``,
``DispatchError`` or ``PlanMissingError``; a client stops at its first such error.

Reported per run: a hang (no client ended a program for ``hang_seconds``, or one
result waited twice that long; then ``system.diagnose()`` is recorded and the run
is abandoned), wrong results (any other exception, a typed error with no chaos
before it, or a mismatch with NumPy), bytes left in the stores once every client
closed, programs checked, and ``stall_end_s``: the longest time from a chaos event
until every program of the surviving clients that was in flight then had ended.

The modules, one concern each: :mod:`.scenario` (the configuration and each
run's random plan), :mod:`.programs` (random programs and their NumPy meaning),
:mod:`.client` (one client's loop, in a thread or a process), :mod:`.state`
(what the clients report), :mod:`.chaos` (the strikes on a host),
:mod:`.harness` (one run on a fresh system) and :mod:`.report` (the runs, their
lines, the summary and ``stress.json``).
"""

from __future__ import annotations

from .chaos import Agent, DispatchFailer, WorkerKiller, bounded
from .client import Call, check, client_body, drive, process_client
from .harness import Run, run_once
from .programs import STEP_KINDS, Chain, Step, random_chain
from .report import ClosedCommFilter, run, summarize
from .scenario import MESH_SHAPES, TYPED, WEIGHTS, ClientPlan, Config, Echo, RunPlan, Sink, plan_run, topology
from .state import RunState, read_reports

__all__ = [
    "MESH_SHAPES", "STEP_KINDS", "TYPED", "WEIGHTS", "Agent", "Call", "Chain", "ClientPlan", "ClosedCommFilter",
    "Config", "DispatchFailer", "Echo", "Run", "RunPlan", "RunState", "Sink", "Step", "WorkerKiller", "bounded",
    "check", "client_body", "drive", "plan_run", "process_client", "random_chain", "read_reports", "run",
    "run_once", "summarize", "topology",
]
