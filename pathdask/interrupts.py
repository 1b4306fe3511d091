"""Ctrl-C that always lands: one press ends a command-line run in order.

Python ignores an exception raised inside a garbage-collector callback or a
``__del__`` ("Exception ignored in ..."), and Dask installs a gc callback; so a
``KeyboardInterrupt`` that happens to arrive there is lost, and the run goes
on (and Dask's gc bookkeeping is left broken); one that arrives in Dask's
``sync()`` before its coroutine started makes Dask log an error. Under
:func:`reliable_interrupts`, an interrupt that arrives in such a frame is
raised a moment later instead, and one that has not started the orderly
shutdown a second later (lost some other way) is raised again. Once a ``LocalSystem`` is
closing because of it (:func:`unwinding`), further interrupts are ignored, so
that they cannot cut the shutdown short.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["reliable_interrupts", "unwinding"]

_unwinding = threading.Event()
RETRY_AFTER = 1.0  # seconds


def unwinding() -> None:
    """An interrupt reached the shutdown: stop raising it again."""
    _unwinding.set()


def _raise_again() -> None:
    if not _unwinding.is_set():
        os.kill(os.getpid(), signal.SIGINT)  # this process: the handler runs in the main thread


def _later(seconds: float) -> None:
    timer = threading.Timer(seconds, _raise_again)
    timer.daemon = True
    timer.start()


def _swallowed_here(frame: FrameType | None) -> bool:
    """Whether an exception raised in ``frame`` would be lost: Python ignores it in a ``__del__``
    or a gc callback; and in Dask's ``sync()`` before its coroutine made its future, the
    cancel it schedules fails on the event loop (its ``future`` is unbound) and is logged."""
    from distributed.utils import sync

    callbacks = {getattr(getattr(cb, "__func__", cb), "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code in callbacks:
            return True
        if code is sync.__code__ and "future" not in frame.f_locals:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _unwinding.is_set():
        return  # shutting down in order already
    if _swallowed_here(frame):
        _later(0.05)  # raised here, it would be ignored: raise it just after
        return
    _later(RETRY_AFTER)
    raise KeyboardInterrupt


@contextlib.contextmanager
def reliable_interrupts() -> Iterator[None]:
    """Within this block (main thread only), one Ctrl-C is enough. See the module docstring."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _unwinding.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        unwinding()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
