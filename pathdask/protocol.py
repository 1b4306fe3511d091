"""Every message between clients, the scheduler plugin and hosts, as a typed record.

One record per message. Its docstring says what the receiver must do; its
:class:`Route` says who sends it, who receives it, and on which channel:

- ``STREAM``: a Dask batched stream (client → scheduler, scheduler → host,
  host → scheduler), one-way and in order. Every pathdask record on a stream
  travels as one Dask op, :data:`STREAM_OP`, with its ``kind``; the receiver's
  adapter decodes it (:func:`decode`) and hands it to its handler by type.
- ``RPC``: a Dask handler, called and answered (``await ask(rpc, record)``);
  served by :func:`serve`, which decodes the keyword arguments into the record.
- ``EVENT``: a Dask event on the topic :data:`INTERRUPTION_TOPIC`, which clients subscribe
  to; its fields travel as the event's message.
- ``PEER``: host to host, one way, on the hosts' own sockets (or Dask comms);
  the data plane's three message kinds are :data:`PEER_KINDS`.

No other module spells a message's name. A message that is unknown, sent on the
wrong route or missing fields raises :class:`ProtocolError`, which names the
message and its sender; the adapters log it at error level and answer it (an
RPC's caller gets it raised), never drop it silently.

One call's messages, from ``step(x)`` to its result::

    client ──Calls (STREAM)──▶ scheduler: makes the output keys, slots the program
    scheduler ──Dispatch (STREAM)──▶ each host: registers its part (plan id, inputs)
    scheduler ──Order (STREAM)──▶ each host: the program's place in its devices' order
    host ◀─PEER xfer/chunk/abort─▶ host: pieces of collectives and moves
    host ──ProgramDone (STREAM)──▶ scheduler: its part ended (the next program may take a slot)

    on more than ``pathdask.fanout.threshold`` hosts, Dispatch and Order go as one ``Fan`` each:
    scheduler ──Fan (STREAM)──▶ first host ──Fan (PEER)──▶ its children ──▶ ...
    ... ──SubtreeDone (PEER)──▶ parent ──▶ first host ──ProgramDone (STREAM)──▶ scheduler
    client ──Fetch (RPC or socket)──▶ hosts: the output blocks, once computed
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, dataclass_transform

from .errors import ProtocolError

__all__ = [
    "CLIENT", "SCHEDULER", "HOST", "STREAM", "RPC", "PEER", "EVENT", "STREAM_OP", "PROTOCOL_ERROR_TOPIC", "INTERRUPTION_TOPIC", "PEER_STREAM_OP", "PEER_KINDS", "RECORD", "PEER_OPS",
    "Route", "Message", "encode", "decode", "fields_of", "ask", "serve", "stream_handler", "KINDS",
]

CLIENT, SCHEDULER, HOST = "client", "scheduler", "host"
STREAM, RPC, PEER, EVENT = "stream", "rpc", "peer", "event"

#: the one Dask stream op under which every pathdask stream record travels
STREAM_OP = "pathdask"
#: the Dask event topic under which a receiver reports a :class:`ProtocolError` it cannot raise
PROTOCOL_ERROR_TOPIC = "pathdask-protocol-error"
#: the Dask event topic of :class:`HostRetiring`
INTERRUPTION_TOPIC = "pathdask-interruption"
#: the Dask handler that takes a peer's one-way stream (``worker/peers.py``, Dask-comm transport)
PEER_STREAM_OP = "pathdask_peer_stream"
#: the kinds of peer messages: ``("xfer", pieces)``, ``("chunk", meta, nbytes)``, ``("abort", pid, gang, cause)``,
#: ``("record", fields)`` (a control record between hosts, :func:`encode`-d: ``Fan``, ``SubtreeDone``)
XFER, CHUNK, ABORT, RECORD = "xfer", "chunk", "abort", "record"
PEER_KINDS = (XFER, CHUNK, ABORT, RECORD)
#: on the Dask-comm transport, each peer kind is a stream op of the receiving worker
PEER_OPS = {kind: f"pathdask-peer-{kind}" for kind in PEER_KINDS}


class Route(NamedTuple):
    sender: str
    receiver: str
    channel: str


#: kind -> record class, for every record
KINDS: dict[str, type[Message]] = {}


@dataclass(frozen=True, slots=True)
class Message:
    """A protocol record. ``kind`` is its name on the wire; ``op`` is its Dask handler (RPC)."""

    route: ClassVar[Route]
    kind: ClassVar[str]
    op: ClassVar[str]
    names: ClassVar[tuple[str, ...]]


@dataclass_transform(frozen_default=True)
def message(sender: str, receiver: str, channel: str) -> Callable[[type[Any]], type[Any]]:
    """Declare a record: a frozen dataclass with its route, registered by kind."""
    def declare(cls: type[Any]) -> type[Any]:
        cls = dataclass(frozen=True, slots=True)(cls)
        cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
        cls.op = "pathdask_" + cls.kind.replace("-", "_")
        cls.route = Route(sender, receiver, channel)
        cls.names = tuple(f.name for f in dataclasses.fields(cls))
        assert cls.kind not in KINDS, cls.kind
        KINDS[cls.kind] = cls
        return cls
    return declare


def fields_of(msg: Message) -> dict[str, Any]:
    """A record's fields, by name (shallow: payloads are not copied)."""
    return {n: getattr(msg, n) for n in msg.names}


def encode(msg: Message) -> dict[str, Any]:
    """A stream record as the Dask message that carries it."""
    return {"op": STREAM_OP, "kind": msg.kind, **fields_of(msg)}


def decode(fields: Mapping[str, Any], sender: str, receiver: str, kind: str | None = None) -> Message:
    """The record a Dask message (or a handler's keyword arguments) carries.

    ``sender`` names who sent it (a client id, a worker address, ``"scheduler"``) for
    the error; ``receiver`` is the role decoding it. Raises :class:`ProtocolError`.
    """
    values = dict(fields)
    kind = kind if kind is not None else values.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown pathdask message {kind!r} from {sender}; the {receiver} knows "
                            f"{sorted(k for k, c in KINDS.items() if c.route.receiver == receiver)}. "
                            "Check that every part of the cluster runs the same pathdask version")
    if cls.route.receiver != receiver:
        raise ProtocolError(f"pathdask message {kind!r} from {sender} is for the {cls.route.receiver}, "
                            f"not the {receiver}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ProtocolError(f"malformed pathdask message {kind!r} from {sender}: {e}; expected the "
                            f"fields {list(cls.names)}, got {sorted(values)}") from None


def stream_handler(receiver: str, handlers: Mapping[type[Message], Callable[..., Any]],
                   on_error: Callable[[ProtocolError], None]) -> Callable[..., Any]:
    """The Dask stream handler of :data:`STREAM_OP` for ``receiver``: decodes each message and
    calls its handler, with the sending client's id or host's address first where the
    sender is one (Dask's stream adds them as ``client``/``worker``). A coroutine function
    if any handler is one: Dask then awaits it before the stream's next message."""
    def take(kind: str | None, client: str | None, worker: str | None, fields: dict[str, Any]) -> Any:
        sender = client or worker or SCHEDULER
        try:
            msg = decode(fields, sender, receiver, kind)
            handler = handlers.get(type(msg))
            if handler is None:
                raise ProtocolError(f"the {receiver} has no handler for pathdask message {kind!r} from {sender}")
        except ProtocolError as e:
            on_error(e)
            return None
        if msg.route.sender == CLIENT:
            return handler(client, msg)
        if msg.route.sender == HOST:
            return handler(worker, msg)
        return handler(msg)

    # Dask's scheduler adds who sent a stream's messages as ``client=`` or ``worker=``; a
    # worker's streams add nothing (there ``client`` is a record's own field).
    extras = receiver == SCHEDULER

    if any(inspect.iscoroutinefunction(h) for h in handlers.values()):
        async def handle_async(kind: str | None = None, **fields: Any) -> None:
            client, worker = (fields.pop("client", None), fields.pop("worker", None)) if extras else (None, None)
            result = take(kind, client, worker, fields)
            if inspect.isawaitable(result):
                await result
        return handle_async

    def handle(kind: str | None = None, **fields: Any) -> None:
        client, worker = (fields.pop("client", None), fields.pop("worker", None)) if extras else (None, None)
        take(kind, client, worker, fields)
    return handle


async def ask(rpc: Any, msg: Message) -> Any:
    """Send an RPC record to ``rpc`` (a Dask ``rpc``/``PooledRPCCall``) and return its answer."""
    assert msg.route.channel == RPC, msg
    return await getattr(rpc, msg.op)(**fields_of(msg))


def serve(table: dict[str, Any], receiver: str,
          handlers: Mapping[type[Message], Callable[[Any], Any | Awaitable[Any]]]) -> None:
    """Install RPC ``handlers`` (record type -> function of the record) in a Dask
    ``handlers`` table; each decodes its keyword arguments into the record first."""
    for cls, fn in handlers.items():
        assert cls.route == (cls.route.sender, receiver, RPC), cls

        def handler(_cls: type[Message] = cls, _fn: Callable[[Any], Any] = fn, **kw: Any) -> Any:
            return _fn(decode(kw, "an RPC caller", receiver, _cls.kind))
        table[cls.op] = handler


# -- client → scheduler -------------------------------------------------------------------
@message(CLIENT, SCHEDULER, STREAM)
class Calls(Message):
    """Program calls, in the order made (``client/calls.py``). Make each call's output keys
    in memory on their hosts, slot it, and forward it to its hosts (``Dispatch``); a call
    that cannot be made fails alone (its keys err, its program is dropped on its hosts)."""

    calls: list[dict[str, Any]]


@message(CLIENT, SCHEDULER, RPC)
class RegisterClient(Message):
    """A client joins with a name and a weight. Answer the system's info, the hosts'
    socket transports and the token they take."""

    client: str
    name: str
    weight: float = 1.0


@message(CLIENT, SCHEDULER, RPC)
class Info(Message):
    """Answer the topology, live devices, hosts, clients and the order's state."""


@message(CLIENT, SCHEDULER, RPC)
class AllocateMesh(Message):
    """Allocate a virtual slice of ``shape`` in one island; answer ``{"slice", "devices"}``
    or ``{"error"}`` (the user's mistake, typed)."""

    client: str
    shape: dict[str, int]
    island: int | None = None
    hints: dict[str, Any] | None = None


@message(CLIENT, SCHEDULER, RPC)
class ReleaseSlice(Message):
    """A mesh was let go: its devices are free for other slices."""

    slice_id: str


@message(CLIENT, SCHEDULER, RPC)
class TransportOf(Message):
    """Answer where ``host``'s socket transport listens (``None`` if it left)."""

    host: str


@message(CLIENT, SCHEDULER, RPC)
class HostsGone(Message):
    """Answer which of ``hosts`` are no longer in the cluster."""

    hosts: list[str]


@message(CLIENT, SCHEDULER, RPC)
class WaitHosts(Message):
    """Answer once ``n`` hosts (default: all) registered; raise a host's start-up error."""

    n: int | None = None
    timeout: Any = "30s"


@message(CLIENT, SCHEDULER, RPC)
class WaitHostGone(Message):
    """Answer once host ``address`` is not in the cluster."""

    address: str


@message(CLIENT, SCHEDULER, RPC)
class SuspendOnInterruption(Message):
    """The client opts in to suspend when a host it uses leaves on purpose."""

    client: str


@message(CLIENT, SCHEDULER, RPC)
class Suspended(Message):
    """The client finished (or failed) its suspend for leaving host ``host``."""

    client: str
    host: str
    error: Any = None


@message(CLIENT, SCHEDULER, RPC)
class Stats(Message):
    """Answer every host's device, link and NIC statistics, merged."""


@message(CLIENT, SCHEDULER, RPC)
class Diagnose(Message):
    """Answer what every device runs or waits for, and every client's queue."""


@message(CLIENT, SCHEDULER, RPC)
class Transfers(Message):
    """Answer every host's recent modelled transfers, wall-clock."""


@message(CLIENT, SCHEDULER, RPC)
class ResetObservations(Message):
    """Forget recorded gaps, gangs and transfers, here and on every host."""


@message(CLIENT, SCHEDULER, RPC)
class Trace(Message):
    """Answer every recorded gang, once the programs slotted now have ended (or ``timeout``)."""

    timeout: Any = "10s"


@message(CLIENT, SCHEDULER, RPC)
class WaitIdle(Message):
    """Answer once every host holds no buffer and no program; raise ``TimeoutError`` with
    what is held otherwise."""

    timeout: Any = "10s"


@message(SCHEDULER, CLIENT, EVENT)
class HostRetiring(Message):
    """Host ``host`` leaves on purpose: each of ``clients`` (opted in, with a slice on it)
    suspends what it asked for, then answers ``Suspended``."""

    host: str
    clients: list[str]


# -- host → scheduler ------------------------------------------------------------------------
@message(HOST, SCHEDULER, RPC)
class RegisterHost(Message):
    """A host runtime starts: map it to a topology host (``requested``, if free), tell the
    other hosts where its ``transport`` listens, answer its place and theirs."""

    address: str
    requested: int | None = None
    transport: str | None = None


@message(HOST, SCHEDULER, RPC)
class HostFailed(Message):
    """A host runtime could not start (``error``: ``error_message``); waiters raise it."""

    address: str
    error: Mapping[str, Any]


@message(HOST, SCHEDULER, RPC)
class HostLeaving(Message):
    """A host runtime is closing: answer once its opted-in clients suspended."""

    address: str


@message(HOST, SCHEDULER, STREAM)
class ProgramDone(Message):
    """The host's devices all popped ``pid`` (ran or skipped it): it ended there; slot more."""

    pid: str


@message(HOST, SCHEDULER, STREAM)
class DispatchFailed(Message):
    """The host could not register its part of ``pid``: drop it on every host, with ``cause``."""

    pid: str
    error: str
    cause: Any = None


# -- scheduler → host ---------------------------------------------------------------------------
@message(SCHEDULER, HOST, STREAM)
class HostJoined(Message):
    """Another host joined (or restarted): its socket transport listens at ``transport``."""

    host: str
    transport: str | None = None


@message(SCHEDULER, HOST, STREAM)
class HostLost(Message):
    """Another host left: send it nothing more."""

    host: str


@message(SCHEDULER, HOST, STREAM)
class Order(Message):
    """Programs ``(pid, client, devices, slot, prev)``: each takes the next place in these local
    devices' order once the program slotted before it here (slot ``prev``; -1: none) has
    taken its place, whatever order records arrive in (:mod:`~pathdask.core.fanout`); one
    that arrives again is ignored; one dropped already ends here at once."""

    programs: list[tuple[str, str, list[int], int, int]]


@message(SCHEDULER, HOST, STREAM)
class Dispatch(Message):
    """Calls of ``client``, each ``(pid, plan id, argument keys, output keys owned here)``:
    put the output keys' handles in the worker's data, register each call's part."""

    client: str
    calls: list[tuple[str, str, list[Any], list[tuple[Any, int]]]]


@message(SCHEDULER, HOST, STREAM)
class DropPrograms(Message):
    """These programs can no longer run everywhere: drop them here (they still end here).
    ``host`` is a host that was lost; ``cause`` the error their results raise."""

    pids: list[str]
    reason: str
    host: str | None = None
    cause: Any = None


@message(SCHEDULER, HOST, STREAM)
class Fan(Message):
    """Records for the hosts of a fan-out tree (:mod:`~pathdask.core.fanout`): ``hosts[0]`` is
    the receiver and the rest its subtree. Forward each child's share first (on the peers'
    channel), then take this host's part: of a ``call`` ``(client, pid, inputs, plan id,
    owned)`` (every host holds its own plan under that id; ``owned``: ``(i, output keys)``
    for each ``hosts[i]`` that owns some), of an ``order`` ``(pid, client, slot, devices,
    prev)`` (``devices``: ``hosts[i]``'s at ``[i]``, or ``None``: those of the plan the
    record's ``call`` names; ``prev``: one slot for every host, or one per host), and of a
    ``release`` ``(id, outputs)``. Each record names each host once, and carries nothing
    per host that is the same on all. A program ordered this way, or a release, is reported to ``parent``
    (``None``: the scheduler, by ``ProgramDone`` or ``Released``) once it ended (or was
    carried out) here and every child reported it (``SubtreeDone``)."""

    hosts: list[str]
    parent: str | None
    degree: int
    call: tuple[Any, ...] | None = None
    order: tuple[Any, ...] | None = None
    release: tuple[str, list[tuple[str, int]]] | None = None


@message(HOST, HOST, PEER)
class SubtreeDone(Message):
    """Program (or release) ``pid`` ended on every host of the sender's subtree."""

    pid: str


@message(HOST, SCHEDULER, STREAM)
class Released(Message):
    """Release ``id`` (a fan-out tree's) was carried out on every host of its tree."""

    id: str


@message(SCHEDULER, HOST, STREAM)
class DropClient(Message):
    """A client closed: drop its programs and plans, refuse its late ones."""

    client: str


@message(SCHEDULER, HOST, STREAM)
class ReleaseOutputs(Message):
    """The scheduler forgot these output keys ``(pid, output index)``: free their buffers."""

    outputs: list[tuple[str, int]]


@message(SCHEDULER, HOST, RPC)
class StreamByRpc(Message):
    """A stream record sent by RPC, to a retiring host whose stream Dask closed already."""

    msg: dict[str, Any]


@message(SCHEDULER, HOST, RPC)
class HostStats(Message):
    """Answer this host's device, link and NIC statistics."""


@message(SCHEDULER, HOST, RPC)
class HostDiagnose(Message):
    """Answer what each device of this host runs or waits for."""


@message(SCHEDULER, HOST, RPC)
class HostWaitIdle(Message):
    """Answer (with stats) once this host holds no buffer and runs no program."""


@message(SCHEDULER, HOST, RPC)
class HostActivity(Message):
    """Answer the gangs recorded since ``cursors``, with memory and link bytes (dashboard)."""

    cursors: dict[str, list[tuple[int, int]]]
    limit: int


@message(SCHEDULER, HOST, RPC)
class HostTransfers(Message):
    """Answer the modelled transfers that arrived here, wall-clock."""


@message(SCHEDULER, HOST, RPC)
class HostResetObservations(Message):
    """Forget this host's recorded gaps, gangs and transfers."""


# -- client → host ------------------------------------------------------------------------------
@message(CLIENT, HOST, RPC)
class Plans(Message):
    """Cache these plans of ``client``; later calls name them by id. Answer how many."""

    client: str
    plans: Any


@message(CLIENT, HOST, RPC)
class Fetch(Message):
    """Answer the values of ``buffers`` ``(pid, value, device)`` once computed, or the error
    that ended their program."""

    buffers: list[tuple[str, int, int]]


@message(CLIENT, HOST, RPC)
class Status(Message):
    """Answer ``pending``, ``ready`` or ``error`` per buffer, without waiting."""

    buffers: list[tuple[str, int, int]]


@message(CLIENT, HOST, RPC)
class Save(Message):
    """Write the listed shards, once computed, as chunks of the checkpoint directory ``path``
    (not committed yet); answer the CRC-32 of each, in order (``worker/storage.py``)."""

    path: str
    writes: Any
