"""The collector's thresholds and the switch interval are tuned while a system runs in this process,
and put back after."""

from __future__ import annotations

import gc
import sys

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P, tuning

from .conftest import SMALL


def test_tune_nests_and_restores():
    before = gc.get_threshold()
    with dask.config.set({"pathdask.gc-threshold": [40000, 15, 12]}):
        first = tuning.tune()
        second = tuning.tune()  # a second user (a host runtime in the scheduler's process)
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
    before, switch = gc.get_threshold(), sys.getswitchinterval()
    with dask.config.set({"pathdask.gc-threshold": None, "pathdask.switch-interval": None}):
        tuning.tune().release()
        assert gc.get_threshold() == before and sys.getswitchinterval() == switch
    with dask.config.set({"pathdask.gc-threshold": [0, 10]}), pytest.raises(ValueError, match="three positive"):
        tuning.tune()
    with dask.config.set({"pathdask.switch-interval": "0s"}), pytest.raises(ValueError, match="positive duration"):
        tuning.tune()
    assert gc.get_threshold() == before and sys.getswitchinterval() == switch


def test_the_switch_interval_is_set_while_held_and_put_back_alone():
    switch = sys.getswitchinterval()
    with dask.config.set({"pathdask.gc-threshold": None, "pathdask.switch-interval": "200us"}):
        held = tuning.tune()
        assert sys.getswitchinterval() == pytest.approx(200e-6, abs=2e-6)
        held.release()
    assert sys.getswitchinterval() == switch


def test_a_host_process_takes_the_workers_switch_interval():
    switch = sys.getswitchinterval()
    with dask.config.set({"pathdask.gc-threshold": None, "pathdask.worker.switch-interval": "300us"}):
        held = tuning.tune("pathdask.worker.switch-interval")
        assert sys.getswitchinterval() == pytest.approx(300e-6, abs=2e-6)
        held.release()
    assert sys.getswitchinterval() == switch
    with dask.config.set({"pathdask.worker.switch-interval": "0ms"}), \
            pytest.raises(ValueError, match="pathdask.worker.switch-interval must be a positive duration"):
        tuning.tune("pathdask.worker.switch-interval")


def test_an_embedded_system_tunes_while_it_runs_and_puts_back_after():
    before, switch = gc.get_threshold(), sys.getswitchinterval()
    wanted = tuple(dask.config.get("pathdask.gc-threshold"))
    assert wanted != before
    with pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        assert gc.get_threshold() == wanted
        assert sys.getswitchinterval() == pytest.approx(50e-6, abs=2e-6)
        client = system.client(name="gc")
        mesh = client.mesh({"x": 2})
        np.testing.assert_array_equal(client.put(np.ones(2), mesh, P("x")).result(), np.ones(2))
        client.close()
    assert gc.get_threshold() == before and sys.getswitchinterval() == switch
