"""The main job: ``graphs/mlp.py`` against its NumPy reference, and ``pathdask demo`` end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import pathdask as pw
from graphs import mlp
from pathdask import P
from pathdask.cli import main
from pathdask.demo import RTOL, load_graph
from pathdask.topology import LINK_CLASSES

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "cluster" / "local.yaml"  # 2 islands x 2 hosts x 2 devices


def assert_no_buffers(system: pw.LocalSystem) -> dict:
    """Wait for the stores to empty (arrays released) and check that every device holds 0 bytes."""
    stats = system.wait_idle(timeout="10s")
    for dev, s in stats["devices"].items():
        assert s["bytes_in_use"] == 0, f"device {dev} still holds {s['bytes_in_use']} bytes"
    return stats


# -- graphs.mlp on an in-process system ----------------------------------------------
def test_reference_gradient_is_the_loss_gradient():
    """The NumPy reference itself: one SGD step moves by -lr times the finite-difference gradient."""
    p = mlp.make_problem(seed=5, batch=8, d_in=3, hidden=4, d_out=2)
    x, y, w1, w2 = p["x"], p["y"], p["w1"], p["w2"]
    lr, eps = 0.1, 1e-6

    def numeric(w, which):
        g = np.zeros_like(w)
        for ix in np.ndindex(*w.shape):
            up, down = w.copy(), w.copy()
            up[ix] += eps
            down[ix] -= eps
            args = {"w1": (up, w2), "w2": (w1, up)}[which], {"w1": (down, w2), "w2": (w1, down)}[which]
            g[ix] = (mlp.reference_mse(x, y, *args[0]) - mlp.reference_mse(x, y, *args[1])) / (2 * eps)
        return g

    losses, new_w1, new_w2 = mlp.reference_train(x, y, w1, w2, steps=1, lr=lr)
    assert losses[0] == pytest.approx(mlp.reference_mse(x, y, w1, w2))
    np.testing.assert_allclose((w1 - new_w1) / lr, numeric(w1, "w1"), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose((w2 - new_w2) / lr, numeric(w2, "w2"), rtol=1e-6, atol=1e-9)


def test_train_matches_numpy_reference(system, client):
    mesh = client.mesh(mlp.MESH_SHAPE, island=0)
    eval_mesh = client.mesh(mlp.MESH_SHAPE, island=1)
    before = system.device_stats()["links"]["dcn"]["bytes"]
    calls = []
    out = mlp.train(client, 6, mesh=mesh, eval_mesh=eval_mesh, seed=3, log_every=2,
                    progress=lambda k, loss: calls.append((k, loss)))

    ref = out["reference"]
    np.testing.assert_allclose(out["losses"], ref["losses"], rtol=1e-12)
    np.testing.assert_allclose(out["w1"], ref["w1"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["w2"], ref["w2"], rtol=1e-12, atol=1e-15)
    assert out["eval_loss"] == pytest.approx(ref["eval_loss"], rel=1e-12)
    assert out["rel_diff"] <= 1e-12 and out["max_abs_diff"] <= 1e-12
    assert np.all(np.diff(out["losses"]) < 0), out["losses"]  # it learns
    # Losses are fetched only every log_every steps; progress still hears of every step.
    assert [k for k, _ in calls] == [1, 2, 3, 4, 5, 6]
    assert [k for k, loss in calls if loss is not None] == [2, 4, 6]
    assert calls[-1][1] == out["losses"][-1]
    assert out["gangs"] == 6 * 4 + 3  # four gangs a step; evaluation moves w1, w2 then runs mse
    stats = assert_no_buffers(system)
    assert stats["links"]["dcn"]["bytes"] > before  # the weights crossed to the other island


def test_train_step_keeps_weights_sharded(system, client):
    """A step is one program of four gangs whose weight outputs stay on the devices, sharded."""
    mesh = client.mesh(mlp.MESH_SHAPE)
    p = mlp.make_problem(seed=1, batch=8, d_in=4, hidden=8, d_out=2)
    x = client.put(p["x"], mesh, P("data", None))
    y = client.put(p["y"], mesh, P("data", None))
    w1 = client.put(p["w1"], mesh, P(None, "model"))
    w2 = client.put(p["w2"], mesh, P("model", None))
    step = mlp.make_train_step(lr=0.3)
    assert [g.name for g in step.trace(x, y, w1, w2).gangs] == ["forward", "loss_and_grad", "backward", "sgd"]

    a1, a2, loss1 = step(x, y, w1, w2)
    b1, b2, loss2 = step(x, y, a1, a2)  # fed back as futures, never fetched in between
    assert (b1.spec, b2.spec, loss2.shape) == (P(None, "model"), P("model", None), ())
    assert b1.mesh == mesh and b2.mesh == mesh
    ref_losses, ref_w1, ref_w2 = mlp.reference_train(p["x"], p["y"], p["w1"], p["w2"], steps=2, lr=0.3)
    np.testing.assert_allclose([loss1.result(), loss2.result()], ref_losses, rtol=1e-12)
    np.testing.assert_allclose(b1.result(), ref_w1, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(b2.result(), ref_w2, rtol=1e-12, atol=1e-15)
    for a in (x, y, w1, w2, a1, a2, loss1, b1, b2, loss2):
        a.delete()
    assert_no_buffers(system)


def test_train_rejects_bad_arguments(client):
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        mlp.train(client, 0)
    with pytest.raises(ValueError, match="log_every must be >= 1, got 0"):
        mlp.train(client, 2, log_every=0)


# -- pathdask demo ---------------------------------------------------------------------
def check_demo_output(output: str, topology: pw.Topology) -> None:
    """The summary has every device and link class, and the run matched NumPy."""
    m = re.search(r"relative (\S+) <= (\S+): match", output)
    assert m, output
    assert float(m.group(1)) <= RTOL and float(m.group(2)) == RTOL
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 8 and cells[0].isdigit():
            rows[int(cells[0])] = cells
    assert sorted(rows) == list(range(topology.num_devices)), output
    for dev, cells in rows.items():
        assert cells[-2:] == ["0", "B"], f"device {dev} still holds buffers: {cells}"  # HBM now
        assert int(cells[4]) > 0, f"device {dev} ran no gang: {cells}"
    for cls in LINK_CLASSES:
        m = re.search(rf"^{cls}\s+(\S+ \S+)\s+(\d+)$", output, re.MULTILINE)
        assert m, f"no {cls} row in\n{output}"
        assert int(m.group(2)) > 0, f"no transfer over {cls}"
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+/status$", output, re.MULTILINE), output


def test_demo_in_process():
    result = CliRunner().invoke(main, ["demo", "--threads", "--steps", "3", "--topology", str(TOPOLOGY)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    check_demo_output(result.stdout, pw.Topology.load(TOPOLOGY))
    assert "3/3" in result.output  # the progress bar got to the end


def test_demo_with_processes_from_another_folder(tmp_path):
    """Worker processes, and graphs/ found although the working folder is not the repository."""
    proc = subprocess.run(
        [sys.executable, "-m", "pathdask.cli", "demo", "--steps", "2", "--no-progress", "--seed", "7"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "worker processes" in proc.stdout
    check_demo_output(proc.stdout, pw.system.default_topology())


def test_demo_exits_1_when_numpy_disagrees(monkeypatch):
    real = mlp.reference_train

    def off_by_a_little(*args, **kwargs):
        losses, w1, w2 = real(*args, **kwargs)
        return losses, w1 * (1 + 1e-5), w2

    monkeypatch.setattr(mlp, "reference_train", off_by_a_little)
    result = CliRunner().invoke(main, ["demo", "--threads", "--steps", "2", "--no-progress"])
    assert result.exit_code == 1
    assert "MISMATCH" in result.stdout
    assert "Error: the sharded result does not match NumPy" in result.output


def test_demo_says_when_islands_are_too_small(tmp_path):
    topo = tmp_path / "tiny.yaml"
    topo.write_text("topology: {islands: 2, hosts_per_island: 1, devices_per_host: 2}\n")
    result = CliRunner().invoke(main, ["demo", "--threads", "--topology", str(topo)])
    assert result.exit_code == 1
    assert "Error: The demo trains on a mesh" in result.output
    assert "at least 4 devices per island" in result.output


def test_load_graph_names_the_missing_file():
    assert load_graph("mlp") is mlp
    with pytest.raises(ModuleNotFoundError, match=r"graphs/ folder .* no .*no_such_graph\.py"):
        load_graph("no_such_graph")


def test_cli_entry_point_and_help():
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "pathdask"]
    assert ep.value == "pathdask.cli:main"
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--topology", "--steps", "--processes / --threads", "--seed"):
        assert option in result.output
