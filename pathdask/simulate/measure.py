"""How calibration and validation measure the real embedded system: on one CPU, each run
from a settled heap.

The embedded model (:meth:`~.model.CostModel.embedded`) is one processor: one
process, one GIL. On a machine with several CPUs the real process is not quite
that: the operating system moves its threads between CPUs, and CPUs of a
virtual machine need not run at one speed (two of them can differ by 1.8x,
each shared with other guests in its own way). A run's rate then depends on
where its threads happened to be. :func:`one_cpu` runs the measurements on one
CPU, the fastest of those the process may use, so that the real system is
the system the model describes and its numbers repeat from run to run.

A process that has run many configurations holds more objects (Dask's bounded
logs and caches fill up), and a full garbage collection of them pauses every
thread for a tenth of a second or more, more often the longer it ran. The model
has no such pauses, and a later row would pay for the earlier ones:
:func:`settled` runs each measurement after a full collection, with what lived
before it left out of the collections during it (``gc.freeze``).

One CPU of a virtual machine does not keep one speed either: here it switched,
from one second to the next, between two speeds 1.5-1.8 times apart (another
guest on its core, as far as one can tell from inside), and a one-gang call's
CPU went from 2.2 to 4.2 ms with the same context switches per call. The
model's costs are seconds of the CPU as it ran during calibration.
:class:`SpeedMeter` times a fixed piece of control-plane work in a thread of its
own, every :data:`SpeedMeter.period` seconds, while the real system runs.
Calibration keeps its costs at the speed it measured on average; a measurement
made while the CPU ran more than 15% away from it is made again (up to three
times). Validation makes its runs again in the same way when the CPU runs away
from the calibration's speed, and runs the model at the speed of each real run
it keeps (:meth:`.model.CostModel.at_speed`). Scaling by the meter's speed is not
exact (its work is not the system's: with many client threads a slower CPU
costs the system more than it costs the meter), hence the runs made again.
"""

from __future__ import annotations

import gc
import os
import pickle
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from distributed.protocol import dumps, loads

from ..affinity import can_pin, pin
from ..protocol import STREAM_OP, Dispatch, fields_of

__all__ = ["HandlerClock", "SpeedMeter", "handled", "one_cpu", "settled", "timed", "wrap_dispatch"]

Echo = Callable[[str], Any]
T = TypeVar("T")


def settled(run: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``run(*args, **kwargs)`` after a full collection, with the objects that lived before it frozen."""
    gc.collect()
    gc.freeze()
    try:
        return run(*args, **kwargs)
    finally:
        gc.unfreeze()


#: what the meter packs and unpacks: a message of the size of a call's dispatch
_MESSAGE = {"op": STREAM_OP, "kind": Dispatch.kind, "program": "p-1",
            "gangs": [{"gang": i, "devices": list(range(8)), "key": f"x-{i}"} for i in range(8)]}
_ARRAY = np.zeros(1 << 17)


def _reference() -> None:
    """The meter's fixed work, about 0.5 ms: what the control plane does most (dict updates,
    messages packed as Dask packs them, and pickled, a little NumPy)."""
    d: dict[int, int] = {}
    for i in range(2000):
        d[i % 500] = d.get(i % 500, 0) + i
    for _ in range(20):
        loads(dumps(_MESSAGE))
        pickle.loads(pickle.dumps(_MESSAGE))
    _ARRAY.sum()


def _reference_seconds() -> float:
    """CPU seconds of this thread for one :func:`_reference` (time it waited for a CPU or the GIL not counted)."""
    t = time.thread_time_ns()
    _reference()
    return (time.thread_time_ns() - t) / 1e9


class SpeedMeter:
    """The CPU's speed while the real system runs: the CPU seconds of :func:`_reference`,
    timed every :attr:`period` seconds in a thread of its own (a context manager).

    It takes about 2% of the CPU, in calibration and validation alike.
    :meth:`during` runs a measurement and gives the CPU's mean speed meanwhile, and
    makes it again while the CPU runs at another speed than the one asked for;
    :meth:`mean` is that over every sample so far.

    The mean speed is the harmonic mean of the samples' reference seconds: a CPU that
    switches between speeds within a run (here, between two 1.5-1.9x apart from one
    second to the next) does the run's work at the mean of its speeds over the run's
    time, which the median of the samples misses (it lands on one of the two). Over
    30 one-second runs of one waiting client, the rate correlated with the samples'
    median at r = 0.82 and with their mean speed at r = 0.88.
    """

    #: seconds between samples
    period = 0.025
    #: how far (relative) from the speed asked for a run may be, and how many runs to try
    tolerance, tries = 0.15, 3

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.redone = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pathdask-speed-meter", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(_reference_seconds())

    def __enter__(self) -> SpeedMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self) -> int:
        """Where the samples from now on start (for :meth:`since`)."""
        return len(self.samples)

    def since(self, mark: int) -> float:
        """The reference seconds at the CPU's mean speed over the samples since ``mark`` (one
        taken now if none was): their harmonic mean."""
        return statistics.harmonic_mean(self.samples[mark:] or [_reference_seconds()])

    def during(self, run: Callable[..., T], *args: Any, near: float = 0.0, **kwargs: Any) -> tuple[T, float]:
        """``settled(run, *args, **kwargs)``, and the reference seconds at the CPU's mean speed while it ran.

        ``near``: the speed wanted (reference seconds; 0: any). A run made while the CPU ran
        more than :attr:`tolerance` away from it is made again, up to :attr:`tries` runs in
        all, and the closest is kept; :attr:`redone` counts the runs made again.
        """
        best: tuple[T, float] | None = None
        for attempt in range(self.tries if near > 0 else 1):
            self.redone += attempt > 0
            mark = self.mark()
            result = settled(run, *args, **kwargs)
            speed = self.since(mark)
            if best is None or abs(speed - near) < abs(best[1] - near):
                best = (result, speed)
            if near <= 0 or abs(speed / near - 1) <= self.tolerance:
                break
        assert best is not None
        return best

    def mean(self) -> float:
        """The reference seconds at the CPU's mean speed over every sample so far."""
        return self.since(0)

    @staticmethod
    def now(samples: int = 20) -> float:
        """The reference seconds at the CPU's mean speed now: ``samples`` of them taken at once, here."""
        return statistics.harmonic_mean([_reference_seconds() for _ in range(samples)])


def timed(inner: Callable[..., T], record: Callable[[float, dict[str, Any]], None],
          clock: Callable[[], float] = time.perf_counter) -> Callable[..., T]:
    """``inner``, timed: after each run, ``record(seconds on clock, its keyword arguments)``."""
    def wrapper(*args: Any, **kwargs: Any) -> T:
        t = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            record(clock() - t, kwargs)

    return wrapper


def wrap_dispatch(system: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace every host's handler of calls (of its ``protocol.Dispatch`` records, on an
    embedded ``LocalSystem``) by ``wrap(handler)``; the wrapped handler takes the record's
    fields as keyword arguments."""
    assert system.cluster is not None
    for worker in system.cluster.workers.values():
        rt = worker.plugins["pathdask"]
        inner = rt.handlers[Dispatch]
        wrapped = wrap(lambda _inner=inner, **fields: _inner(Dispatch(**fields)))
        rt.handlers[Dispatch] = lambda msg, _wrapped=wrapped: _wrapped(**fields_of(msg))


def handled(client: Any) -> None:
    """Wait until the hosts of an embedded ``LocalSystem`` have ended their handlers of every
    message before now. A device answers a fetch while its host's handler of the call may
    still be putting the keys' handles (it handed the device the GIL first,
    ``tuning.hand_over``), so a timing of that handler can land just after ``result()``
    returns. The handler ends before the event loop the hosts and the scheduler share takes
    anything after it: one round trip to the scheduler is the wait."""
    client.dask.run_on_scheduler(lambda: None)


class HandlerClock:
    """The system's own speed, timed in place: the CPU seconds (of its thread) that the hosts'
    handler of calls spends on each message of one call, over an embedded system's runs.

    Clients that each wait for every result keep the process's CPU busy, so their rate is
    the inverse of the CPU per call. On a virtual machine that CPU moved by up to 2.7x
    between runs seconds apart, more than the :class:`SpeedMeter` saw (its work is not the
    system's). This handler's CPU moves with it (r = 0.97-1.00 over runs of one
    configuration): the rate times it stays within a few per cent across runs whose rates
    spread 1.8-2.7x. That tells a machine whose speed moved from a system whose work did.
    It also grows with the number of clients (the hosts hold more state), so it describes
    the runs of one configuration, not a speed to run the model at.
    """

    def __init__(self, system: Any) -> None:
        self.samples: list[float] = []
        wrap_dispatch(system, lambda handler: timed(handler, self._record, time.thread_time))

    def _record(self, seconds: float, kwargs: dict[str, Any]) -> None:
        if len(kwargs.get("calls", ())) == 1:
            self.samples.append(seconds)

    def mark(self) -> int:
        """Where the samples from now on start (for :meth:`since`)."""
        return len(self.samples)

    def since(self, mark: int) -> float:
        """The mean CPU seconds per one-call message since ``mark`` (NaN if there was none)."""
        return statistics.mean(self.samples[mark:]) if len(self.samples) > mark else float("nan")


def fastest(cpus: set[int], tries: int = 5) -> int:
    """The CPU among ``cpus`` on which the speed meter's work runs fastest (best of ``tries``)."""
    mine = os.sched_getaffinity(0)
    speed = {}
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            speed[cpu] = min(_reference_seconds() for _ in range(tries))
    finally:
        os.sched_setaffinity(0, mine)
    return min(speed, key=lambda c: speed[c])


@contextmanager
def one_cpu(cpu: int | None = None, echo: Echo = print) -> Iterator[int | None]:
    """Run every thread of this process, and every thread started meanwhile, on one CPU.

    ``cpu``: which one (default: the fastest, :func:`fastest`); ``-1``: leave the
    threads where they are. Yields the CPU, or ``None`` where the platform cannot
    pin threads (then nothing changes). On exit every thread may use the CPUs the
    process had.
    """
    if cpu == -1 or not can_pin():
        if cpu != -1:
            echo("  this platform cannot pin threads to a CPU: measuring on all of them")
        yield None
        return
    allowed = os.sched_getaffinity(0)
    if cpu is None:
        cpu = fastest(allowed)
    elif cpu not in allowed:
        raise ValueError(f"CPU {cpu} is not one this process may use ({sorted(allowed)}); "
                         f"pass one of them, or -1 to measure on all")
    echo(f"  measuring on CPU {cpu} of {sorted(allowed)} (one processor, as the embedded model)")
    pin(lambda tid: {cpu})
    try:
        yield cpu
    finally:
        pin(lambda tid: allowed)
