"""HBM is back-pressure, not a crash; a single oversized allocation fails at once."""

from __future__ import annotations

import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import assert_clean

# 1 host, 2 devices of 64 KiB each
TINY = pw.Topology(islands=1, hosts_per_island=1, devices_per_host=2, hbm="64 KiB")


@pytest.fixture(scope="module")
def tiny():
    with pw.LocalSystem(TINY, processes=False, dashboard_address=None) as s:
        yield s


def test_oversized_allocation_fails_at_once(tiny):
    with tiny.client() as c:
        mesh = c.mesh({"x": 2})
        big = np.zeros((2, 10_000))  # 80 kB per device > 64 KiB
        with pytest.raises(pw.DeviceOutOfMemoryError,
                           match=r"Device \d cannot hold an allocation of 78.12 kiB: its HBM capacity "
                                 r"is 64.00 kiB with 0 B in use"):
            c.put(big, mesh, P("x")).result(timeout=10)
        ok = c.put(np.ones(4), mesh, P("x"))  # the devices go on
        np.testing.assert_array_equal(ok.result(), np.ones(4))
        del ok
    assert_clean(tiny)


def test_outputs_that_do_not_fit_together_wait_for_frees(tiny):
    with tiny.client() as c:
        mesh = c.mesh({"x": 2})
        block = 5_000  # 40 kB per device: one fits in 64 KiB, two do not
        x = c.put(np.arange(2 * block, dtype=np.float64), mesh, P("x"))
        double = pw.function(lambda b: b * 2, in_specs=P("x"), out_specs=P("x"))
        y = double(x)  # needs x's 40 kB and its own 40 kB on each device: waits for nothing yet
        del x  # ...but x is held until y's gang ran, so y stalls until x can go?
        np.testing.assert_array_equal(y.result(timeout=30), 2 * np.arange(2 * block))
        z = double(y)
        del y
        np.testing.assert_array_equal(z.result(timeout=30), 4 * np.arange(2 * block))
        peaks = [s["peak"] for s in tiny.device_stats()["devices"].values()]
        assert max(peaks) <= TINY.hbm
        del z
    assert_clean(tiny)
