"""What the tests of a silent host share: a program that uses it, waited for while the
other island runs on, one call at a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple


def until(predicate: Callable[[], Any], timeout: float, what: str, explain: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something true; bounded. ``explain`` adds to the
    failure's message (a system's logs, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout}s" + (f"\n{explain()}" if explain else ""))


class WaitedOut(NamedTuple):
    took: float  # seconds until the doomed program ended
    slowest: float  # the slowest call on the other island meanwhile
    silent: dict[str, Any] | None  # what diagnose() named silent while the doomed program waited
    last: Any  # the other island's last array
    error: BaseException | None  # what the doomed program's result raised


def wait_out(system: Any, step: Any, doomed_input: Any, other: Any, victim: str, timeout: float) -> WaitedOut:
    """Call ``step(doomed_input)`` (it uses the silent host ``victim``) and wait for it on a
    thread, while ``step`` runs on ``other`` (another island) one waited call after another;
    ``diagnose()`` is asked once the wait passed 3 s. Bounded by ``timeout`` + 10 s."""
    start = time.monotonic()
    with ThreadPoolExecutor(1) as waiter:
        doomed = waiter.submit(step(doomed_input).result, timeout=timeout + 30)
        slowest, y, silent = 0.0, other, None
        while not doomed.done():
            t = time.monotonic()
            y = step(y)
            y.result(timeout=timeout)
            slowest = max(slowest, time.monotonic() - t)
            if time.monotonic() - start > 3.0 and silent is None:
                diagnosis = system.diagnose()  # asked while the doomed program waits
                silent = diagnosis.silent
                assert f"silent host {victim}" in str(diagnosis)
            assert time.monotonic() - start < timeout + 10, f"silent host {victim} was never declared lost"
        return WaitedOut(time.monotonic() - start, slowest, silent, y, doomed.exception())
