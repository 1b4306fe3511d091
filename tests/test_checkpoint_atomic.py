"""Atomic checkpoints: a new one is committed in one step, the old one stays whole until then,
and resume refuses what was never committed, lacks chunks, or fails its checksums."""

from __future__ import annotations

import errno
import os
import subprocess
import threading

import numpy as np
import pytest
import xarray as xr

import pathdask as pw
from pathdask import P
from pathdask.worker import storage


def siblings(path):
    return sorted(n for n in os.listdir(path.parent) if n.startswith(path.name + ".pathdask-"))


def put_pair(client, mesh, value):
    """Two arrays whose every element is ``value``-derived and non-zero."""
    return {"w": client.put(np.full((8, 4), value), mesh, P("d")),
            "b": client.put(np.full(6, -value), mesh, P())}


def resumed(client, path):
    state = client.resume(path)
    return {k: v.result() for k, v in state.items()}


class Gate:
    """Hosts' chunk writes wait here until ``open()``; ``entered`` is set by the first."""

    def __init__(self, monkeypatch, fail_after=None):
        self.entered, self.opened = threading.Event(), threading.Event()
        self.writes, lock = 0, threading.Lock()
        store = storage._store

        def gated(*chunk):
            self.entered.set()
            assert self.opened.wait(30), "the test never opened the gate"
            with lock:
                if fail_after is not None and self.writes >= fail_after:
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                self.writes += 1
            return store(*chunk)

        monkeypatch.setattr(storage, "_store", gated)

    def open(self):
        self.opened.set()


def test_a_checkpoint_is_a_link_to_its_directory_swapped_when_complete(client, tmp_path):
    path = tmp_path / "state.zarr"
    mesh = client.mesh({"d": 4})
    client.suspend(path, put_pair(client, mesh, 1.0))
    first = os.readlink(path)
    client.suspend(path, put_pair(client, mesh, 2.0))
    assert path.is_symlink() and os.readlink(path) != first
    assert siblings(path) == [os.readlink(path)]  # the previous directory went with the commit
    got = resumed(client, path)
    np.testing.assert_array_equal(got["w"], np.full((8, 4), 2.0))
    np.testing.assert_array_equal(xr.open_zarr(path)["b"].values, np.full(6, -2.0))


def test_an_unfinished_checkpoint_is_never_confused_with_the_committed_one(client, tmp_path, monkeypatch):
    path = tmp_path / "state.zarr"
    mesh = client.mesh({"d": 4})
    client.suspend(path, put_pair(client, mesh, 1.0))
    gate = Gate(monkeypatch)
    future = client.checkpoint(path, put_pair(client, mesh, 2.0))
    assert gate.entered.wait(30)
    (writing,) = set(siblings(path)) - {os.readlink(path)}
    with pytest.raises(pw.CheckpointIncompleteError, match="no pathdask commit record.*interrupted suspend"):
        client.resume(tmp_path / writing)
    np.testing.assert_array_equal(resumed(client, path)["w"], np.full((8, 4), 1.0))  # the old one, whole
    gate.open()
    assert future.result(timeout=30) == ["w", "b"]
    assert os.readlink(path) == writing and siblings(path) == [writing]
    np.testing.assert_array_equal(resumed(client, path)["w"], np.full((8, 4), 2.0))


def test_a_full_disk_on_a_host_leaves_the_previous_checkpoint_whole(client, tmp_path, monkeypatch):
    path = tmp_path / "state.zarr"
    mesh = client.mesh({"d": 4})
    client.suspend(path, put_pair(client, mesh, 1.0))
    before = os.readlink(path)
    gate = Gate(monkeypatch, fail_after=1)  # one chunk lands, then the disk is full
    gate.open()
    with pytest.raises(pw.CheckpointWriteError, match="could not write its shards.*still holds the previous") as e:
        client.suspend(path, put_pair(client, mesh, 2.0))
    assert e.value.errno == errno.ENOSPC
    assert os.readlink(path) == before and siblings(path) == [before]  # the partial one is removed
    got = resumed(client, path)
    np.testing.assert_array_equal(got["w"], np.full((8, 4), 1.0))
    np.testing.assert_array_equal(got["b"], np.full(6, -1.0))


def test_a_full_disk_when_the_commit_record_is_written_commits_nothing(client, tmp_path, monkeypatch):
    from pathdask.client import checkpoint

    path = tmp_path / "state.zarr"
    mesh = client.mesh({"d": 4})
    client.suspend(path, put_pair(client, mesh, 1.0))
    before = os.readlink(path)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(checkpoint, "commit", full)
    with pytest.raises(pw.CheckpointWriteError, match="failed at its commit step.*still holds the previous") as e:
        client.suspend(path, put_pair(client, mesh, 2.0))
    assert e.value.errno == errno.ENOSPC
    assert os.readlink(path) == before and siblings(path) == [before]
    np.testing.assert_array_equal(resumed(client, path)["w"], np.full((8, 4), 1.0))


def test_a_full_disk_on_a_real_filesystem(client, tmp_path):
    """A 1 MiB tmpfs: the second, larger checkpoint does not fit; the first stays readable."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                                 capture_output=True, text=True)
        why = mounted.stderr.strip() if mounted.returncode else ""
    except FileNotFoundError as e:
        why = str(e)
    if why:
        pytest.skip(f"cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN): {why}")
    try:
        path = disk / "state.zarr"
        mesh = client.mesh({"d": 4})
        client.suspend(path, {"w": client.put(np.full((64, 64), 1.0), mesh, P("d"))})  # 32 KiB
        with pytest.raises(pw.CheckpointWriteError) as e:
            client.suspend(path, {"w": client.put(np.full((512, 512), 2.0), mesh, P("d"))})  # 2 MiB
        assert e.value.errno == errno.ENOSPC
        np.testing.assert_array_equal(resumed(client, path)["w"], np.full((64, 64), 1.0))
        assert siblings(path) == [os.readlink(path)]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_leftovers_of_interrupted_suspends_go_with_the_next_commit(client, tmp_path):
    path = tmp_path / "state.zarr"
    (tmp_path / "state.zarr.pathdask-0123456789abcdef" / "w").mkdir(parents=True)  # a killed suspend's
    os.symlink("elsewhere", tmp_path / "state.zarr.pathdask-link-0123456789abcdef")
    (tmp_path / "state.zarr.other").mkdir()  # not pathdask's: stays
    client.suspend(path, {"w": client.put(np.ones(4), client.mesh({"d": 2}), P("d"))})
    assert siblings(path) == [os.readlink(path)]
    assert (tmp_path / "state.zarr.other").is_dir()


def test_resume_names_the_chunks_a_checkpoint_lacks(client, tmp_path):
    path = tmp_path / "state.zarr"
    client.suspend(path, {"w": client.put(np.arange(8.0), client.mesh({"d": 4}), P("d"))})
    (path / "w" / "c" / "2").unlink()
    with pytest.raises(pw.CheckpointIncompleteError, match=r"lacks chunks \['c/2'\] of 4"):
        client.resume(path)
    (path / "w" / "c" / "1").write_bytes(b"\0" * 8)  # truncated: 8 of 16 bytes
    with pytest.raises(pw.CheckpointIncompleteError, match=r"wrong size, expected 16 bytes: \['c/1 \(8 bytes\)'\]"):
        client.resume(path)


def test_a_chunk_that_fails_its_checksum_fails_its_array(client, tmp_path):
    path = tmp_path / "state.zarr"
    client.suspend(path, {"w": client.put(np.arange(8.0), client.mesh({"d": 4}), P("d"))})
    chunk = path / "w" / "c" / "3"
    chunk.write_bytes(np.array([6.0, 99.0]).tobytes())  # same size, other values
    w = client.resume(path)["w"]
    with pytest.raises(pw.CheckpointCorruptError, match="Chunk c/3 of array 'w'.*has CRC-32 .*its commit record says"):
        w.result()


def test_resume_refuses_a_checkpoint_without_a_commit_record(client, tmp_path):
    import zarr

    zarr.open_group(tmp_path / "bare.zarr", mode="w").create_array("w", shape=(4,), dtype="f8")
    with pytest.raises(pw.CheckpointIncompleteError, match="no pathdask commit record"):
        client.resume(tmp_path / "bare.zarr")
    zarr.open_group(tmp_path / "old.zarr", mode="w").attrs["pathdask"] = {"format": 1, "arrays": {}, "meshes": []}
    with pytest.raises(pw.CheckpointError, match="format 1.*cannot be told complete"):
        client.resume(tmp_path / "old.zarr")


def test_suspend_does_not_overwrite_what_is_not_a_checkpoint_link(client, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    w = client.put(np.ones(4), client.mesh({"d": 2}), P("d"))
    with pytest.raises(pw.CheckpointError, match="it is a directory, not a checkpoint link.*move it away"):
        client.suspend(tmp_path / "data", {"w": w})
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me" and w.status != "deleted"
    (tmp_path / "empty").mkdir()  # an empty directory is taken
    client.suspend(tmp_path / "empty", {"w": w})
    np.testing.assert_array_equal(resumed(client, tmp_path / "empty")["w"], np.ones(4))


def test_blocks_equal_to_the_fill_value_are_written_and_checked(client, tmp_path):
    path = tmp_path / "zeros.zarr"
    client.suspend(path, {"z": client.put(np.zeros((4, 2)), client.mesh({"d": 2}), P("d")),
                          "s": client.put(np.float64(0.0), client.mesh({"d": 2}), P())})
    assert sorted(os.listdir(path / "z" / "c")) == ["0", "1"]
    got = resumed(client, path)
    np.testing.assert_array_equal(got["z"], np.zeros((4, 2)))
    assert got["s"] == 0.0


def test_resume_onto_a_mesh_of_another_shape_checks_every_chunk_it_reads(client, tmp_path):
    path = tmp_path / "state.zarr"
    w0 = np.arange(32.0).reshape(8, 4)
    client.suspend(path, {"w": client.put(w0, client.mesh({"d": 2}), P("d"))})
    for shape in ({"d": 1}, {"d": 4}):  # a block spans both chunks; half of one
        np.testing.assert_array_equal(client.resume(path, mesh=client.mesh(shape))["w"].result(), w0)
    (path / "w" / "c" / "1" / "0").write_bytes(np.zeros(16).tobytes())
    with pytest.raises(pw.CheckpointCorruptError, match="Chunk c/1/0"):
        client.resume(path, mesh=client.mesh({"d": 1}))["w"].result()
