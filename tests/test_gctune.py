"""The collector's thresholds are tuned while a system runs in this process, and put back after."""

from __future__ import annotations

import gc

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P, gctune

from .conftest import SMALL


def test_tune_nests_and_restores():
    before = gc.get_threshold()
    with dask.config.set({"pathdask.gc-threshold": [40000, 15, 12]}):
        first = gctune.tune()
        second = gctune.tune()  # a second user (a host runtime in the scheduler's process)
        assert gc.get_threshold() == (40000, 15, 12)
        second.release()
        assert gc.get_threshold() == (40000, 15, 12)  # one user left
        second.release()  # released twice: it does not count the other user out
        assert gc.get_threshold() == (40000, 15, 12)
        first.release()
    assert gc.get_threshold() == before
    first.release()  # one too many: nothing to put back
    assert gc.get_threshold() == before


def test_null_leaves_the_interpreter_alone_and_bad_values_are_named():
    before = gc.get_threshold()
    with dask.config.set({"pathdask.gc-threshold": None}):
        gctune.tune().release()
        assert gc.get_threshold() == before
    with dask.config.set({"pathdask.gc-threshold": [0, 10]}), pytest.raises(ValueError, match="three positive"):
        gctune.tune()
    assert gc.get_threshold() == before


def test_an_embedded_system_tunes_while_it_runs_and_puts_back_after():
    before = gc.get_threshold()
    wanted = tuple(dask.config.get("pathdask.gc-threshold"))
    assert wanted != before
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        assert gc.get_threshold() == wanted
        client = system.client(name="gc")
        mesh = client.mesh({"x": 2})
        np.testing.assert_array_equal(client.put(np.ones(2), mesh, P("x")).result(), np.ones(2))
        client.close()
    assert gc.get_threshold() == before
