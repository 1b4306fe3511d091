"""Both host-to-host data paths move real bytes and give the same results."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


@pytest.mark.parametrize("chunk", ["8MiB", "1000B"])
@pytest.mark.parametrize("transport", ["socket", "dask"])
def test_transports(transport, chunk):
    """With a tiny ``pathdask.transfer-chunk``, every piece between hosts streams in chunks, and
    a strided piece (a column slice) is cut inside its rows."""
    with dask.config.set({"pathdask.transport": transport, "pathdask.transfer-chunk": chunk}), \
            pw.LocalSystem(SMALL, processes=False, dashboard_address=None) as system:
        with system.client(name=transport) as client:
            m0, m1 = client.mesh({"x": 4}, island=0), client.mesh({"x": 4}, island=1)
            rng = np.random.default_rng(5)
            x = rng.normal(size=(8, 1000))  # pieces big enough to go out of band
            a = client.put(x, m0, P("x"))
            gathered = pw.function(lambda b: pw.all_gather(b, "x", tiled=True), in_specs=P("x"),
                                   out_specs=P())(a)
            np.testing.assert_array_equal(gathered.result(), x)
            moved = pw.function(lambda b: b, in_specs=P(None, "x"), out_specs=P(None, "x"))(a, mesh=m1)
            np.testing.assert_array_equal(moved.result(), x)
            links = system.device_stats()["links"]
            assert links["dcn"]["bytes"] == x.nbytes
            assert links["ici"]["bytes"] > 0 and links["same_host"]["bytes"] > 0
            del a, gathered, moved
            partial = client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].reassembly.partial)
            assert all(not p for p in partial.values()), partial
        assert_clean(system)
