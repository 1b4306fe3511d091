"""Faults injected into a live system, for tests and ``pathdask bench stress``.

Each is a function to run on a worker with ``client.dask.run(fn, workers=[address])``.
"""

from __future__ import annotations

from typing import Any

from .core.host import Raise
from .errors import DispatchError

__all__ = ["fail_next_call", "fail_next_dispatch"]


def fail_next_dispatch(dask_worker: Any) -> None:
    """The next dispatch on this worker's host fails; the program must still end on every host."""
    core = dask_worker.plugins["pathdask"].core
    real = core.dispatch

    def failing(pid: str, *args: Any, **kwargs: Any) -> Any:
        core.dispatch = real
        error = DispatchError(f"injected fault: the dispatch on host {core.address} failed")
        return [*core.drop_program(pid, error), Raise(error)]

    core.dispatch = failing


def fail_next_call(dask_scheduler: Any) -> None:
    """The scheduler fails to create the next program call it receives (run it with
    ``client.dask.run_on_scheduler``); its program must still end, with a typed error."""
    def failing(*args: Any, **kwargs: Any) -> Any:
        del dask_scheduler.new_task  # the next ones go through again
        raise RuntimeError("injected fault: the scheduler could not create the call's keys")

    dask_scheduler.new_task = failing
