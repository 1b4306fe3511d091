"""Suspend on interruption: when a host this client uses leaves on purpose, suspend first.

The scheduler plugin announces a leaving host (``HostRetiring``, a Dask event)
and waits, up to ``pathdask.suspend-timeout``, for the clients that opted in
(``SuspendOnInterruption``) and use it; each suspends its state
(``checkpoint.py``) and answers ``Suspended``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol import CLIENT, HostRetiring, Suspended, SuspendOnInterruption, ask, decode
from ..scheduler.interruptions import TOPIC
from .array import ShardedArray
from .checkpoint import ArrayClient, suspend

__all__ = ["Interruption", "suspend_on_interruption"]


class Interruption:
    """What ``client.suspend_on_interruption`` returns: a record of the suspends it made.

    ``happened`` is set once a leaving host made this client suspend; ``records``
    says which host, which arrays, where, and any error.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.happened = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a suspend happened; ``False`` on timeout."""
        return self.happened.wait(timeout)


def suspend_on_interruption(client: ArrayClient, path: str | os.PathLike[str],
                            state: Mapping[str, ShardedArray] | Callable[[], Mapping[str, ShardedArray]]) -> Interruption:
    """Suspend ``state`` to ``path`` when a host this client uses leaves on purpose."""
    watch = Interruption(os.fspath(path))

    async def on_event(event: tuple[float, dict[str, Any]]) -> None:
        msg = decode(event[1], "the scheduler", CLIENT, HostRetiring.kind)
        assert isinstance(msg, HostRetiring)
        if client.id not in msg.clients:
            return
        error, names = None, []
        try:
            arrays = dict(state() if callable(state) else state)
            names = await asyncio.to_thread(suspend, client, watch.path, arrays)
        except Exception as e:  # noqa: BLE001 - told to the scheduler and kept in the record
            error = f"{type(e).__name__}: {e}"
        watch.records.append({"host": msg.host, "arrays": names, "path": watch.path, "error": error})
        watch.happened.set()
        await ask(client.dask.scheduler, Suspended(client.id, msg.host, error))

    client.dask.subscribe_topic(TOPIC, on_event)
    client.dask.sync(ask, client.dask.scheduler, SuspendOnInterruption(client.id))
    return watch
