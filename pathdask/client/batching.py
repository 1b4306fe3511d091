"""Opportunistic batching: program calls made while the client's last one is on its way go as one.

The paper, on Figure 5's OpByOp: "We could eliminate most of this overhead by allowing
user code to proceed in parallel with the enqueue RPC, and opportunistically batching
multiple small computations into a single PATHWAYS program." A client's :class:`Batcher`
does that in parallel dispatch:

- A call made while nothing of its client is on its way to the scheduler goes at once,
  as it would unbatched: a loop that waits for each result never waits for a batch.
- A call made while one is (its message not yet on the stream, or handed to an embedded
  scheduler) joins the client's open batch and returns pending arrays at once. As soon as
  the call before has gone, the batch goes as one program, its calls' gangs in call
  order (:func:`~.tracing.compose`): all of it if it holds fewer than :data:`FEW` calls,
  else its first ``2**i`` while the rest wait on. So a loop's batches come in few
  shapes, whose composed programs and plans (on the hosts too) are cached and reused.
  What the hosts run is the same gangs in the same order; what is saved is the per-call
  work on the way: one message, one slot, one ending, and Dask keys only for what is held.
- An array of the batch that nothing holds when the batch goes (the ``y`` that
  ``y = f(y)`` rebinds) is not an output: it lives on the devices between the gang that
  makes it and the gangs that read it, like a value inside a program, and never gets a
  Dask key. Every array that is held when it goes is an output, owned by its keys.
- Touching a pending array in any way that needs its program (``result()``, ``status``,
  the Dask protocol, a call that cannot join this batch, a checkpoint) sends its batch first.

A batch takes only calls on the same devices, so that a lost device fails no call it
would not have failed alone; a kernel's failure stays with the values that depend on it
(``worker/execute.py``), as between separate calls. ``pathdask.batch.enabled: false``
turns batching off; ``pathdask.batch.max-gangs`` bounds a batch.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import dask

from ..errors import ClientClosedError
from .protocols import Sharded
from .tracing import Program, compose

if TYPE_CHECKING:
    from distributed import Future

__all__ = ["Batch", "Batcher"]

#: shapes of batch whose composed program a client keeps (and so their plans on the hosts)
COMPOSED_KEPT = 256
#: fewer calls than this go as one program whatever their number; more, in powers of two (so a
#: loop's batches come in at most ``FEW`` + log2(max-gangs) shapes)
FEW = 16
#: a batch goes after this long even if the calls before it have not said that they went
UNHEARD_AFTER = 1.0

#: a call's argument within a batch: an input of the batch (its index) or output ``j`` of call ``e``
Ref = tuple[int] | tuple[int, int]
#: launches a program on arrays; ``sent`` is called once its call is on its way; returns its
#: program id and, per output, its futures by host
Launch = Callable[[Program, tuple[Sharded, ...], Callable[[], None]], tuple[str, dict[int, dict[str, "Future"]]]]


@functools.lru_cache(maxsize=1024)
def devices_of(program: Program) -> frozenset[int]:
    """Every device a program's values live on."""
    return frozenset(d for mesh in dict.fromkeys(v.mesh for v in program.values) for d in mesh.device_ids)


class Batch:
    """Calls not sent yet: per call its program and arguments, and the pending arrays it returned."""

    def __init__(self, batcher: Batcher, devices: frozenset[int]) -> None:
        self.batcher = batcher
        self.devices = devices
        self.calls: list[tuple[Program, tuple[Ref, ...]]] = []
        self.inputs: list[Sharded] = []  # the arrays it reads that no call of it makes, by first use
        self._input_index: dict[int, int] = {}
        #: per pending array: a weak reference (a dropped one is no output), its call and output
        self.pending: list[tuple[weakref.ref[Sharded], int, int]] = []
        self.gangs = 0
        self.sent = threading.Event()
        self.error: BaseException | None = None
        self.open = True

    def ref(self, a: Sharded) -> Ref:
        if a._batch is self and a._slot is not None:
            return a._slot
        return (_number(a, self.inputs, self._input_index),)

    def split(self, cut: int) -> Batch:
        """Its first ``cut`` calls as a batch of their own, closed, to be sent before this one,
        which keeps the rest (under the batcher's lock). What those read of the first calls
        becomes inputs of this one, made by the first batch as outputs."""
        head = Batch(self.batcher, self.devices)
        head.open = False
        old_inputs, self.inputs, self._input_index = self.inputs, [], {}
        head.calls = [(p, tuple(r if len(r) == 2 else head.ref(old_inputs[r[0]]) for r in refs))
                      for p, refs in self.calls[:cut]]
        head.gangs = sum(len(p.gangs) for p, _ in head.calls)
        held: dict[tuple[int, int], Sharded] = {}
        rest = []
        for ref, e, j in self.pending:
            a = ref()
            if e < cut:
                head.pending.append((ref, e, j))
                if a is not None:
                    a._batch = head
                    if not a._deleted:
                        held[(e, j)] = a
            else:
                if a is not None:
                    a._slot = (e - cut, j)
                rest.append((ref, e - cut, j))
        self.pending = rest

        def local(r: Ref) -> Ref:
            if len(r) == 1:
                return self.ref(old_inputs[r[0]])
            e, j = r  # type: ignore[misc]
            if e >= cut:
                return (e - cut, j)
            a = held.get((e, j))
            if a is None:  # nothing holds it, but a later call reads it: an output all the same
                program = self.calls[e][0]
                a = held[(e, j)] = self.batcher._array(program, program.outputs[j], "", {}, None,
                                                       batch=head, slot=(e, j))
                head.pending.append((weakref.ref(a), e, j))
            return self.ref(a)

        self.calls = [(p, tuple(local(r) for r in refs)) for p, refs in self.calls[cut:]]
        self.gangs -= head.gangs
        return head

    def settle(self) -> None:
        """Send this batch now if it is still open, else wait until it went; raises what stopped it."""
        self.batcher.send_now(self)
        if self.error is not None:
            raise self.error

    def drop(self, a: Sharded) -> bool:
        """``a.delete()`` while this batch is open: ``a`` will be no output. False once it is sending."""
        with self.batcher._lock:
            if self.open:
                a._deleted = True
            return self.open


class Batcher:
    """A client's calls in parallel dispatch, sent at once or in batches (see the module).

    ``launch`` sends a program (``Client._launch``); ``make`` makes the arrays of ``client``
    (``ShardedArray``).
    """

    def __init__(self, client: Any, launch: Launch, make: Callable[..., Sharded]) -> None:
        self.client = client
        self._launch = launch
        self._make = make
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._open: Batch | None = None
        self._unsent = 0  # calls launched whose message is not on its way yet
        self._holds = 0  # ``holding()`` blocks open: their calls wait until the last ends
        self._closing = False
        self._thread: threading.Thread | None = None
        self._composed: OrderedDict[Any, Program] = OrderedDict()
        #: calls that went in batches, and the programs they went as
        self.batched_calls = self.batch_programs = 0

    # -- a call ----------------------------------------------------------------
    def call(self, program: Program, args: tuple[Sharded, ...]) -> Any:
        """Run ``program`` on ``args``: at once, or in the open batch; returns its outputs."""
        for a in args:
            a._check_alive()
        if not program.gangs or not _batching():
            return self._now(program, args)
        devices = devices_of(program)
        while True:
            full = None
            with self._lock:
                batch = self._open
                stale = next((a for a in args if a._batch is not None and a._batch is not batch), None)
                if stale is None:
                    if batch is not None and batch.devices != devices:
                        full = self._take()  # another set of devices: the open batch goes first
                    elif batch is None and self._unsent == 0 and not self._holds and not self._closing:
                        self._unsent += 1
                        go_now = True
                    else:
                        go_now = False
                        outs, batch = self._join(program, args, devices)
                        if batch.gangs >= _max_gangs():
                            full = self._take()
            if stale is not None:
                stale._settle()
                continue
            if full is not None:
                self._send(full)
                if full.devices != devices:
                    continue
                return outs
            if not go_now:
                return outs
            break
        sent = self._sent_once()
        try:
            pid, futures = self._launch(program, args, sent)
        except BaseException:
            sent()
            raise
        return self._wrap(program, args, pid, futures)

    def _now(self, program: Program, args: tuple[Sharded, ...]) -> Any:
        """Unbatched: the open batch goes first, then this call."""
        with self._lock:
            batch = self._take() if self._open is not None else None
        if batch is not None:
            self._send(batch)
        pid, futures = self._launch(program, args, _nothing)
        return self._wrap(program, args, pid, futures)

    def _wrap(self, program: Program, args: tuple[Sharded, ...], pid: str,
              futures: dict[int, dict[str, Future]]) -> Any:
        """A launched program's outputs, as its caller gets them."""
        return _returned(program, args, lambda j, vid: self._array(program, vid, pid, futures[j], args))

    def _array(self, program: Program, vid: int, pid: str, futures: dict[str, Future],
               args: tuple[Sharded, ...] | None, **pending: Any) -> Sharded:
        """Value ``vid`` of ``program`` (of program id ``pid``, or waiting in a batch), labelled
        after ``args``."""
        v = program.values[vid]
        return self._make(self.client, pid, vid, v.shape, v.dtype, v.mesh, v.spec, futures,
                          labels_for(v.shape, args) if args else None, **pending)

    def _join(self, program: Program, args: tuple[Sharded, ...], devices: frozenset[int]) -> tuple[Any, Batch]:
        """Add the call to the open batch (under the lock); its pending outputs."""
        batch = self._open
        if batch is None:
            batch = self._open = Batch(self, devices)
            self._start()
        e = len(batch.calls)
        batch.calls.append((program, tuple(batch.ref(a) for a in args)))
        batch.gangs += len(program.gangs)

        def pending(j: int, vid: int) -> Sharded:
            a = self._array(program, vid, "", {}, args, batch=batch, slot=(e, j))
            batch.pending.append((weakref.ref(a), e, j))
            return a

        return _returned(program, args, pending), batch

    # -- sending ---------------------------------------------------------------------
    def _take_head(self) -> Batch:
        """The open batch's calls if fewer than :data:`FEW`, else its first ``2**i``, the most there
        are, to be sent by the caller; the rest stay open (under the lock). So a loop's batches come
        in few shapes, and each goes as one program."""
        batch = self._open
        assert batch is not None
        n = len(batch.calls)
        cut = n if n < FEW else 1 << (n.bit_length() - 1)
        if cut == n:
            return self._take()
        self._unsent += 1
        return batch.split(cut)

    def _take(self) -> Batch:
        """The open batch, closed to new calls, to be sent by the caller (under the lock)."""
        batch = self._open
        assert batch is not None
        self._open = None
        batch.open = False
        self._unsent += 1
        return batch

    def send_now(self, batch: Batch) -> None:
        """Send ``batch`` from this thread if it is still open; else wait until it went."""
        with self._lock:
            mine = batch.open
            if mine:
                self._take()
        if mine:
            self._send(batch)
        else:
            batch.sent.wait()

    def _send(self, batch: Batch) -> None:
        """Launch a taken batch; its held pending arrays become outputs.

        It goes as the programs :func:`_pieces` says (37 calls: 32, then 5), so that a loop's
        batches come in few shapes, whose composed programs and plans are reused. A
        value that one of these programs makes and a later one reads is an output of the
        first (with Dask keys, let go once the reader is on its way).
        """
        sent = self._sent_once()
        launched = False
        try:
            if self._closing or self.client._closed:
                raise ClientClosedError(
                    f"The client {self.client.name!r} closed before these calls were sent; keep the "
                    "client open while you use its arrays")
            held = {(e, j): a for ref, e, j in batch.pending if (a := ref()) is not None and not a._deleted}
            crossing: dict[tuple[int, int], Sharded] = {}  # values that a later piece reads
            start = 0
            for size in _pieces(len(batch.calls)):
                end = start + size
                calls, inputs = _piece(batch, start, end, crossing)
                later = {r for _, refs in batch.calls[end:] for r in refs if len(r) == 2 and start <= r[0] < end}
                outs = sorted({k for k in held if start <= k[0] < end} | later)  # type: ignore[arg-type]
                if outs:
                    program = self._compose(calls, len(inputs), tuple((e - start, j) for e, j in outs))
                    pid, futures = self._launch(program, tuple(inputs), sent)
                    launched = True
                    self.batched_calls += size
                    self.batch_programs += 1
                    for i, k in enumerate(outs):
                        a = held.get(k)
                        if a is not None:
                            a._settled(pid, program.outputs[i], futures[i])
                        if k in later:
                            crossing[k] = a if a is not None else self._array(program, program.outputs[i], pid,
                                                                              futures[i], None)
                start = end
        except BaseException as exc:  # noqa: BLE001 - it belongs to the batch's arrays
            batch.error = exc
        finally:
            if not launched:
                sent()
            batch.inputs = []
            batch.sent.set()

    def _compose(self, calls: list[tuple[Program, tuple[Ref, ...]]], n_inputs: int,
                 outputs: tuple[tuple[int, int], ...]) -> Program:
        """Calls as one program (cached per shape)."""
        key = (tuple(calls), n_inputs, outputs)
        with self._lock:
            program = self._composed.get(key)
            if program is not None:
                self._composed.move_to_end(key)
                return program
        names = list(dict.fromkeys(p.name for p, _ in calls))  # a loop of one program keeps its name
        name = "+".join(names[:3]) + ("+..." if len(names) > 3 else "")
        program = compose(name, calls, n_inputs, outputs)
        with self._lock:
            self._composed[key] = program
            while len(self._composed) > COMPOSED_KEPT:
                self._composed.popitem(last=False)
        return program

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Calls made inside the block wait in the open batch until it ends (or until one of
        their arrays is touched, or the batch is full), whatever is on its way."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                self._wake.notify()

    def _sent_once(self) -> Callable[[], None]:
        """What a launch calls once its call is on its way (or failed): the first call counts."""
        told = False

        def sent() -> None:
            nonlocal told
            if told:
                return
            told = True
            with self._lock:
                self._unsent -= 1
                if self._unsent == 0 and self._open is not None:
                    self._wake.notify()

        return sent

    # -- the thread that sends batches -------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pathdask-batcher", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._lock:
            while not self._closing:
                if self._open is None or self._unsent or self._holds:
                    if self._wake.wait(UNHEARD_AFTER) or self._open is None or self._holds:
                        continue
                    # the calls before it have not said that they went (a long plan upload, a
                    # blocked event loop): it goes anyway, behind them
                batch = self._take_head()
                self._lock.release()
                try:
                    self._send(batch)
                finally:
                    self._lock.acquire()

    def close(self) -> None:
        """No more batches: an open one fails with :class:`ClientClosedError` when touched."""
        with self._lock:
            self._closing = True
            batch = self._take() if self._open is not None else None
            self._wake.notify_all()
        if batch is not None:
            self._send(batch)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


def _nothing() -> None:
    pass


def _returned(program: Program, args: tuple[Sharded, ...], make: Callable[[int, int], Sharded]) -> Any:
    """What a call of ``program`` on ``args`` returns: an output that is an argument is that
    argument, output ``j`` of value ``vid`` otherwise ``make(j, vid)``."""
    outs = [args[vid] if vid < program.n_inputs else make(j, vid) for j, vid in enumerate(program.outputs)]
    return tuple(outs) if program.multiple_outputs else outs[0]


def _number(a: Sharded, inputs: list[Sharded], index: dict[int, int]) -> int:
    """``a``'s place among ``inputs`` (by identity, ``index`` its map), added at its first use."""
    i = index.get(id(a))
    if i is None:
        i = index[id(a)] = len(inputs)
        inputs.append(a)
    return i


def _pieces(n: int) -> list[int]:
    """``n`` calls as the programs they go as: powers of two from :data:`FEW` up, largest first,
    then fewer than :data:`FEW` at once: 37 -> [32, 5]; 127 -> [64, 32, 16, 15]."""
    return [1 << b for b in range(n.bit_length() - 1, FEW.bit_length() - 2, -1) if n >> b & 1] + \
        ([n % FEW] if n % FEW else [])


def _piece(batch: Batch, start: int, end: int, crossing: dict[tuple[int, int], Sharded]
           ) -> tuple[list[tuple[Program, tuple[Ref, ...]]], list[Sharded]]:
    """Calls ``start:end`` of ``batch`` with arguments of their own numbering, and the arrays they
    read from outside: the batch's inputs, and values of earlier pieces (``crossing``)."""
    inputs: list[Sharded] = []
    index: dict[int, int] = {}

    def local(ref: Ref) -> Ref:
        if len(ref) == 2 and ref[0] >= start:
            return (ref[0] - start, ref[1])  # type: ignore[misc]
        a = batch.inputs[ref[0]] if len(ref) == 1 else crossing[ref]  # type: ignore[index]
        return (_number(a, inputs, index),)

    return [(program, tuple(local(r) for r in refs)) for program, refs in batch.calls[start:end]], inputs


def _batching() -> bool:
    return bool(dask.config.get("pathdask.batch.enabled")) and dask.config.get("pathdask.dispatch") == "parallel"


def _max_gangs() -> int:
    n = dask.config.get("pathdask.batch.max-gangs")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"pathdask.batch.max-gangs must be an integer >= 1, got {n!r}")
    return n


def labels_for(shape: tuple[int, ...], arrays: tuple[Sharded, ...]) -> dict[str, Any] | None:
    """xarray in, xarray out: an output keeps the dims and coords of the first labelled input
    of its shape (its name and attrs describe the input, so they stay behind)."""
    for a in arrays:
        if a._xarray is not None and a.shape == shape:
            return {"dims": a._xarray["dims"], "coords": a._xarray.get("coords")}
    return None
