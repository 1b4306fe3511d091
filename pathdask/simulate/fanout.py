"""Fan-out trees (``pathdask.fanout``) on the virtual clock: a call's records down its own hosts, its ending up.

As in the runtime (:mod:`pathdask.core.fanout`), a call of a program on more than
``pathdask.fanout.threshold`` hosts does not get its records from the scheduler on
each host. The scheduler sends them (the call, its order, later its output's release)
to the call's first host, as records for all of the call's hosts. A host that receives
records for ``n`` hosts (itself first) splits the other ``n - 1`` into at most
``pathdask.fanout.degree`` contiguous, near-equal shares (:func:`pathdask.core.fanout.shares`,
which this module calls, so that the model's trees are the runtime's), forwards each
share's records to the share's first host, one child after another, and then takes its
own part. So the tree is made of the call's own hosts, in the call's host order: every
relay is a host of the call, and each host forwards to at most ``degree`` others. Calls
on at most ``threshold`` hosts get no tree: the scheduler sends each host its records
and takes each host's ending, as before.

Costs (:class:`~.model.CostModel`): a relay pays its CPU per child forwarded to
(``relay_forward_s``) before its own part, the call's first host its CPU per tree call
(``relay_root_s``) first, and each forward takes a message's latency. Endings come back up
the same tree: a host reports to its parent once its own part ended and every child
reported, at its CPU per child ending taken (``relay_done_s``); the first host reports
once to the scheduler. So the scheduler sends one call's records and takes one ending
per call (``scheduler_tree_s``), whatever its hosts.

Work is booked on the hosts' processors (:class:`~.clock.Hosts`) when the records leave
the scheduler (down) and when the call's first host ended (up): a little ahead of when
each relay does it, as the model books each dispatch a message's latency ahead.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import dask.config
import numpy as np

from ..core.fanout import DEFAULT_DEGREE, DEFAULT_THRESHOLD, shares
from .clock import Hosts
from .model import CostModel

__all__ = ["Fanout", "Route", "Tree", "route", "tree"]


@dataclass(frozen=True)
class Fanout:
    """The trees' shape: a call on more than ``threshold`` hosts goes down a tree of its
    hosts in which each host forwards to at most ``degree`` others. :meth:`from_config`
    reads ``pathdask.fanout``, as the runtime's scheduler does; :meth:`off` is no tree at all
    (every host sent its records by the scheduler itself)."""

    degree: int = DEFAULT_DEGREE
    threshold: int = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if not (isinstance(self.degree, int) and self.degree >= 1):
            raise ValueError(f"pathdask.fanout.degree must be an integer >= 1, got {self.degree!r}")
        if not (isinstance(self.threshold, int) and self.threshold >= 0):
            raise ValueError(f"pathdask.fanout.threshold must be an integer >= 0, got {self.threshold!r}")

    @classmethod
    def from_config(cls) -> Fanout:
        """The trees of the dask config's ``pathdask.fanout.degree`` and ``.threshold``."""
        return cls(int(dask.config.get("pathdask.fanout.degree", DEFAULT_DEGREE)),
                   int(dask.config.get("pathdask.fanout.threshold", DEFAULT_THRESHOLD)))

    @classmethod
    def off(cls) -> Fanout:
        """No tree for any call (a threshold above any call's hosts)."""
        return cls(threshold=sys.maxsize)

    def fans(self, hosts: int) -> bool:
        """Whether a call on ``hosts`` hosts goes down a tree (``SchedulerCore.fans``)."""
        return hosts > self.threshold


@dataclass(frozen=True)
class Tree:
    """The tree of a call on ``n`` hosts, by position in the call's hosts (0: its first host).

    ``parent``: each position's parent (-1 for the first host); ``rank``: 1 for the first
    child its parent forwards to, 2 for the next, ... (0 for the first host);
    ``children``: how many children each forwards to; ``levels``: the positions at each
    depth, from the first host's level down."""

    parent: np.ndarray
    rank: np.ndarray
    children: np.ndarray
    levels: tuple[np.ndarray, ...]

    @property
    def n(self) -> int:
        return len(self.parent)

    @property
    def depth(self) -> int:
        """Forwards on the longest way from the first host to another."""
        return len(self.levels) - 1


@functools.lru_cache(maxsize=256)
def tree(n: int, degree: int) -> Tree:
    """The tree of a call on ``n`` hosts, built as the runtime's hosts build it (``HostCore.fan``):
    the host at position ``p`` receiving records for positions ``p .. p + m - 1`` forwards each
    share of :func:`~pathdask.core.fanout.shares` ``(m, degree)`` to the share's first host."""
    parent = np.full(n, -1, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    children = np.zeros(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    pending = [(0, n)]  # (first position, hosts) of each record still to split
    while pending:
        first, m = pending.pop()
        for i, (a, b) in enumerate(shares(m, degree), start=1):
            child = first + a
            parent[child], rank[child], depth[child] = first, i, depth[first] + 1
            children[first] += 1
            pending.append((child, b - a))
    levels = tuple(np.nonzero(depth == d)[0] for d in range(int(depth.max()) + 1 if n else 0))
    for array in (parent, rank, children, *levels):
        array.setflags(write=False)
    return Tree(parent, rank, children, levels)


@dataclass(frozen=True)
class Route:
    """How a call's records reach its hosts (``hosts``: global host indices, in the call's
    order), and its endings the scheduler, down and up its :class:`Tree`."""

    tree: Tree
    hosts: np.ndarray

    @property
    def path_hosts(self) -> int:
        """The hosts on the longest way from the first host down (the depth, plus 1)."""
        return self.tree.depth + 1

    def relay_cpu(self, costs: CostModel) -> tuple[float, float]:
        """The hosts' CPU per call as relays (their children's records and endings, and the
        first host's per tree call): in all, and on the busiest host."""
        own = self.tree.children * (costs.relay_forward_s + costs.relay_done_s)
        own[0] += costs.relay_root_s
        return float(own.sum()), float(own.max())

    def descend(self, hosts: Hosts, sent: float, own_s: np.ndarray, costs: CostModel,
                forward_s: float | None = None) -> np.ndarray:
        """Records that reach the first host at ``sent`` go down the tree; each host forwards
        them to its children, one after another (``forward_s`` each, by default
        ``relay_forward_s``; the first host ``relay_root_s`` before), then spends ``own_s``
        (per position) on its own part. Returns, per position, when it is done."""
        t, fwd = self.tree, costs.relay_forward_s if forward_s is None else forward_s
        done = np.zeros(t.n)
        began = np.zeros(t.n)  # when each host began forwarding
        for d, level in enumerate(t.levels):
            arrive = (np.full(1, sent) if d == 0
                      else began[t.parent[level]] + t.rank[level] * fwd + costs.message_s)
            seconds = t.children[level] * fwd
            if d == 0:
                seconds = seconds + (costs.relay_root_s if forward_s is None else 0.0)
            end = arrive.copy()
            busy = seconds > 0
            end[busy] = hosts.book(self.hosts[level[busy]], arrive[busy], seconds[busy])
            began[level] = end - t.children[level] * fwd
            done[level] = hosts.book(self.hosts[level], end, own_s[level])
        return done

    def ascend(self, hosts: Hosts, ends: np.ndarray, report_s: float, costs: CostModel) -> float:
        """The endings go up the tree: each host ended its own part at ``ends`` (per position);
        once its children reported too, it spends ``report_s`` and ``relay_done_s`` per child,
        and reports up a message later. Returns when the scheduler has the first host's report."""
        t = self.tree
        reported = np.zeros(t.n)
        for level in reversed(t.levels):
            ready = ends[level].astype(float)
            kids = t.children[level]
            if kids.any():  # every child reported (a message after it sent)
                below = np.full(t.n, -np.inf)
                np.maximum.at(below, t.parent[t.parent >= 0], reported[t.parent >= 0] + costs.message_s)
                ready = np.maximum(ready, below[level])
            seconds = kids * costs.relay_done_s + report_s
            out = ready.copy()
            busy = seconds > 0
            out[busy] = hosts.book(self.hosts[level[busy]], ready[busy], seconds[busy])
            reported[level] = out
        return float(reported[0]) + costs.message_s


def route(hosts: np.ndarray, fanout: Fanout) -> Route | None:
    """The tree a call on ``hosts`` (global host indices, in the call's order) goes down, or
    ``None`` where it has none (the scheduler sends to each host itself)."""
    if not fanout.fans(len(hosts)):
        return None
    return Route(tree(len(hosts), fanout.degree), np.asarray(hosts, dtype=np.int64))
