"""``SchedulerCore``: the control logic of the scheduler plugin, as a state machine with no I/O.

Events go in: hosts joining and leaving, clients joining and closing, program
calls and graph submissions, programs ending on a host, failed dispatches,
forgotten output keys. Instructions come out, for
:class:`~pathdask.scheduler.plugin.PathwaysScheduler` to carry out in order:
records to send to hosts, a call's part to forward to a host, keys to fail.

It covers intake (calls and graph annotations), slotting (by the
:class:`~pathdask.core.order.IslandScheduler` and its policy), program ends,
lost hosts and closed clients. The invariant it keeps with the hosts: every
slotted program is named in an ``Order`` to each of its hosts, and leaves the
order only once each of them reported it ended (or was lost); a program that
can no longer run is dropped on every host it uses.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable
from typing import Any, NamedTuple

from ..errors import DeviceLostError, DispatchError
from ..ops import as_key
from ..protocol import DropClient, DropPrograms, HostJoined, HostLost, Message, Order, ReleaseOutputs
from .order import IslandScheduler, Submission

__all__ = ["SchedulerCore", "Send", "SendAll", "Forward", "FailKeys", "Progress", "Instruction", "call_keys"]

logger = logging.getLogger("pathdask.scheduler")


class Send(NamedTuple):
    """Send ``msg`` to host ``host``; at once unless ``now`` is false (then with Dask's next)."""
    host: str
    msg: Message
    now: bool = True


class SendAll(NamedTuple):
    """Send ``msg`` to every live host but ``but``."""
    msg: Message
    but: str | None = None


class Forward(NamedTuple):
    """Host ``host``'s part of a call, ``(pid, plan id, inputs, outputs)``, for its next ``Dispatch``."""
    host: str
    entry: tuple[Any, ...]


class FailKeys(NamedTuple):
    """The call of ``pid``'s keys go again, and ``client``'s futures of them err with ``error``."""
    pid: str
    client: str
    keys: list[Any]
    error: BaseException


class Progress(NamedTuple):
    """The order changed (programs slotted or ended): waiters on it look again."""


Instruction = Send | SendAll | Forward | FailKeys | Progress


def call_keys(call: dict[str, Any]) -> list[Any]:
    """Every key a call creates."""
    return [as_key(k) for _addr, _plan, outs in call["hosts"] for k, _ in outs]


class SchedulerCore:
    """Programs, hosts and clients as the scheduler plugin sees them. See the module docstring.

    Parameters
    ----------
    policy : str
        The slotting policy's name (``fifo``, ``proportional``).
    ordering : bool
        Test-only switch: ``False`` sends no order messages.
    """

    def __init__(self, policy: str = "fifo", *, ordering: bool = True) -> None:
        self.order = IslandScheduler(policy)
        self.ordering = ordering
        self.hosts: set[str] = set()
        #: client id -> weight under proportional share
        self.clients: dict[str, float] = {}
        #: output key -> (address of the host it owns buffers on, program, output index)
        self.output_owners: dict[Any, tuple[str, str, int]] = {}

    # -- hosts --------------------------------------------------------------------------------
    def host_joined(self, host: str, transport: str | None) -> list[Instruction]:
        """A host registered: the others learn where its transport listens."""
        self.hosts.add(host)
        return [SendAll(HostJoined(host, transport), but=host)]

    def host_lost(self, host: str, describe: str, *, failing: bool = True) -> list[Instruction]:
        """Host ``host`` left: its peers stop sending to it, and the programs that use it
        (``failing``: the system runs on) are dropped on their other hosts."""
        if host not in self.hosts:
            return []
        self.hosts.discard(host)
        out: list[Instruction] = [SendAll(HostLost(host))]
        affected = [s for s in self.order.inflight.values() if host in s.hosts]
        waiting, slotted = self.order.host_lost(host)
        affected += waiting
        if affected and failing:
            reason = f"host {host} ({describe}) left the cluster while this program used it"
            logger.warning("pathdask: %s; failing %d program(s)", reason, len(affected))
            per_host: dict[str, list[str]] = {}
            for s in affected:
                for addr in s.hosts:
                    per_host.setdefault(addr, []).append(s.pid)
            out += [Send(addr, DropPrograms(pids, reason, host)) for addr, pids in per_host.items()
                    if addr != host]
        else:
            logger.info("pathdask: host %s left; its devices are gone", host)
        return out + self._orders(slotted)

    # -- clients ------------------------------------------------------------------------------
    def client_joined(self, client: str, weight: float) -> None:
        self.clients[client] = weight

    def client_closed(self, client: str) -> list[Instruction]:
        """A client left: its waiting programs go, its slotted ones end; hosts drop its work."""
        if self.clients.pop(client, None) is None:
            return []
        return [*self._orders(self.order.drop_client(client)), SendAll(DropClient(client))]

    # -- intake -------------------------------------------------------------------------------
    def check_call(self, call: dict[str, Any], workers: Container[str]) -> None:
        """Raise ``DeviceLostError`` if a host of ``call`` has left (``workers``: Dask's live ones)."""
        gone = sorted(addr for addr, *_ in call["hosts"] if addr not in self.hosts or addr not in workers)
        if gone:
            raise DeviceLostError(f"host(s) {gone} left the cluster before program {call['pid']} was "
                                  "called; call it again on a new mesh")

    def take_call(self, client: str, call: dict[str, Any]) -> list[Instruction]:
        """A checked call whose keys exist: forward its parts and slot it."""
        out: list[Instruction] = [Forward(addr, (call["pid"], plan, call["inputs"], outputs))
                                  for addr, plan, outputs in call["hosts"]]
        return out + self.submit(client, {
            **call["program"],
            "outputs": [(k, addr, j) for addr, _plan, outs in call["hosts"] for k, j in outs],
            "deps": sorted({producer for producer, _ in call["inputs"]})})

    def submit(self, client: str, info: dict[str, Any]) -> list[Instruction]:
        """Slot a program from its ``pathdask`` annotation (``client/lowering.py``)."""
        for key, addr, j in info["outputs"]:
            self.output_owners[as_key(key)] = (addr, info["pid"], j)
        sub = Submission(info["pid"], client, info["hosts"], info.get("cost", 0.0),
                         frozenset(info.get("deps", ())))
        gone = sorted(set(sub.hosts) - self.hosts)
        if gone:  # planned for a host that has left since: it fails at once, on every live host
            reason = f"host(s) {gone} left the cluster before this program was slotted"
            return [Send(a, DropPrograms([sub.pid], reason, gone[0])) for a in sub.hosts if a not in gone]
        return self._orders(self.order.submit(sub, self.clients.get(client, 1.0)))

    def call_failed(self, client: str, call: dict[str, Any], error: BaseException) -> list[Instruction]:
        """A call could not be made: its keys err for the client, its program is dropped."""
        pid = call["pid"]
        keys = call_keys(call)
        for key in keys:
            self.output_owners.pop(key, None)
        reason = f"the call of program {pid} failed in the scheduler: {type(error).__name__}: {error}"
        cause = error if isinstance(error, DeviceLostError) else DispatchError(reason)
        out: list[Instruction] = [FailKeys(pid, client, keys, error)]
        ended = self.end_program(pid, reason, cause)
        if ended:
            return out + ended
        return out + [Send(addr, DropPrograms([pid], reason, cause=cause)) for addr, *_ in call["hosts"]]

    # -- endings ------------------------------------------------------------------------------
    def program_done(self, host: str, pid: str) -> list[Instruction]:
        """A host ran its part of ``pid``."""
        return self._orders(self.order.host_done(pid, host))

    def dispatch_failed(self, host: str, pid: str, error: str, cause: Any) -> list[Instruction]:
        """A host could not register its part of ``pid``: it is dropped everywhere, with ``cause``."""
        return self.end_program(pid, f"the dispatch of program {pid} failed on host {host}: {error}", cause)

    def end_program(self, pid: str, reason: str, cause: Any) -> list[Instruction]:
        """Take ``pid`` out of the order and drop it on every host it uses, with ``cause``;
        no instructions if the order does not hold it (it ended already, or never came)."""
        sub = self.order.fail(pid)
        if sub is None:
            return []
        logger.info("pathdask: %s; dropping it on %s", reason, sorted(sub.hosts))
        return [Send(addr, DropPrograms([pid], reason, cause=cause)) for addr in sub.hosts]

    def key_forgotten(self, key: Any) -> list[Instruction]:
        """The scheduler forgot an output key: its host frees the buffers it owned (with Dask's
        next message: nothing waits for it)."""
        owner = self.output_owners.pop(key, None)
        if owner is None:
            return []
        addr, pid, index = owner
        return [Send(addr, ReleaseOutputs([(pid, index)]), now=False)]

    def _orders(self, slotted: Iterable[tuple[int, Submission]]) -> list[Instruction]:
        """Tell each host of each newly slotted program where it goes in its devices' order."""
        out: list[Instruction] = [Progress()]
        if not self.ordering:
            return out
        per_host: dict[str, list[tuple[str, str, list[int]]]] = {}
        for _slot, sub in slotted:
            for addr, devices in sub.hosts.items():
                per_host.setdefault(addr, []).append((sub.pid, sub.client, devices))
        return out + [Send(addr, Order(programs)) for addr, programs in per_host.items()]
