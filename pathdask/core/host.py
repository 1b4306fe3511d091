"""``HostCore``: the control logic of one host, as a state machine with no I/O.

Events go in: the scheduler's records (:class:`~pathdask.protocol.Order`,
:class:`~pathdask.protocol.Dispatch`, :class:`~pathdask.protocol.DropPrograms`,
:class:`~pathdask.protocol.DropClient`, :class:`~pathdask.protocol.ReleaseOutputs`),
a client's plans, a dispatch task of sequential dispatch, a device popping a
program (:meth:`HostCore.device_done`) and the host closing. Instructions come
out, for :class:`~pathdask.worker.runtime.HostRuntime` to carry out in order:
devices to enqueue or wake, buffers to declare or release, programs to drop in
the store and mailbox, records to tell the scheduler.

It covers plans, calls, slots, dispatch, endings, drops, buffer lifetimes (the
reads a program declares and withdraws, the outputs its Dask keys own) and lost
peers. The invariant it keeps: a program slotted here is popped once by each of
its local devices, run or skipped, and then ends here (``Ended``), whatever
happened to it; a program that is not slotted here and is dropped withdraws
every read it declared.

Threads: every method runs on the worker's event loop, except
:meth:`device_done`, which device threads call; it touches only the
:class:`~pathdask.core.ledger.Ledger`, which locks itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..errors import DeviceLostError, DispatchError, GangAbortedError
from ..ops import BufferKey, HostPlan, KernelOp, ReshardOp, as_key
from ..protocol import (
    Dispatch,
    DispatchFailed,
    DropClient,
    DropPrograms,
    Fan,
    HostJoined,
    HostLost,
    Message,
    Order,
    ProgramDone,
    Released,
    ReleaseOutputs,
    SubtreeDone,
)
from .bounded import remember
from .fanout import Endings, shares
from .ledger import Aborts, HostProgram, Ledger
from .plans import PlanCache

__all__ = ["HostCore", "PutHandles", "Enqueue", "Wake", "Declare", "Release", "DropBuffers", "Ended",
           "Tell", "Relay", "MarkLost", "MarkJoined", "Register", "HandOverLater", "Raise", "Instruction"]


# -- instructions -----------------------------------------------------------------------------
class PutHandles(NamedTuple):
    """Put output keys' handles in the worker's data, as one Dask event."""
    data: dict[Any, tuple[str, int]]
    stimulus: str


class Enqueue(NamedTuple):
    """``pid`` takes the next place in ``device``'s order; ``runs``: it is dispatched here, so
    that the device may run it now (the runtime then hands it the GIL, ``tuning.hand_over``)."""
    device: int
    pid: str
    runs: bool = False


class Wake(NamedTuple):
    """``devices`` look at their heads again (a program became ready, or was dropped); ``runs``:
    the program that became ready has its place in their orders, so that they may run it now."""
    devices: tuple[int, ...]
    runs: bool = False


class Declare(NamedTuple):
    """The store counts ``consumers`` more reads of a buffer, and its owner if ``owned``."""
    key: BufferKey
    device: int
    owned: bool
    consumers: int
    client: str


class Release(NamedTuple):
    """The store drops ``consumers`` pending reads of a buffer, or its owner (``consumers`` 0)."""
    key: BufferKey
    device: int
    consumers: int


class DropBuffers(NamedTuple):
    """``pid`` is dropped: its gangs abort (mailbox, sequential gates) and its buffers fail; then
    the ledger learns it (``Ledger.buffers_failed``), and only then may its devices pass it."""
    pid: str
    cause: BaseException


class Ended(NamedTuple):
    """``pid`` ended on this host: the scheduler learns it, waiters on it wake."""
    pid: str


class Tell(NamedTuple):
    """Send a record to the scheduler."""
    msg: Message


class Relay(NamedTuple):
    """Send a record to host ``host`` on the peers' channel (a fan-out tree's)."""
    host: str
    msg: Message


class MarkLost(NamedTuple):
    """Send host ``host`` nothing more."""
    host: str


class MarkJoined(NamedTuple):
    """Host ``host`` joined (or restarted): its transport listens at ``transport``."""
    host: str
    transport: str | None


class Register(NamedTuple):
    """The program's reads and owners are declared: call :meth:`HostCore.register` now.

    Its own step, carried out after the instructions before it: once in the ledger, a
    device thread may run it at once, so its buffers' counts must be in the store first.
    """
    prog: HostProgram
    enqueue: bool


class HandOverLater(NamedTuple):
    """Test-only jitter: call :meth:`HostCore.hand_over` for ``pid`` a little later."""
    pid: str


class Raise(NamedTuple):
    """The event failed with ``error`` after the instructions before this one (a dispatch task)."""
    error: BaseException


Instruction = (PutHandles | Enqueue | Wake | Declare | Release | DropBuffers | Ended | Tell | Relay | MarkLost
               | MarkJoined | Register | HandOverLater | Raise)


class HostCore:
    """One host's programs, plans and output ownership. See the module docstring.

    Parameters
    ----------
    address : str
        This host's worker address (plans name their members by it).
    devices : iterable of int
        The ids of this host's devices.
    ordering : bool
        Whether devices wait for the scheduler's order; without it (test-only), a
        program takes its place in arrival order.
    jitter : bool
        Test-only: registrations are handed to the devices later (``HandOverLater``).
    aborts : Aborts
        Where gangs of registered programs learn they were aborted (the mailbox).
    """

    def __init__(self, address: str, devices: Iterable[int], aborts: Aborts, *, ordering: bool = True,
                 jitter: bool = False) -> None:
        self.address = address
        self.devices = tuple(devices)
        self.aborts = aborts
        self.ordering = ordering
        self.jitter = jitter
        self.ledger = Ledger()
        self.plans = PlanCache(address)
        #: (program, output index) -> (value id, device) pairs its Dask key owns here
        self.owned: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        #: output keys the scheduler forgot before their program registered here
        self.released_early: OrderedDict[tuple[str, int], None] = OrderedDict()
        #: registrations held back by the test-only jitter: pid -> (program, enqueue)
        self._held: dict[str, tuple[HostProgram, bool]] = {}
        #: the slot of the last program that took its place here (-1: none yet)
        self.last_slot = -1
        #: orders that came before the one slotted before them here: prev -> entry
        self.early_orders: dict[int, tuple[str, str, list[int], int, int]] = {}
        #: tree programs whose ending has not gone up yet
        self.endings = Endings()
        #: programs this host registered itself (``run_alone``, a multi-controller's), until they end
        self.own: set[str] = set()
        #: hosts the scheduler said left (a tree that holds one will not report up)
        self.lost_hosts: set[str] = set()
        #: programs dropped because a host of theirs left: the scheduler ended them, so their
        #: endings do not go up a tree (which may be cut)
        self.cut: OrderedDict[str, None] = OrderedDict()
        self._handlers: dict[type[Message], Any] = {
            Order: lambda m: self.order(m.programs),
            Fan: self.fan,
            SubtreeDone: lambda m: self._report(m.pid),
            Dispatch: lambda m: self.calls(m.client, m.calls),
            DropPrograms: lambda m: self.drop_programs(m.pids, m.reason, m.host, m.cause),
            DropClient: lambda m: self.drop_client(m.client),
            ReleaseOutputs: lambda m: self.release_outputs(m.outputs),
            HostLost: lambda m: self.host_lost(m.host),
            HostJoined: self.host_joined,
        }

    def handle(self, msg: Message) -> list[Instruction]:
        """The instructions for one record from the scheduler."""
        out: list[Instruction] = self._handlers[type(msg)](msg)
        return out

    # -- arrivals ---------------------------------------------------------------------------
    def add_plans(self, client: str, plans: list[HostPlan]) -> int:
        """A client's new plans, sent before the calls that name them."""
        self.plans.add(client, plans)
        return len(plans)

    def order(self, programs: list[tuple[str, str, list[int], int, int]]) -> list[Instruction]:
        """These programs take the next places in these devices' orders, in slot order: each
        once the program slotted before it here did (``prev``), whatever order they come in.
        One that came before is ignored."""
        out: list[Instruction] = []
        for entry in programs:
            slot, prev = entry[3], entry[4]
            if self._ordered_already(slot, prev):
                continue  # it came before (ordered again after a relay was lost)
            if prev != self.last_slot:
                self.early_orders[prev] = entry
                continue
            out += self._slot(entry)
            while self.last_slot in self.early_orders:
                out += self._slot(self.early_orders.pop(self.last_slot))
        return out

    def _ordered_already(self, slot: int, prev: int) -> bool:
        """Whether the order of slot ``slot`` (after ``prev``) came here before: it took its
        place, or waits for the one before it."""
        return slot <= self.last_slot or prev in self.early_orders

    def _slot(self, entry: tuple[str, str, list[int], int, int]) -> list[Instruction]:
        pid, client, devices, slot, _prev = entry
        self.last_slot = slot
        if not self.ledger.slot(pid, client, devices):
            return [Ended(pid)]  # dropped before its slot came: nothing to run here
        runs = self.ledger.ready(pid)
        return [Enqueue(d, pid, runs) for d in devices]

    def fan(self, msg: Fan) -> list[Instruction]:
        """A fan-out tree's record: the children's shares go on first, then this host's part: its
        order, then its call, as the scheduler's records come where it sends them directly, so
        that the call's registration finds its place taken and its devices run it at once. A call
        whose plan is not here (no devices to order) goes first: it fails, and its order then
        finds it dropped and ends it."""
        hosts, call, order = msg.hosts, msg.call, msg.order
        out: list[Instruction] = []
        children = 0
        for a, b in shares(len(hosts), msg.degree):
            children += 1
            out.append(Relay(hosts[a], Fan(hosts[a:b], self.address, msg.degree,
                                           call=None if call is None else _call_share(call, a, b),
                                           order=None if order is None else _order_share(order, a, b),
                                           release=msg.release)))
        devices: list[int] = []
        if order is not None and order[3] is not None:
            devices = order[3][0]
        elif order is not None and call is not None:  # the devices of the plan its call names
            plan = self.plans.peek(order[1], call[3])
            devices = list(plan.ops) if plan is not None else []  # none: the call fails, dropped
        if call is not None and not devices:
            out += self._fan_call(call)
        if order is not None:
            out += self._fan_order(order, devices, msg.parent, children, hosts)
        if call is not None and devices:
            out += self._fan_call(call)
        if msg.release is not None:
            ack, outputs = msg.release
            out += self.release_outputs(outputs)
            if self._reports(hosts):
                self.endings.start(ack, msg.parent, children, hosts, release=True)
                out += self._report(ack)
        return out

    def _fan_call(self, call: tuple[Any, ...]) -> list[Instruction]:
        client, pid, inputs, plan_id, owned = call
        outputs: list[tuple[Any, int]] = next((o for i, o in owned if i == 0), [])
        return self.calls(client, [(pid, plan_id, inputs, outputs)])

    def _fan_order(self, order: tuple[Any, ...], devices: list[int], parent: str | None, children: int,
                   hosts: list[str]) -> list[Instruction]:
        pid, client, slot, _each, prevs = order
        prev = prevs if isinstance(prevs, int) else prevs[0]
        if not self._ordered_already(slot, prev) and pid not in self.cut and self._reports(hosts):
            self.endings.start(pid, parent, children, hosts)  # not ordered here already
        return self.order([(pid, client, devices, slot, prev)])

    def _report(self, pid: str) -> list[Instruction]:
        """One report of a tree program's ending (this host's own, or a child's subtree)."""
        last, parent, release = self.endings.report(pid)
        if not last:
            return []
        if parent is not None:
            return [Relay(parent, SubtreeDone(pid))]
        return [Tell(Released(pid) if release else ProgramDone(pid))]

    def host_lost(self, host: str) -> list[Instruction]:
        """Host ``host`` left: send it nothing more; tree programs whose subtree holds it will
        not report (the scheduler ended them)."""
        self.lost_hosts.add(host)
        self.endings.forget_host(host)
        return [MarkLost(host)]

    def host_joined(self, msg: HostJoined) -> list[Instruction]:
        self.lost_hosts.discard(msg.host)
        return [MarkJoined(msg.host, msg.transport)]

    def _reports(self, hosts: list[str]) -> bool:
        """Whether a tree of ``hosts`` can report up (none of them is known to have left)."""
        return not self.lost_hosts or self.lost_hosts.isdisjoint(hosts)

    def calls(self, client: str, calls: list[tuple[str, str, list[Any], list[tuple[Any, int]]]]
              ) -> list[Instruction]:
        """Calls reached this host, each ``(pid, plan id, argument keys, output keys owned
        here)``: each call's part is registered (its devices may start), then their keys'
        handles go in the worker's data at once, before anything else this host hears of
        them. A call that fails is dropped here and the scheduler is told."""
        out: list[Instruction] = []
        for pid, plan, inputs, _ in calls:
            done = self.dispatch(pid, plan, tuple((str(p), int(v)) for p, v in inputs), client)
            last = done[-1] if done else None
            if isinstance(last, Raise):
                e = last.error
                done[-1:] = []
                done.append(Tell(DispatchFailed(pid, f"{type(e).__name__}: {e}", e)))
            out += done
        data = {as_key(k): (pid, j) for pid, _, _, outputs in calls for k, j in outputs}
        if data:
            out.append(PutHandles(data, f"pathdask-call-{calls[0][0]}"))
        return out

    def dispatch(self, pid: str, plan: HostPlan | str, inputs: tuple[BufferKey, ...], client: str,
                 gated: bool = False) -> list[Instruction]:
        """Register this host's part of a program (a call, or a dispatch task with its plan).

        ``plan`` is the plan, or the id of one its client sent ahead. A failure drops
        the program here and ends the instructions with ``Raise``.
        """
        if self.ledger.refused(pid, client) is not None:
            self.plans.discard(pid)
            return []  # dropped (or its client closed) before it came: it ended here already
        try:
            if isinstance(plan, str):
                plan = self.plans.get(client, pid, plan)
            if self.address not in {d.address for g in plan.gangs.values() for d in g.members}:
                # Dask recomputes lost keys on a replacement worker; a program cannot follow its host.
                raise DeviceLostError(
                    f"Program {pid} was planned for a host that left the cluster; {self.address} "
                    "replaced it. Call the program again on a new mesh"
                )
        except Exception as e:  # noqa: BLE001 - it ends the instructions
            return [*self.drop_program(pid, e), Raise(e)]
        return self._register(HostProgram(pid, plan, inputs, client, self.aborts,
                                          released=set() if gated else None))

    def run_alone(self, pid: str, plan: HostPlan, inputs: tuple[BufferKey, ...], client: str
                  ) -> list[Instruction]:
        """A multi-controller host registers a program of its own: its devices take it in
        arrival order, with no scheduler and no order message; no scheduler hears of its end."""
        self.own.add(pid)
        return self._register(HostProgram(pid, plan, inputs, client, self.aborts), enqueue=True)

    def _register(self, prog: HostProgram, enqueue: bool = False) -> list[Instruction]:
        """Count the program's reads and owners in the store, then hand it to the devices."""
        out = self._reads(prog, +1)
        for k, pairs in prog.plan.owned.items():
            if self.released_early.pop((prog.pid, k), "kept") is None:
                continue  # its key is gone already: nothing owns these buffers
            out += [Declare((prog.pid, vid), dev, True, 0, prog.client) for vid, dev in pairs]
            self.owned[(prog.pid, k)] = pairs
        enqueue = enqueue or not self.ordering
        if self.jitter:
            self._held[prog.pid] = (prog, enqueue)
            return [*out, HandOverLater(prog.pid)]
        return out + self._hand_over(prog, enqueue)

    def hand_over(self, pid: str) -> list[Instruction]:
        """A registration held back by the jitter goes to the devices now."""
        held = self._held.pop(pid, None)
        return [] if held is None else self._hand_over(*held)

    def _hand_over(self, prog: HostProgram, enqueue: bool) -> list[Instruction]:
        if self.ledger.refused(prog.pid, prog.client) is not None:
            return self._reads(prog, -1)  # dropped while it was held back: it never reads
        return [Register(prog, enqueue)]

    def register(self, prog: HostProgram, enqueue: bool) -> list[Instruction]:
        """``Register``: the program enters the ledger, and its devices may take it."""
        # Drops run on the event loop, as this does, so nothing was dropped since the check.
        slotted = not enqueue or self.ledger.slot(prog.pid, prog.client, list(prog.plan.ops))
        refused = self.ledger.register(prog)
        assert slotted and refused is None, (prog.pid, refused)
        if enqueue:
            return [Enqueue(d, prog.pid, True) for d in prog.plan.ops]
        return [Wake(tuple(prog.plan.ops), self.ledger.slotted(prog.pid))]

    def _reads(self, prog: HostProgram, sign: int) -> list[Instruction]:
        """Declare (+1) or withdraw (-1) the reads the program's ops will make of their inputs."""
        out: list[Instruction] = []
        for dev, ops in prog.plan.ops.items():
            for op in ops:
                refs = op.inputs if isinstance(op, KernelOp) else (
                    (op.input,) if isinstance(op, ReshardOp) and op.input is not None else ())
                for ref in refs:
                    key = prog.resolve(ref)
                    out.append(Declare(key, dev, False, 1, prog.client) if sign > 0 else Release(key, dev, 1))
        return out

    # -- endings ----------------------------------------------------------------------------------
    def device_done(self, pid: str, device: int) -> list[Instruction]:
        """A device popped ``pid`` (device thread); the last one ends it on this host."""
        return [Ended(pid)] if self.ledger.device_done(pid, device) else []

    def ended(self, pid: str) -> list[Instruction]:
        """``pid`` ended here (after ``Ended``): the scheduler learns it, or (a tree program)
        the parent does once every child reported it."""
        if pid in self.endings:
            return self._report(pid)
        if pid in self.own:
            self.own.discard(pid)
            return []
        return [Tell(ProgramDone(pid))]

    def release_outputs(self, outputs: list[tuple[str, int]]) -> list[Instruction]:
        """The scheduler forgot these output keys: their buffers lose their owner.

        One forgotten before its program registered here (its client closed meanwhile)
        is remembered, so that the registration does not take the ownership.
        """
        out: list[Instruction] = []
        for pid, index in outputs:
            pairs = self.owned.pop((pid, index), None)
            if pairs is None:
                remember(self.released_early, (pid, index), None)
                continue
            out += [Release((pid, vid), dev, 0) for vid, dev in pairs]
        return out

    def drop_program(self, pid: str, cause: BaseException) -> list[Instruction]:
        """Drop a program: its gangs abort, its buffers fail, its devices move on.

        A slotted program stays in its devices' order and each device pops it, so it
        still ends here; one that is not slotted here withdraws its reads at once.
        """
        unslotted = self.ledger.drop(pid, cause)
        self.plans.discard(pid)  # a put dropped before its dispatch: its blocks go now
        held = self._held.pop(pid, None)
        out: list[Instruction] = [DropBuffers(pid, cause)]
        for prog in (unslotted, held[0] if held else None):
            if prog is not None:
                out += self._reads(prog, -1)
        return [*out, Wake(self.devices)]

    def drop_programs(self, pids: list[str], reason: str, host: str | None = None,
                      cause: BaseException | None = None) -> list[Instruction]:
        """Programs that can no longer run everywhere (a lost host, a failed dispatch)."""
        out: list[Instruction] = [MarkLost(host)] if host is not None else []
        if not isinstance(cause, BaseException):
            cause = DeviceLostError(reason) if host is not None else DispatchError(reason)
        for pid in pids:
            if host is not None:
                remember(self.cut, pid, None)
                self.endings.forget(pid)
            out += self.drop_program(pid, cause)
        return out

    def drop_client(self, client: str, cause: BaseException | None = None) -> list[Instruction]:
        """Drop every program of a client that went away, and refuse its late ones."""
        cause = cause or GangAbortedError(f"client {client} closed or was lost; its programs were dropped")
        out: list[Instruction] = []
        for pid in self.ledger.close_client(client, cause):
            out += self.drop_program(pid, cause)
        self.plans.drop_client(client)
        return out

    def close(self, cause: BaseException) -> list[Instruction]:
        """The host is shutting down: every program here is dropped."""
        out: list[Instruction] = []
        for pid in self.ledger.pids():
            out += self.drop_program(pid, cause)
        return out


def _call_share(call: tuple[Any, ...], a: int, b: int) -> tuple[Any, ...]:
    """A tree call's record for the subtree of hosts ``[a, b)``: the output keys its hosts own,
    counted from its first."""
    client, pid, inputs, plan_id, owned = call
    return client, pid, inputs, plan_id, [(i - a, o) for i, o in owned if a <= i < b]


def _order_share(order: tuple[Any, ...], a: int, b: int) -> tuple[Any, ...]:
    """A tree order's record for the subtree of hosts ``[a, b)``."""
    pid, client, slot, each, prevs = order
    return (pid, client, slot, None if each is None else each[a:b],
            prevs if isinstance(prevs, int) else prevs[a:b])
