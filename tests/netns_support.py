"""Skip a namespaces test, saying why, where the machine cannot run it; fail instead in CI.

CI sets ``PATHDASK_REQUIRE_NETNS=1``: there a missing piece (root, iproute2,
netem and ``/dev/net/tun`` both) fails the tests rather than skipping them.
"""

from __future__ import annotations

import os

import pytest

from pathdask.netns import delay_unavailable, unavailable
from pathdask.netns.delaylink import tun_unavailable


def _skip(reason: str) -> None:
    if os.environ.get("PATHDASK_REQUIRE_NETNS") == "1":
        pytest.fail(f"PATHDASK_REQUIRE_NETNS=1 but {reason}")
    pytest.skip(reason)


def require_namespaces() -> None:
    """Skip (or fail) where network namespaces cannot be made."""
    reason = unavailable()
    if reason:
        _skip(f"network namespaces cannot be used: {reason}")


def require_delay() -> None:
    """Skip (or fail) where no link can be given a delay (no netem and no ``/dev/net/tun``)."""
    reason = delay_unavailable()
    if reason:
        _skip(f"no link can be delayed: {reason}")


def require_delay_line() -> None:
    """Skip (or fail) where the user-space delay line cannot run (no ``/dev/net/tun``)."""
    reason = tun_unavailable()
    if reason:
        _skip(f"no user-space delay line: {reason}")
