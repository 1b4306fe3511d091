"""Every use of Dask's private state, in one place.

pathdask rides on Dask's own streams, keys and dashboard. Where no public API
does what it needs, the private attribute is reached for here, and only here,
each with a line saying why and which public API would replace it. Nothing
else in the package touches Dask internals: when a ``distributed`` release
changes one of them, this module is what to read and mend.

At import it checks the installed ``dask`` and ``distributed`` against the
versions pathdask was tested with (:data:`TESTED`): an untested release warns
(:class:`UntestedDaskWarning`), one that lacks an internal used here fails at
once with :class:`IncompatibleDaskError`, naming what is missing.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import distributed
from distributed import Future, Scheduler
from distributed.batched import BatchedSend
from distributed.comm import CommClosedError
from distributed.comm.inproc import InProc, InProcListener
from distributed.comm.tcp import TCP
from tornado.ioloop import IOLoop

if TYPE_CHECKING:
    from distributed import Client, Worker

logger = logging.getLogger("pathdask.compat")

__all__ = [
    "TESTED", "IncompatibleDaskError", "UntestedDaskWarning", "check_versions",
    "flush", "whole_writes", "set_interval", "stream_open", "send_to_scheduler", "send_to_worker",
    "send_ahead",
    "client_send", "embedded_scheduler", "stream_settled", "new_futures", "create_keys", "keys_exist", "release_keys", "report_erred",
    "put_data", "unfinished_keys_pinned_to", "restart_when_forgotten", "scheduler_running", "dashboard_application", "dashboard_page_parts",
]

#: the releases pathdask is tested against (pinned in ``pyproject.toml``)
TESTED = {"dask": ("2026.8.0",), "distributed": ("2026.8.0",)}


class IncompatibleDaskError(ImportError):
    """The installed ``distributed`` lacks an internal pathdask relies on."""


class UntestedDaskWarning(UserWarning):
    """The installed ``dask``/``distributed`` is not a release pathdask was tested with."""


# What each internal is and why it is used (checked at import by ``check_versions``).
_REQUIRED: dict[str, tuple[type, str]] = {
    # BatchedSend pacing: send pathdask's messages at once instead of waiting out the stream's
    # interval. Public replacement: a ``BatchedSend.flush()`` (none exists).
    "BatchedSend._background_send": (BatchedSend, "_background_send"),
    # Keys made in memory by the scheduler itself, as ``update_data`` does for scattered data,
    # so that a program call needs no Dask task. Public replacement: none (``scatter`` sends data).
    "Scheduler.new_task": (distributed.Scheduler, "new_task"),
    "Scheduler.add_replica": (distributed.Scheduler, "add_replica"),
    "Scheduler.client_desires_keys": (distributed.Scheduler, "client_desires_keys"),
    "Scheduler.client_releases_keys": (distributed.Scheduler, "client_releases_keys"),
    "Scheduler.report": (distributed.Scheduler, "report"),
    # A call goes on the client's own stream, in order with its graphs and releases.
    # Public replacement: a stream-handler send on ``distributed.Client`` (none exists).
    "Client._send_to_scheduler_safe": (distributed.Client, "_send_to_scheduler_safe"),
}


def check_versions() -> None:
    """Warn for an untested ``dask``/``distributed``; fail for one lacking a used internal."""
    found = {name: version(name) for name in TESTED}
    untested = {n: v for n, v in found.items() if v not in TESTED[n]}
    missing = [what for what, (cls, attr) in _REQUIRED.items() if not hasattr(cls, attr)]
    if missing:
        raise IncompatibleDaskError(
            f"pathdask needs {', '.join(missing)}, which distributed {found['distributed']} lacks. "
            f"Install a tested release: pip install 'distributed=={TESTED['distributed'][-1]}' "
            f"'dask=={TESTED['dask'][-1]}'"
        )
    if untested:
        warnings.warn(
            f"pathdask was tested with dask {'/'.join(TESTED['dask'])} and distributed "
            f"{'/'.join(TESTED['distributed'])}, not {untested}; it may work, but its use of "
            "Dask internals (pathdask/compat.py) was not checked against this release",
            UntestedDaskWarning, stacklevel=2,
        )


check_versions()


# -- batched streams ----------------------------------------------------------------
def flush(stream: BatchedSend | None, ahead: list[Any] | None = None) -> None:
    """Send what a ``BatchedSend`` holds now, without waiting out its interval (event loop);
    ``ahead``, messages not sent yet, go first, before what the stream held.

    On a TCP or in-process stream the batch is written here, before this returns: the
    same write the stream's background sender makes (``comm.write``), without the loop
    turns it takes to wake it. Otherwise (and until :func:`whole_writes` allows it) the
    background sender is woken as Dask does (``next_deadline``, ``waker``), and ``ahead``
    goes after what the stream holds. Written here, ``ahead`` overtakes only messages
    that wait for the stream's interval (Dask's own, and pathdask's releases), which
    may arrive later than what follows them: a call's records go first to its hosts,
    before the previous call's releases. A failed
    write aborts the stream, as the background sender's does. A stream that is not
    started or already closed is left alone.
    Public replacement: a ``BatchedSend.flush()`` (none exists).
    """
    if ahead:
        assert stream is not None
        if stream.closed():
            raise CommClosedError(f"Comm {stream.comm!r} already closed.")  # as BatchedSend.send
        stream.message_count += len(ahead)
    if stream is None or not (stream.buffer or ahead):
        return
    writes = _whole(stream)
    if writes is None:
        # what the stream holds may include messages flushed before: ``ahead`` goes after them
        stream.buffer.extend(ahead or ())
        stream.next_deadline = None
        stream.waker.set()
        return
    # every flush wrote what the stream held: it now holds only what waits for the interval
    comm = stream.comm
    payload, stream.buffer = [*(ahead or ()), *stream.buffer], []
    stream.batch_count += 1
    write = writes.write_now(payload, serializers=stream.serializers, on_error="raise")
    try:
        write.send(None)
    except StopIteration as written:
        stream.byte_count += written.value
        return
    except CommClosedError:
        logger.info("pathdask: stream %r closed", comm)
    except Exception:
        logger.exception("pathdask: error writing a batch")
    else:  # pragma: no cover - a TCP write without offload, or an in-process one, never waits
        logger.error("pathdask: a write on %r waited; the stream is aborted", comm)
    finally:
        write.close()
    stream.abort()


class _Writes:
    """The writes on a comm that pathdask also writes on itself (:func:`whole_writes`).

    It stands in for the comm's ``write`` and counts the writes of the stream's background
    sender: one is *begun* when the sender takes a batch (it calls ``write`` then) and
    *ended* once it wrote it, a loop turn or more later. While one is begun and not ended,
    a write of pathdask's own would overtake it. An in-process write made on its reader's
    event loop puts the batch in the reader's queue at once, instead of a loop turn later
    (``InProc.write`` queues it with ``add_callback``, to feed the queue from its reader's
    thread: here the writer's own), so that nothing written is out of sight
    (:func:`stream_settled`).
    """

    __slots__ = ("comm", "write", "begun", "ended", "__weakref__")

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.write = comm.write  # the comm's own
        self.begun = self.ended = 0

    def sender_write(self, msg: Any, serializers: Any = None, on_error: Any = None) -> Any:
        self.begun += 1
        return self._ended(self.write_now(msg, serializers, on_error))

    async def _ended(self, write: Any) -> Any:
        try:
            return await write
        finally:
            self.ended += 1

    def write_now(self, msg: Any, serializers: Any = None, on_error: Any = None) -> Any:
        comm = self.comm
        if isinstance(comm, InProc) and comm._write_loop is IOLoop.current(instance=False):
            return self._put(msg)
        return self.write(msg, serializers=serializers, on_error=on_error)

    async def _put(self, msg: Any) -> int:
        if self.comm.closed():
            raise CommClosedError()
        self.comm._write_q.put_nowait(msg)
        return 1

    def idle(self) -> bool:
        """Whether the sender wrote a batch since this stood in, and wrote every batch it took."""
        return self.ended > 0 and self.begun == self.ended


def _whole(stream: BatchedSend) -> _Writes | None:
    """The writes on ``stream``'s comm, where a write of pathdask's own keeps its batches in
    order now (:func:`whole_writes`); ``None`` where it would not."""
    comm = stream.comm
    if comm is None or stream.please_stop or comm.closed() or not isinstance(comm, (TCP, InProc)):
        return None
    writes = _writes.get(comm)
    if writes is None:
        comm.allow_offload = False
        _writes[comm] = writes = _Writes(comm)
        comm.write = writes.sender_write  # type: ignore[method-assign]
    return writes if writes.idle() else None


def whole_writes(stream: BatchedSend) -> bool:
    """Make every write on ``stream``'s comm whole before the event loop turns; whether a
    write of its own (:func:`flush`) keeps the stream's batches in order now.

    A TCP write queues its frames on the socket at once, and an in-process one its
    message, unless it serializes a large message in a thread first (``allow_offload``):
    that is turned off here, for the comm's life, which also spares each write
    ``safe_sizeof``'s walk of the batch. From then on the stream's background sender's
    writes are counted (``_Writes``): a write of pathdask's own goes in order once the
    sender wrote a batch since (so that any write it began before has ended too), and
    while it has no batch taken and not written yet.
    """
    return _whole(stream) is not None


#: comms that pathdask writes on itself, with their writes (see ``whole_writes``)
_writes: weakref.WeakKeyDictionary[Any, _Writes] = weakref.WeakKeyDictionary()


def set_interval(stream: BatchedSend, seconds: float) -> float:
    """Set how long a ``BatchedSend`` batches; returns the interval it had.
    ``interval`` is a plain attribute with no setter; public replacement: none."""
    old = float(stream.interval)
    stream.interval = seconds
    return old


def stream_open(stream: BatchedSend) -> bool:
    """Whether a ``BatchedSend`` is connected: ``send`` raises on a closed one, and
    ``comm`` is the only place that tells. Public replacement: a ``closed()`` on BatchedSend."""
    comm = stream.comm
    return comm is not None and not comm.closed()


def worker_stream(worker: Worker) -> BatchedSend:
    """A worker's stream to the scheduler. ``batched_stream`` is public in use but
    undocumented; public replacement: none."""
    return worker.batched_stream


def send_to_scheduler(worker: Worker, msg: dict[str, Any], now: bool = True) -> bool:
    """Send ``msg`` on a worker's stream to the scheduler, at once unless ``now`` is false
    (then with the stream's next batch); ``False`` if the stream is down (the worker is
    reconnecting or closing)."""
    stream = worker.batched_stream
    if not stream_open(stream):
        return False
    stream.send(msg)
    if now:
        flush(stream)
    return True


def send_to_worker(scheduler: Scheduler, address: str, msg: dict[str, Any], now: bool = True) -> bool:
    """Send ``msg`` on the scheduler's stream to worker ``address``; ``False`` if it has none,
    or its comm closed.

    ``stream_comms`` is the scheduler's table of batched streams to workers;
    ``Scheduler.send_all`` would do, but silently drops messages to a gone worker.
    Public replacement: a ``send_to_worker`` that reports a missing stream (none exists).
    """
    stream = scheduler.stream_comms.get(address)
    if stream is None or stream.closed():  # a leaving worker's: Dask removes it soon
        return False
    stream.send(msg)
    if now:
        flush(stream)
    return True


def send_ahead(scheduler: Scheduler, address: str, msgs: list[dict[str, Any]]) -> bool:
    """Send ``msgs`` on the scheduler's stream to worker ``address`` at once, ahead of what the
    stream holds, which goes with them (see :func:`flush`); ``False`` if it has no stream."""
    stream = scheduler.stream_comms.get(address)
    if stream is None or stream.closed():  # a leaving worker's: Dask removes it soon
        return False
    flush(stream, msgs)
    return True


def client_send(client: Client, msg: dict[str, Any]) -> None:
    """Put ``msg`` on a Dask client's stream to the scheduler and send it at once.

    Straight onto the stream, as Dask's own queued messages go
    (``_send_to_scheduler_safe``), so it stays in order with the client's graphs and
    releases; ``scheduler_comm`` is that stream. Public replacement: none.
    """
    client._send_to_scheduler_safe(msg)
    flush(client.scheduler_comm)


def new_futures(client: Client, keys: Iterable[Any]) -> list[Future]:
    """Futures of keys the scheduler will create itself, made as ``Client`` makes a graph's:
    under ``_refcount_lock``, before the message that creates them goes, so that the
    scheduler's reports on them find them. Public replacement: none."""
    with client._refcount_lock:
        return [Future(k, client) for k in keys]


# -- a client embedded with its scheduler -------------------------------------------------
def embedded_scheduler(client: Client) -> Scheduler | None:
    """The scheduler that ``client`` reaches through Dask's in-process comm, running on the
    client's own event loop (an embedded system's); ``None`` for any other. Its stream's
    writes are then counted and put in the scheduler's queue at once (:func:`whole_writes`),
    so that :func:`stream_settled` sees everything written. ``Scheduler._instances`` is
    private; public replacement: none.
    """
    stream = client.scheduler_comm
    comm = getattr(stream, "comm", None)
    if not isinstance(comm, InProc) or comm.closed() or comm._write_loop is not client.loop:
        return None
    address = client.scheduler.address
    scheduler = next((s for s in list(Scheduler._instances) if scheduler_running(s) and any(
        isinstance(ln, InProcListener) and ln.contact_address == address for ln in s.listeners)), None)
    if scheduler is None or scheduler.loop is not client.loop:
        return None
    whole_writes(stream)
    return scheduler


def stream_settled(client: Client) -> bool:
    """Whether the scheduler of an embedded ``client`` (:func:`embedded_scheduler`) handled
    everything the client sent on its stream (event loop): every batch the stream's sender
    took was written, the scheduler's reader waits on an empty queue (the comm's private
    ``_write_q``), and the stream holds nothing but releases of keys
    (``client-releases-keys``), which may reach the scheduler after what the client hands it
    now. Public replacement: none.
    """
    stream = client.scheduler_comm
    writes = _whole(stream)
    if writes is None:
        return False
    queue = writes.comm._write_q
    if queue is None or queue._q:
        return False
    reading = queue._read_future
    if reading is None or reading.done():
        return False
    return all(msg.get("op") == "client-releases-keys" for msg in stream.buffer)


# -- keys made by the scheduler -------------------------------------------------------
def keys_exist(scheduler: Scheduler, keys: Iterable[Any]) -> list[Any]:
    """Those of ``keys`` the scheduler holds a task for (``Scheduler.tasks``, public in use)."""
    return [k for k in keys if k in scheduler.tasks]


def create_keys(scheduler: Scheduler, client: str, keys: Mapping[str, Iterable[Any]], nbytes: int) -> None:
    """Create ``keys`` (worker address -> keys) in memory on their workers, desired by ``client``.

    As ``Scheduler.update_data`` does for scattered data, without the data: ``new_task``
    in state ``memory``, ``set_nbytes``, ``add_replica`` and ``client_desires_keys`` (which
    reports them in memory to the client). Public replacement: none.
    """
    made = []
    for address, some in keys.items():
        ws = scheduler.workers[address]
        for key in some:
            ts = scheduler.new_task(key, None, "memory")
            ts.set_nbytes(nbytes)
            scheduler.add_replica(ts, ws)
            made.append(key)
    scheduler.client_desires_keys(keys=made, client=client)


def on_client_releases_keys(scheduler: Scheduler, callback: Callable[[str, list[Any]], None]) -> None:
    """Call ``callback(client, keys)`` after Dask handled a client's ``client-releases-keys``
    stream message, including keys the scheduler no longer knows (an output key whose host
    left was forgotten, but the client may still hold its future: its shards on the other
    hosts live until the client lets go of it). Public replacement: none (no plugin hook
    sees a client release a key the scheduler forgot)."""
    handler = scheduler.stream_handlers["client-releases-keys"]

    def released(**msg: Any) -> None:
        handler(**msg)
        callback(msg["client"], list(msg["keys"]))
    scheduler.stream_handlers["client-releases-keys"] = released


def release_keys(scheduler: Scheduler, client: str, keys: list[Any], stimulus_id: str) -> None:
    """The client lets go of keys it never got values for (``client_releases_keys``, the
    handler behind a client's ``client-releases-keys`` message). Public replacement: none."""
    made = keys_exist(scheduler, keys)
    if made:
        scheduler.client_releases_keys(keys=made, client=client, stimulus_id=stimulus_id)


def report_erred(scheduler: Scheduler, client: str, keys: Iterable[Any], error: Mapping[str, Any]) -> None:
    """Tell ``client`` that ``keys`` erred with ``error`` (``error_message``), as Dask reports
    a failed task (``Scheduler.report``). Public replacement: none."""
    for key in keys:
        scheduler.report({"op": "task-erred", "key": key, "exception": error["exception"],
                          "traceback": error["traceback"]}, client=client)


def put_data(worker: Worker, data: Mapping[Any, object], stimulus_id: str) -> None:
    """Put values in a worker's data, as one Dask state-machine event (``Worker.update_data``,
    the handler behind ``scatter``). Public replacement: none for a worker's own call."""
    worker.update_data(data=dict(data), stimulus_id=stimulus_id)


def unfinished_keys_pinned_to(scheduler: Scheduler, address: str) -> list[Any]:
    """Keys of tasks restricted to worker ``address`` that are not in memory (``TaskState``'s
    ``state`` and ``worker_restrictions``). Public replacement: none."""
    return [ts.key for ts in scheduler.tasks.values()
            if ts.state != "memory" and address in (ts.worker_restrictions or ())]


def restart_when_forgotten(worker: Worker) -> None:
    """A worker the scheduler no longer knows restarts under its nanny instead of stopping it.

    When a heartbeat finds that the scheduler removed this worker (it was silent past
    ``pathdask.host-timeout``, behind a partition that has healed), Dask's ``Worker.heartbeat``
    closes the worker *and its nanny* ("Scheduler was unaware of this worker; shutting down").
    A host that is alive should rejoin instead: closing the worker alone ends its process, and
    the nanny starts a fresh worker, which registers as the same host. Only that reason is
    changed; a lost scheduler still stops the worker and nanny as before. Public replacement:
    none (``Worker.close`` is called by ``Worker.heartbeat`` with ``nanny=True``).
    """
    close = worker.close

    async def close_but_restart_if_forgotten(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("reason") == "worker-heartbeat-missing":
            kwargs["nanny"] = False
        return await close(*args, **kwargs)

    worker.close = close_but_restart_if_forgotten  # type: ignore[method-assign]


def scheduler_running(scheduler: Scheduler) -> bool:
    """Whether the scheduler runs (``Scheduler.status``, not closing). Public replacement: none."""
    return bool(scheduler.status.name == "running")


# -- the dashboard ----------------------------------------------------------------------
def dashboard_application(scheduler: Scheduler) -> Any:
    """Dask's Bokeh application on this scheduler (``http_application.applications``), or
    ``None`` without a dashboard. Public replacement: none."""
    try:
        from bokeh.server.server import BokehTornado
    except ImportError:
        return None
    for app in getattr(getattr(scheduler, "http_application", None), "applications", ()):
        if isinstance(app, BokehTornado):
            return app
    return None


def add_bokeh_application(scheduler: Scheduler, pages: dict[str, Any], prefix: str,
                          extra_plots: list[dict[str, str]]) -> Any:
    """Serve Bokeh ``pages`` on the scheduler's HTTP server, listed in the "More..." menu.

    Dask's ``applications`` mapping is read only when the server starts, so the pages
    get a ``BokehApplication`` of their own, as ``distributed.dashboard.scheduler.connect``
    makes Dask's; ``template_variables`` is the (memoized) dict Dask's pages render with.
    Public replacement: a dashboard page registry (none exists).
    """
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables
    from tornado.ioloop import IOLoop

    variables = template_variables(scheduler)
    listed = {p["url"] for p in variables["plots"]}
    variables["plots"].extend(p for p in extra_plots if p["url"] not in listed)
    variables["plots"].sort(key=lambda p: p["name"])
    app = BokehApplication(pages, scheduler, prefix=prefix, template_variables=variables)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return app


def add_http_handlers(scheduler: Scheduler, handlers: list[Any]) -> bool:
    """Add tornado handlers to the scheduler's HTTP application; ``False`` if it serves none.
    ``http_application`` is the scheduler's tornado app; public replacement: ``distributed.http``
    routes are registered only by module name in config, before start."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    app.add_handlers(r".*", handlers)
    return True


def dashboard_page_parts() -> tuple[Any, Any, Any]:
    """``(add_periodic_callback, BOKEH_THEME, env)``: what Dask's own pages are built with
    (``distributed.dashboard.components``). Public replacement: none."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    return add_periodic_callback, BOKEH_THEME, env

