"""The hosts of a call, kept once per plan: nothing per call grows with a mesh's hosts.

Every call of a plan (``client/calls.py``) names the same hosts, in the same order,
with the same devices on each: the plan id names them. Building those collections
anew for every call, checking each host is live, hashing them to find the run of
programs on exactly those hosts, and freeing them when the program ends, made the
scheduler's work per call grow with the hosts (a few tens of nanoseconds per host
and step, measured with ``pathdask bench dispatch --hosts``: 2 to 32 hosts added
10-16 us per call). So the scheduler core keeps a :class:`Mesh` per plan id
(:class:`Meshes`), which every call of the plan shares: its hosts are checked live
once per change of membership (``live_at``), its run key is hashed once, and the
tree records of its calls carry its one list of hosts.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakValueDictionary

__all__ = ["HostsKey", "Mesh", "Meshes", "MESHES_KEPT"]

#: meshes the scheduler keeps (one per plan id): the oldest made goes first beyond this
MESHES_KEPT = 4096


class HostsKey:
    """A program's hosts in order, hashed once: the key of the run of programs on exactly
    those hosts. Equal to (and hashed as) the tuple of the hosts, which other programs'
    runs are keyed by."""

    __slots__ = ("hosts", "_hash", "__weakref__")

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.hosts = hosts
        self._hash = hash(hosts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, HostsKey):
            return self._hash == other._hash and self.hosts == other.hosts
        return isinstance(other, tuple) and self.hosts == other

    def __iter__(self) -> Any:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __repr__(self) -> str:
        return f"HostsKey({self.hosts!r})"


class Mesh:
    """The hosts a plan runs on, shared by every call of it.

    ``order``: its hosts in the call's order (the list its tree records carry; never
    changed); ``devices``: host -> the devices the plan uses there; ``key``: its
    :class:`HostsKey`; ``live_at``: the membership epoch at which every host of it was
    last seen live (``-1``: never).
    """

    __slots__ = ("order", "devices", "key", "live_at")

    def __init__(self, order: list[str], devices: dict[str, list[int]], key: HostsKey) -> None:
        self.order, self.devices, self.key = order, devices, key
        self.live_at = -1


class Meshes:
    """The meshes of the calls taken in, by plan id (at most :data:`MESHES_KEPT`)."""

    def __init__(self, kept: int = MESHES_KEPT) -> None:
        self.kept = kept
        self._by_plan: dict[str, Mesh] = {}
        #: one key per distinct list of hosts, while a mesh or a run holds it
        self._keys: WeakValueDictionary[tuple[str, ...], HostsKey] = WeakValueDictionary()

    def of(self, plan: str, hosts: list[str], devices: dict[str, list[int]]) -> Mesh:
        """The mesh of plan ``plan``, made from this call's ``hosts`` and ``devices`` if new."""
        mesh = self._by_plan.get(plan)
        if mesh is not None and len(mesh.order) == len(hosts) and mesh.order[:1] == hosts[:1]:
            return mesh
        order = tuple(hosts)
        key = self._keys.get(order)
        if key is None:
            key = self._keys[order] = HostsKey(order)
        mesh = self._by_plan[plan] = Mesh(list(hosts), devices, key)
        while len(self._by_plan) > self.kept:
            del self._by_plan[next(iter(self._by_plan))]
        return mesh

    def __len__(self) -> int:
        return len(self._by_plan)
