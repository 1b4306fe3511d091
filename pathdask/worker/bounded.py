"""Bounded memory of past events (dropped programs, closed gangs, released keys).

A host must remember some endings so that late messages about them are
recognised (a dispatch after its program was dropped, a piece after its gang
ended). It remembers the newest ``REMEMBER`` of each kind, oldest first out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

REMEMBER = 100_000


def remember(memory: OrderedDict[K, V], key: K, value: V, limit: int = REMEMBER) -> None:
    """Record ``key`` (keeping its first value), forgetting the oldest entries past ``limit``."""
    memory.setdefault(key, value)
    while len(memory) > limit:
        memory.popitem(last=False)
