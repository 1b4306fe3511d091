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
from collections import OrderedDict
from collections.abc import Container, Iterable
from itertools import repeat
from typing import Any, NamedTuple

from ..errors import DeviceLostError, DispatchError
from ..ops import as_key
from ..protocol import DropClient, DropPrograms, Fan, HostJoined, HostLost, Message, Order, ReleaseOutputs
from .bounded import remember
from .fanout import DEFAULT_DEGREE, DEFAULT_THRESHOLD
from .meshes import Mesh, Meshes
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
    """Every key a call creates (one per program output, on the host that owns it)."""
    return [as_key(k) for k, _j, _owner in call["outputs"]]


class Output(NamedTuple):
    """What an output key owns: output ``output`` of ``pid`` on ``hosts``, its key held by ``owner``."""
    pid: str
    output: int
    owner: str
    hosts: Any  # a collection of host addresses (the program's own, shared, not copied)
    client: str


class SchedulerCore:
    """Programs, hosts and clients as the scheduler plugin sees them. See the module docstring.

    Parameters
    ----------
    policy : str
        The slotting policy's name (``fifo``, ``proportional``).
    ordering : bool
        Test-only switch: ``False`` sends no order messages.
    degree, threshold : int
        Fan-out trees (:mod:`~pathdask.core.fanout`): a program on more than ``threshold``
        hosts reaches them through a tree of this ``degree``.
    """

    def __init__(self, policy: str = "fifo", *, ordering: bool = True, degree: int = DEFAULT_DEGREE,
                 threshold: int = DEFAULT_THRESHOLD) -> None:
        self.order = IslandScheduler(policy, on_end=self._ended)
        self.ordering = ordering
        self.degree, self.threshold = degree, threshold
        self.hosts: set[str] = set()
        #: counts the changes of ``hosts``: a mesh whose hosts were all live at the current
        #: epoch still has them all (``Mesh.live_at``)
        self.epoch = 0
        #: the hosts of the calls taken in, kept once per plan (``core/meshes.py``)
        self.meshes = Meshes()
        #: client id -> weight under proportional share
        self.clients: dict[str, float] = {}
        #: output key -> what it owns
        self.output_owners: dict[Any, Output] = {}
        #: output keys forgotten because their owner host left: the other hosts keep their
        #: shards (a client may recover them) until the client lets go of the key
        self.orphans: dict[Any, Output] = {}
        #: program -> the programs not yet ended that read its outputs
        self.readers: dict[str, list[Submission]] = {}
        #: programs dropped before their slot -> (reason, cause): a program that reads their
        #: outputs and comes later is dropped as it comes (``submit``)
        self.unslotted: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        #: host -> the run of programs it last took part in (whose last slot is the next
        #: one's ``prev`` there)
        self.host_runs: dict[str, _Run] = {}
        #: a run's hosts, in its programs' order -> the run, while each of them still last took
        #: part in it: the next program on exactly those hosts has one ``prev`` for all
        self.runs: dict[Any, _Run] = {}
        #: tree program ordered, its first host's report not yet in -> (program, slot, its
        #: ``prev``: one for every host, or one per host): if a host of it is lost, it is
        #: ordered again directly on the others
        self.chains: dict[str, tuple[Submission, int, int | list[int]]] = {}
        #: tree release sent, not yet reported carried out -> (its hosts, what it releases),
        #: sent again directly if a host of its tree is lost
        self.releasing: dict[str, tuple[list[str], list[tuple[str, int]]]] = {}
        self._releases = 0
        #: calls that reached their hosts through a fan-out tree
        self.fanned = 0

    # -- hosts --------------------------------------------------------------------------------
    def host_joined(self, host: str, transport: str | None) -> list[Instruction]:
        """A host registered: the others learn where its transport listens."""
        self.hosts.add(host)
        self.epoch += 1
        self._leave_run(host)  # a fresh runtime starts its chain again
        return [SendAll(HostJoined(host, transport), but=host)]

    def host_leaving(self) -> None:
        """Dask is removing a host (a retiring one stays in the order until its clients
        suspended): every call checks its hosts against Dask's again."""
        self.epoch += 1

    def host_failed(self, host: str) -> None:
        """``host``'s runtime failed to start: it is no host of any program."""
        self.hosts.discard(host)
        self.epoch += 1

    def host_lost(self, host: str, describe: str, *, failing: bool = True) -> list[Instruction]:
        """Host ``host`` left: its peers stop sending to it, and the programs that use it
        (``failing``: the system runs on) are dropped on their other hosts."""
        if host not in self.hosts:
            return []
        self.hosts.discard(host)
        self.epoch += 1
        self._leave_run(host)
        out: list[Instruction] = [SendAll(HostLost(host))]
        affected = [s for s in self.order.inflight.values() if host in s.hosts]
        # a tree program's ending comes up its tree, through hosts that may be cut off: it
        # leaves the order now, and each of its other hosts is ordered it again directly (a
        # relay may have held the order), where it ends at once, dropped
        # first: no waiting program that uses the host may take a slot freed below
        waiting, slotted = self.order.host_lost(host)
        affected += waiting
        trees = [c for c in self.chains.values() if host in c[0].hosts]
        for sub, *_ in trees:
            del self.chains[sub.pid]
            if sub.pid not in self.order.inflight:
                affected.append(sub)  # its client closed: it left the order, but may not have reached its hosts
        slotted += [t for sub, *_ in trees for t in self.order.finish(sub.pid)]
        out += [i for ack, (hosts, _) in list(self.releasing.items()) if host in hosts
                for i in self._release_to(*self.releasing.pop(ack), direct=True)]
        reason = f"host {host} ({describe}) left the cluster while this program used it"
        for sub in waiting:
            remember(self.unslotted, sub.pid, (reason, DeviceLostError(reason)))
        if affected and failing:
            logger.warning("pathdask: %s; failing %d program(s)", reason, len(affected))
            per_host: dict[str, list[str]] = {}
            for s in affected:
                for addr in s.hosts:
                    per_host.setdefault(addr, []).append(s.pid)
            out += [Send(addr, DropPrograms(pids, reason, host)) for addr, pids in per_host.items()
                    if addr != host]
        else:
            logger.info("pathdask: host %s left; its devices are gone", host)
        out += self._reorder(trees, but=host)
        return out + self._orders(slotted)

    # -- clients ------------------------------------------------------------------------------
    def client_joined(self, client: str, weight: float) -> None:
        self.clients[client] = weight

    def client_closed(self, client: str) -> list[Instruction]:
        """A client left: its waiting programs go, its slotted ones end; hosts drop its work."""
        if self.clients.pop(client, None) is None:
            return []
        orphans = [k for k, o in self.orphans.items() if o.client == client]
        return [*self._orders(self.order.drop_client(client)), SendAll(DropClient(client)),
                *self.keys_released(orphans)]

    # -- intake -------------------------------------------------------------------------------
    def check_call(self, call: dict[str, Any], workers: Container[str]) -> Mesh:
        """Raise ``DeviceLostError`` if a host of ``call`` has left (``workers``: Dask's live ones);
        returns its mesh. A mesh whose hosts were all live since the last change of hosts is
        not looked at again."""
        mesh = self._mesh(call)
        if mesh.live_at == self.epoch:
            return mesh
        hosts = call["hosts"]
        if not (self.hosts.issuperset(hosts) and all(map(workers.__contains__, hosts))):
            gone = sorted(a for a in hosts if a not in self.hosts or a not in workers)
            raise DeviceLostError(f"host(s) {gone} left the cluster before program {call['pid']} "
                                  "was called; call it again on a new mesh")
        mesh.live_at = self.epoch
        return mesh

    def _mesh(self, call: dict[str, Any]) -> Mesh:
        return self.meshes.of(call["plan"], call["hosts"], call["program"]["hosts"])

    def fans(self, hosts: Any) -> bool:
        """Whether a program on ``hosts`` reaches them through a fan-out tree."""
        return len(hosts) > self.threshold

    def take_call(self, client: str, call: dict[str, Any], mesh: Mesh | None = None) -> list[Instruction]:
        """A checked call whose keys exist: forward its parts (to each host, or down its tree,
        untouched, with its order when it is slotted at once) and slot it. ``mesh``: what
        :meth:`check_call` returned for it (found again if not given)."""
        pid, hosts, plan, owned = call["pid"], call["hosts"], call["plan"], call["owned"]
        mesh = mesh if mesh is not None else self._mesh(call)
        info = {**call["program"], "hosts": mesh.devices, "shared": True,
                "outputs": [(k, owner, j) for k, j, owner in call["outputs"]],
                "deps": sorted({producer for producer, _ in call["inputs"]})}
        if not self.fans(hosts):
            outputs = dict(owned)
            return [*(Forward(addr, (pid, plan, call["inputs"], outputs.get(i, []))) for i, addr in enumerate(hosts)),
                    *self.submit(client, info, mesh=mesh)]
        self.fanned += 1
        carried = (client, pid, call["inputs"], plan, owned)
        out = self.submit(client, info, carried, mesh)
        if pid not in self.chains:  # not ordered now (its order's Fan would carry the call): it goes alone
            out.insert(0, Send(hosts[0], Fan(hosts, None, self.degree, call=carried)))
        return out

    def submit(self, client: str, info: dict[str, Any], carried: tuple[Any, ...] | None = None,
               mesh: Mesh | None = None) -> list[Instruction]:
        """Slot a program from its ``pathdask`` annotation (``client/lowering.py``); with
        ``shared``, each output's key owns its shards on every host of the program (a call),
        else only on the host holding the key (a graph's per-host keys). ``carried``: a tree
        call's record, which goes in its order's ``Fan`` if it is slotted now; ``mesh``: a
        call's hosts as its plan's calls share them (``info["hosts"]`` is its ``devices``)."""
        pid, hosts = info["pid"], info["hosts"]
        shared = info.get("shared", False)
        for key, addr, j in info["outputs"]:
            self.output_owners[as_key(key)] = Output(pid, j, addr, hosts if shared else (addr,), client)
        deps = frozenset(info.get("deps", ()))
        sub = Submission(pid, client, hosts, info.get("cost", 0.0), deps,
                         (next(iter(hosts)),) if self.ordering and self.fans(hosts) else None, mesh)
        for producer in deps:
            self.readers.setdefault(producer, []).append(sub)
        if not hosts:  # nothing to run anywhere: it ends at once
            self._ended(sub)
            return [Progress()]
        if not self._live(sub):  # planned for a host that has left since: it fails
            gone = [a for a in hosts if a not in self.hosts]  # at once, on every live host
            self._ended(sub)
            reason = f"host(s) {sorted(gone)} left the cluster before this program was slotted"
            remember(self.unslotted, pid, (reason, DeviceLostError(reason)))
            return [Send(a, DropPrograms([pid], reason, min(gone))) for a in hosts if a not in gone]
        producer = next((p for p in deps if p in self.unslotted), None) if self.unslotted else None
        if producer is not None:  # it reads what will never be computed
            self._ended(sub)
            why, cause = self.unslotted[producer]
            return self._drop_unslotted([sub], f"program {producer}, whose outputs it reads, was dropped: {why}",
                                        cause)
        return self._orders(self.order.submit(sub, self.clients.get(client, 1.0)), carried)

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
        remember(self.unslotted, pid, (reason, cause))
        return out + _drops(pid, call["hosts"], reason, cause)

    # -- endings ------------------------------------------------------------------------------
    def program_done(self, host: str, pid: str) -> list[Instruction]:
        """A host ran its part of ``pid`` (a tree's first host: every host of the tree did)."""
        self.chains.pop(pid, None)
        return self._orders(self.order.host_done(pid, host))

    def released_on_tree(self, ack: str) -> None:
        """Tree release ``ack`` was carried out on every host of its tree."""
        self.releasing.pop(ack, None)

    def dispatch_failed(self, host: str, pid: str, error: str, cause: Any) -> list[Instruction]:
        """A host could not register its part of ``pid``: it is dropped everywhere, with ``cause``."""
        return self.end_program(pid, f"the dispatch of program {pid} failed on host {host}: {error}", cause)

    def end_program(self, pid: str, reason: str, cause: Any) -> list[Instruction]:
        """Take ``pid`` out of the order and drop it on every host it uses, with ``cause``;
        no instructions if the order does not hold it (it ended already, or never came)."""
        subs = self.order.fail(pid)
        if not subs:
            return []
        logger.info("pathdask: %s; dropping it on %s", reason, sorted(subs[0].hosts))
        if pid in self.order.inflight:  # slotted: its hosts pop it, and the programs after it
            return _drops(pid, subs[0].hosts, reason, cause)
        return self._drop_unslotted(subs, reason, cause)

    def _drop_unslotted(self, subs: list[Submission], reason: str, cause: Any) -> list[Instruction]:
        """Drop programs that left before their slot on their hosts, and remember them: a
        program that reads their outputs is dropped with them, waiting (``IslandScheduler``) or
        as it comes (:meth:`submit`). Slotted, it would follow none of their orders (they have
        none), and its own could reach a host down a tree before their drop: its devices would
        read their buffers pending instead of failed."""
        out: list[Instruction] = []
        for sub in subs:
            why = reason if sub is subs[0] else f"{reason}; program {sub.pid} reads its outputs"
            remember(self.unslotted, sub.pid, (why, cause))
            out += _drops(sub.pid, sub.hosts, why, cause)
        return out

    def _ended(self, sub: Submission) -> None:
        """``sub`` left the order: it reads nothing more."""
        for producer in sub.deps:
            readers = self.readers.get(producer)
            if readers is not None:
                readers.remove(sub)
                if not readers:
                    del self.readers[producer]

    def key_forgotten(self, key: Any, owner_left: bool = False) -> list[Instruction]:
        """The scheduler forgot an output key: its hosts free the buffers it owned, behind the
        dispatches of the programs that read them (:meth:`_release`). ``owner_left``: forgotten
        because the host holding the key left; the other hosts keep their shards until the
        client lets go of the key."""
        out = self.output_owners.pop(key, None)
        if out is None:
            return []
        if owner_left and len(out.hosts) > 1:
            self.orphans[key] = out
            return []
        return self._release(out)

    def keys_released(self, keys: Iterable[Any]) -> list[Instruction]:
        """A client let go of keys: those whose owner host left free their other shards."""
        out: list[Instruction] = []
        for key in keys:
            orphan = self.orphans.pop(key, None)
            if orphan is not None:
                out += self._release(orphan)
        return out

    def _release(self, out: Output) -> list[Instruction]:
        """Free output ``out``'s buffers on its live hosts (with Dask's next message: nothing waits).

        A release must not overtake the dispatch of a program that reads the output, which
        went to each of its hosts along its own path (a tree, or the scheduler's stream to
        each): to those hosts the release takes the same path, behind it; to the output's
        other hosts, its own program's.
        """
        outputs = [(out.pid, out.output)]
        instructions: list[Instruction] = []
        covered: set[str] = set()
        whole = False  # a reader on the output's own hosts covers them all
        for reader in self.readers.get(out.pid, ()):
            hosts = _order_of(reader)
            instructions += self._release_to(hosts, outputs, direct=not self._live(reader))
            if reader.hosts is out.hosts:
                whole = True
            else:
                covered.update(hosts)
        if whole or covered.issuperset(out.hosts):  # read by the next call on its mesh, say
            return instructions
        rest = [a for a in out.hosts if a not in covered]
        if rest:
            instructions += self._release_to(rest, outputs, direct=not self.hosts.issuperset(rest))
        return instructions

    def _live(self, sub: Submission) -> bool:
        """Whether every host of ``sub`` is live (a call's mesh checked at this epoch is)."""
        return (sub.mesh is not None and sub.mesh.live_at == self.epoch) or self.hosts.issuperset(sub.hosts)

    def _release_to(self, hosts: list[str], outputs: list[tuple[str, int]], direct: bool = False
                    ) -> list[Instruction]:
        """``outputs`` go on ``hosts`` (the live ones): down a tree of them, kept until its first
        host reports it carried out, or ``direct``ly to each."""
        if self.fans(hosts) and not direct:
            self._releases += 1
            ack = f"release-{self._releases}"
            self.releasing[ack] = (hosts, outputs)
            return [Send(hosts[0], Fan(hosts, None, self.degree, release=(ack, outputs)), now=False)]
        return [Send(a, ReleaseOutputs(outputs), now=False) for a in hosts if a in self.hosts]

    # -- orders -------------------------------------------------------------------------------
    def _chain(self, sub: Submission, slot: int) -> int | list[int]:
        """The ``prev`` of ``sub`` on its hosts: one slot, if it is the same on each (the
        program before it there ran on exactly its hosts, as call after call on one mesh
        does: found in one lookup, whatever the hosts), else one per host, in their order.
        ``slot`` becomes their last."""
        key = sub.mesh.key if sub.mesh is not None else tuple(sub.hosts)
        run = self.runs.get(key)
        if run is not None:
            prev, run.last = run.last, slot
            return prev
        host_runs = self.host_runs
        prevs = [r.last if (r := host_runs.get(h)) is not None else -1 for h in key]
        self.runs[key] = run = _Run(key, slot)
        for h in key:
            self._leave_run(h)
            host_runs[h] = run
        first = prevs[0]
        return first if prevs.count(first) == len(prevs) else prevs

    def _leave_run(self, host: str) -> None:
        """``host`` takes part in another run (or none): its old run is no longer whole."""
        old = self.host_runs.pop(host, None)
        if old is not None and self.runs.get(old.key) is old:
            del self.runs[old.key]

    def _orders(self, slotted: Iterable[tuple[int, Submission]], carried: tuple[Any, ...] | None = None
                ) -> list[Instruction]:
        """Tell each host of each newly slotted program where it goes in its devices' order;
        a tree program's order goes with ``carried``, its call's record, if that is its call
        (then each host takes its devices from the plan the call names)."""
        out: list[Instruction] = [Progress()]
        if not self.ordering:
            return out
        per_host: dict[str, list[tuple[str, str, list[int], int, int]]] = {}
        for slot, sub in slotted:
            prevs = self._chain(sub, slot)
            if sub.ends is not None:
                self.chains[sub.pid] = (sub, slot, prevs)
                call = carried if carried is not None and carried[1] == sub.pid else None
                each = None if call is not None else list(sub.hosts.values())
                out.append(Send(sub.ends[0], Fan(_order_of(sub), None, self.degree, call=call,
                                                 order=(sub.pid, sub.client, slot, each, prevs))))
                continue
            for (addr, devices), prev in zip(sub.hosts.items(), _each(prevs)):
                per_host.setdefault(addr, []).append((sub.pid, sub.client, devices, slot, prev))
        return out + [Send(addr, Order(programs)) for addr, programs in per_host.items()]

    def _reorder(self, trees: list[tuple[Submission, int, int | list[int]]], but: str) -> list[Instruction]:
        """Order tree programs again, ``(program, slot, prevs)``, on each of their hosts but
        ``but``, directly (after their drop)."""
        out: list[Instruction] = []
        for sub, slot, prevs in trees:
            out += [Send(a, Order([(sub.pid, sub.client, devices, slot, prev)]))
                    for (a, devices), prev in zip(sub.hosts.items(), _each(prevs)) if a != but]
        return out


def _drops(pid: str, hosts: Iterable[str], reason: str, cause: Any) -> list[Instruction]:
    """``pid`` dropped on each of ``hosts``, with ``cause``."""
    return [Send(addr, DropPrograms([pid], reason, cause=cause)) for addr in hosts]


def _order_of(sub: Submission) -> list[str]:
    """``sub``'s hosts in order: for a call, its mesh's one list (never changed)."""
    return sub.mesh.order if sub.mesh is not None else list(sub.hosts)


class _Run:
    """Programs ordered one after another on the same hosts: ``key``, those hosts in order
    (a tuple, or a mesh's ``HostsKey``, equal to it); ``last``, the slot of the last of them."""

    __slots__ = ("key", "last")

    def __init__(self, key: Any, last: int) -> None:
        self.key, self.last = key, last


def _each(prevs: int | list[int]) -> Iterable[int]:
    """A ``prev`` per host: the list itself, or the one slot repeated."""
    return repeat(prevs) if isinstance(prevs, int) else prevs
