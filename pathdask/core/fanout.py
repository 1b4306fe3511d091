"""Fan-out trees: how one record reaches many hosts, and how their endings come back as one.

A call on many hosts would cost the scheduler one message, one key and one
ending per host. Above ``pathdask.fanout.threshold`` hosts it costs one of
each instead: the scheduler sends a :class:`~pathdask.protocol.Fan` record to
the call's first host, which takes its own part and forwards the rest to at
most ``pathdask.fanout.degree`` children, each the first host of an equal,
contiguous share of the others; they do the same. So a record carries only its
subtree's parts, each host forwards to at most ``degree`` others, and a call's
records reach ``n`` hosts in about ``log_degree(n)`` hops.

Endings go back up the same tree (:class:`Endings`): a host reports a program
to its parent once the program ended here and every child reported it; the
first host reports it to the scheduler. So the scheduler takes one ending per
program.

The tree is the call's own hosts, so a relay always takes part in the programs
it forwards: a lost relay fails exactly the programs that use it (their other
hosts learn it from the scheduler directly), and strands no other program's
records. Records that reach one host along different trees may come out of
order; the host puts programs in slot order by their chain (``Order``'s
``prev``), not by arrival.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["shares", "Endings", "DEFAULT_DEGREE", "DEFAULT_THRESHOLD"]

DEFAULT_DEGREE = 4
#: above this many hosts a program goes down a tree: measured (``pathdask bench dispatch --hosts``,
#: one run, 2 cores) on 4 hosts, a tree's call cost the scheduler 54-58 us, four direct
#: records 77-106 us, and a waiting all-reduce's round trip was the same either way
#: (5.2-5.5 ms in threads mode, 3.9-4.3 ms with processes); on 2 hosts direct costs ~73 us
DEFAULT_THRESHOLD = 2


def shares(n: int, degree: int) -> Iterator[tuple[int, int]]:
    """The ``[start, stop)`` positions of the children's subtrees of a record for ``n`` hosts
    (the receiver is position 0): at most ``degree`` contiguous, near-equal shares of 1..n-1."""
    rest = n - 1
    if rest <= 0:
        return
    k = min(degree, rest)
    size, extra = divmod(rest, k)
    start = 1
    for i in range(k):
        stop = start + size + (i < extra)
        yield start, stop
        start = stop


class Endings:
    """A host's tree programs that have not reported their ending up yet.

    ``start`` when the program's order arrives; ``report`` once for its own ending and once
    per child's; the last report answers where the ending goes (the parent's address, or
    ``None`` for the scheduler).
    """

    def __init__(self) -> None:
        #: id -> [parent address or None, reports still due, hosts of this subtree, a release?]
        self.waiting: dict[str, list[Any]] = {}

    def start(self, pid: str, parent: str | None, children: int, hosts: list[str], release: bool = False) -> None:
        self.waiting[pid] = [parent, 1 + children, hosts, release]

    def __contains__(self, pid: str) -> bool:
        return pid in self.waiting

    def report(self, pid: str) -> tuple[bool, str | None, bool]:
        """One report of ``pid``; ``(True, parent, release?)`` when it is the last (``(False,
        None, False)`` if more are due or ``pid`` is not waited for)."""
        entry = self.waiting.get(pid)
        if entry is None:
            return False, None, False
        entry[1] -= 1
        if entry[1] > 0:
            return False, None, False
        del self.waiting[pid]
        return True, entry[0], entry[3]

    def forget_host(self, host: str) -> None:
        """``host`` left: programs whose subtree holds it will not report (the scheduler
        ended them already); forget them."""
        for pid in [pid for pid, entry in self.waiting.items() if host in entry[2]]:
            del self.waiting[pid]

    def forget(self, pid: str) -> None:
        self.waiting.pop(pid, None)
