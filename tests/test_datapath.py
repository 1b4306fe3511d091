"""Data goes from the client to the hosts directly: a put's blocks never pass the scheduler."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pathdask import P


def _graph_bytes(dask_scheduler) -> int:
    """What the scheduler holds of every task it knows (their run specs, pickled), in bytes."""
    from distributed.protocol.pickle import dumps

    return sum(len(dumps(ts.run_spec)) for ts in dask_scheduler.tasks.values())


@pytest.mark.slow
def test_a_64_mib_put_adds_almost_nothing_to_the_scheduler(system, client):
    mesh = client.mesh({"d": 4})
    data = np.random.default_rng(0).normal(size=(8 * 2**20 // 8, 8))  # 64 MiB
    assert data.nbytes == 64 * 2**20
    before = client.dask.run_on_scheduler(_graph_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Dask's "Sending large graph" warning would fail the test
        x = client.put(data, mesh, P("d"))
        during = client.dask.run_on_scheduler(_graph_bytes)
        np.testing.assert_array_equal(x.result(timeout=60), data)
    assert during - before < 2**20, f"the scheduler holds {during - before} bytes more for a 64 MiB put"
    replicated = client.put(data[:1024], mesh, P())  # one copy per host, not per device
    np.testing.assert_array_equal(replicated.result(timeout=60), data[:1024])
    del x, replicated
