"""Bounded memory of past events (dropped programs, closed gangs, released keys).

A host must remember some endings so that late messages about them are
recognised (a dispatch after its program was dropped, a piece after its gang
ended). It remembers the newest ``REMEMBER`` of each kind, oldest first out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

REMEMBER = 100_000


def remember(memory: OrderedDict[K, V], key: K, value: V, limit: int = REMEMBER) -> None:
    """Record ``key`` (keeping its first value), forgetting the oldest entries past ``limit``."""
    memory.setdefault(key, value)
    while len(memory) > limit:
        memory.popitem(last=False)


def newest(log: deque[V], count: int, cursor: int) -> list[V]:
    """The entries of ``log`` appended after the first ``cursor`` of ``count`` ever appended.

    ``log`` keeps only its newest entries; a ``cursor`` that is not between 0 and
    ``count`` (from a log that was made anew since) reads all that it keeps.
    """
    fresh = count - cursor if 0 <= cursor <= count else count
    n = min(fresh, len(log))
    return list(itertools.islice(log, len(log) - n, None)) if n > 0 else []
