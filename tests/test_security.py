"""The host-to-host transport honours Dask's security: TLS with Dask's certificates, and no
unpickling of anything a peer without the host token sends."""

from __future__ import annotations

import pickle
import socket
import struct

import numpy as np
import pytest

import pathdask as pw
from pathdask import P

from .conftest import SMALL, assert_clean


@pw.function(in_specs=P("x"), out_specs=P())
def total(b):
    return pw.psum(b, "x")


def _read_until_closed(s: socket.socket) -> None:
    """Wait for the host to close the connection (it counts the refusal first)."""
    s.settimeout(30)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass


def _rejected(client: pw.Client, addr: str) -> int:
    return client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].peers.transport.rejected,
                           workers=[addr])[addr]


def _transport_of(client: pw.Client, addr: str) -> str:
    return client.dask.run(lambda dask_worker: dask_worker.plugins["pathdask"].peers.address,
                           workers=[addr])[addr]


@pytest.mark.slow
def test_a_system_with_tls_moves_pieces_over_tls():
    with pw.LocalSystem(SMALL, processes=True, dashboard_address=None, security=True) as system:
        assert system.scheduler_address.startswith("tls://")
        assert system.client_address == system.scheduler_address  # TLS covers the client's comm too
        with system.client(name="secure") as client:
            mesh = client.mesh({"x": 4}, island=0)
            assert len(mesh.hosts) == 2
            x = client.put(np.arange(4.0), mesh, P("x"))
            np.testing.assert_array_equal(total(x).result(timeout=60), [6.0])
            # a plain TCP peer cannot even start: the handshake fails before any byte is read
            host, port = _transport_of(client, mesh.hosts[0]).rsplit(":", 1)
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"\x00" * 64)
                _read_until_closed(s)
            assert _rejected(client, mesh.hosts[0]) == 1
            np.testing.assert_array_equal(total(x).result(timeout=60), [6.0])
            del x
        assert_clean(system)


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled a stranger')",))


def test_a_peer_without_the_token_is_cut_off_before_unpickling(system):
    with system.client(name="guarded") as client:
        mesh = client.mesh({"x": 4}, island=0)
        target = mesh.hosts[0]
        host, port = _transport_of(client, target).rsplit(":", 1)
        payload = pickle.dumps(("xfer", [Boom()]))
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"\x00" * 32 + struct.pack("!II", len(payload), 0) + payload)
            _read_until_closed(s)
        assert _rejected(client, target) == 1
        x = client.put(np.arange(4.0), mesh, P("x"))
        np.testing.assert_array_equal(total(x).result(timeout=30), [6.0])  # still serving its peers
        del x
