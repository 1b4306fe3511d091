"""Shared fixtures: real LocalClusters, and a cleanup check after every cluster test."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import dask
import pytest

import pathdask as pw

SMALL = pw.Topology(islands=2, hosts_per_island=2, devices_per_host=2)
#: each call its own program (no opportunistic batching): for tests of the per-call path
UNBATCHED = {"pathdask.batch.enabled": False}


def assert_clean(system: pw.LocalSystem) -> None:
    """Every store is empty and no program is pending, once arrays are released."""
    gc.collect()
    stats = system.wait_idle(timeout="15s")
    for dev, s in stats["devices"].items():
        assert s["bytes_in_use"] == 0, f"device {dev} still holds {s['bytes_in_use']} bytes"
        assert s["buffers"] == 0, f"device {dev} still holds {s['buffers']} buffers"
        assert s["pending_programs"] == 0, f"device {dev} still has programs queued"
    assert stats["programs"] == 0


@pytest.fixture(scope="module")
def system() -> Iterator[pw.LocalSystem]:
    """One in-process system per test module (fast); see test_processes.py for processes."""
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as s:
        yield s


@pytest.fixture
def unbatched() -> Iterator[None]:
    """Each call of the test its own program (``pathdask.batch.enabled: false``)."""
    with dask.config.set(UNBATCHED):
        yield


@pytest.fixture
def client(system: pw.LocalSystem) -> Iterator[pw.Client]:
    c = system.client(name="test")
    try:
        yield c
    finally:
        c.close()
        assert_clean(system)
