"""The relay tree (``pathdask.fanout``) on the virtual clock: a call's records down, its ending up.

In an island of more than ``pathdask.fanout.threshold`` hosts the scheduler does not
send a call's records to each of its hosts. It sends one record (the call's dispatch
with its order, or later an order alone) to the root of the island's relay tree: a
``pathdask.fanout.degree``-ary tree over the island's hosts in topology order, in heap
layout (the children of position ``i`` are ``k*i+1 .. k*i+k``). Each relay forwards the
record to those of its children whose subtree holds a host of the call, one child after
another, each at the relay's CPU per child (:attr:`~.model.CostModel.relay_forward_s`)
and one message's latency; a relay the call does not use also pays for reading the
record (``host_dispatch_s``). A host of the call registers its own part as without the
tree, once it has forwarded the record.

Endings come back up the same tree: a host reports the program's end to its parent once
its own part ended and every child subtree the call uses reported, at its CPU per child
ending taken (:attr:`~.model.CostModel.relay_done_s`); the root reports once to the
scheduler. So the scheduler sends one record and takes one ending per island and call,
whatever the number of hosts. Islands of at most ``threshold`` hosts get no tree: the
scheduler sends each host its records and takes each host's ending, as before.

Work is booked on the hosts' processors (:class:`~.clock.Hosts`) when the record leaves the
scheduler (down) and when the call's first host ended (up): a little ahead of when each
relay does it, as the model books each dispatch a message's latency ahead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import dask.config
import numpy as np

from ..topology import Topology
from .clock import Hosts
from .model import CostModel

__all__ = ["Fanout", "Level", "Route", "levels", "route"]


@dataclass(frozen=True)
class Fanout:
    """The relay tree's shape: ``degree`` children per relay, in islands of more than
    ``threshold`` hosts. :meth:`from_config` reads ``pathdask.fanout``; :meth:`off` is no
    tree at all (every host sent its records by the scheduler itself)."""

    degree: int = 4
    threshold: int = 8

    def __post_init__(self) -> None:
        if not (isinstance(self.degree, int) and self.degree >= 2):
            raise ValueError(f"pathdask.fanout.degree must be an integer >= 2, got {self.degree!r}")
        if not (isinstance(self.threshold, int) and self.threshold >= 0):
            raise ValueError(f"pathdask.fanout.threshold must be an integer >= 0, got {self.threshold!r}")

    @classmethod
    def from_config(cls) -> Fanout:
        """The tree of the dask config's ``pathdask.fanout.degree`` and ``.threshold``."""
        return cls(int(dask.config.get("pathdask.fanout.degree", 4)),
                   int(dask.config.get("pathdask.fanout.threshold", 8)))

    @classmethod
    def off(cls) -> Fanout:
        """No relay tree in any island (a threshold above any island's hosts)."""
        return cls(threshold=sys.maxsize)

    def tree_for(self, island_hosts: int) -> bool:
        """Whether an island of ``island_hosts`` hosts sends records through its relay tree."""
        return island_hosts > self.threshold


@dataclass(frozen=True)
class Level:
    """The hosts at one depth of a call's part of a relay tree (the root's level has one).

    ``hosts``: their global host indices, in topology order; ``parent``: each one's
    parent's entry in the level above (0 on the root's level); ``rank``: 1 for the first
    child its parent forwards to, 2 for the next, ...; ``children``: how many children each
    forwards to; ``own``: each one's entry in the call's hosts (``Schedule.hosts``), or -1
    for a relay that the call does not use."""

    hosts: np.ndarray
    parent: np.ndarray
    rank: np.ndarray
    children: np.ndarray
    own: np.ndarray


def levels(positions: Sequence[int], degree: int, first: int = 0,
           entries: Sequence[int] | None = None) -> tuple[Level, ...]:
    """The part of an island's relay tree that a call on the hosts at ``positions`` (in the
    island, topology order) uses: every host on the way from the root to one of them.
    ``first``: the island's first global host index; ``entries``: each position's entry in
    the call's hosts (default: its place in ``positions``)."""
    own = dict(zip((int(p) for p in positions), range(len(positions)) if entries is None else entries))
    used = set(own)
    for p in list(own):
        while p > 0 and (p := (p - 1) // degree) not in used:
            used.add(p)
    depth: dict[int, int] = {}
    for p in sorted(used):  # a parent's position is below its children's
        depth[p] = 0 if p == 0 else depth[(p - 1) // degree] + 1
    by_depth: list[list[int]] = [[] for _ in range(max(depth.values()) + 1)]
    for p in sorted(used):
        by_depth[depth[p]].append(p)
    parents: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    for d, ps in enumerate(by_depth):
        if d == 0:
            parents.append(np.zeros(1, dtype=np.int64))
            ranks.append(np.ones(1, dtype=np.int64))
            continue
        parent = np.searchsorted(np.array(by_depth[d - 1]), (np.array(ps) - 1) // degree).astype(np.int64)
        # a parent's children are adjacent in the level: each one's rank is its place among them
        ranks.append(np.arange(len(ps), dtype=np.int64) - np.searchsorted(parent, parent, side="left") + 1)
        parents.append(parent)
    out = []
    for d, ps in enumerate(by_depth):
        below = parents[d + 1] if d + 1 < len(by_depth) else np.zeros(0, dtype=np.int64)
        out.append(Level(first + np.array(ps, dtype=np.int64), parents[d], ranks[d],
                         np.bincount(below, minlength=len(ps)).astype(np.int64),
                         np.array([own.get(p, -1) for p in ps], dtype=np.int64)))
    return tuple(out)


@dataclass(frozen=True)
class Route:
    """How a call's records reach its hosts, and its endings the scheduler, through the relay
    trees of the islands it uses (:func:`route`)."""

    trees: tuple[tuple[Level, ...], ...]  # one per island, each its levels from the root down
    n_hosts: int

    @property
    def messages(self) -> int:
        """Records the scheduler sends per record of the call, and endings it takes: one per tree."""
        return len(self.trees)

    @property
    def path_hosts(self) -> int:
        """The hosts on the longest way from a root to a host of the call (the depth, plus 1)."""
        return max(len(t) for t in self.trees)

    def relay_cpu(self, costs: CostModel) -> tuple[float, float]:
        """The relays' CPU per call for its records and its ending: in all, and on the busiest relay."""
        per_child = costs.relay_forward_s + costs.relay_done_s
        total = busiest = 0.0
        for tree in self.trees:
            for lv in tree:
                own = np.where(lv.own < 0, costs.host_dispatch_s, 0.0) + lv.children * per_child
                total += float(own.sum())
                busiest = max(busiest, float(own.max()))
        return total, busiest

    def descend(self, hosts: Hosts, sent: float, own_s: np.ndarray, costs: CostModel) -> np.ndarray:
        """A record that reaches each root at ``sent`` goes down the trees; each host of the call
        then spends ``own_s`` (per entry of the call's hosts) on its part. Returns, per entry,
        when it is done."""
        done = np.zeros(self.n_hosts)
        fwd = costs.relay_forward_s
        for tree in self.trees:
            arrive = np.array([sent])
            first = np.zeros(1)  # when each relay of the level above began forwarding
            for d, lv in enumerate(tree):
                if d:
                    arrive = first[lv.parent] + lv.rank * fwd + costs.message_s
                read = np.where(lv.own < 0, costs.host_dispatch_s, 0.0)  # a relay only: it reads the record
                seconds = read + lv.children * fwd
                end = arrive.copy()
                busy = seconds > 0
                end[busy] = hosts.book(lv.hosts[busy], arrive[busy], seconds[busy])
                first = end - lv.children * fwd
                mine = lv.own >= 0
                done[lv.own[mine]] = hosts.book(lv.hosts[mine], end[mine], own_s[lv.own[mine]])
        return done

    def ascend(self, hosts: Hosts, ends: np.ndarray, report_s: float, costs: CostModel) -> float:
        """The endings go up the trees: each host of the call ended its part at ``ends`` (per
        entry of the call's hosts), and each host that reports spends ``report_s`` and its relay
        CPU per child ending taken. Returns when the scheduler has the last root's report."""
        told = -np.inf
        for tree in self.trees:
            reported = np.zeros(0)
            for d in range(len(tree) - 1, -1, -1):
                lv = tree[d]
                ready = np.full(len(lv.hosts), -np.inf)
                mine = lv.own >= 0
                ready[mine] = ends[lv.own[mine]]
                if d + 1 < len(tree):  # every child subtree the call uses reported
                    np.maximum.at(ready, tree[d + 1].parent, reported + costs.message_s)
                seconds = lv.children * costs.relay_done_s + report_s
                reported = ready.copy()
                busy = seconds > 0
                reported[busy] = hosts.book(lv.hosts[busy], ready[busy], seconds[busy])
            told = max(told, float(reported[0]) + costs.message_s)
        return float(told)


def route(hosts: np.ndarray, topology: Topology, fanout: Fanout) -> Route | None:
    """The relay trees a call on ``hosts`` (global host indices, sorted) goes through, or
    ``None`` where its islands have no tree (the scheduler sends to each host itself)."""
    per_island = topology.hosts_per_island
    if not fanout.tree_for(per_island):
        return None
    islands = hosts // per_island
    trees = []
    for island in np.unique(islands):
        entries = np.nonzero(islands == island)[0]
        first = int(island) * per_island
        trees.append(levels((hosts[entries] - first).tolist(), fanout.degree, first, entries.tolist()))
    return Route(tuple(trees), len(hosts))
