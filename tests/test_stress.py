"""The randomised stress harness in CI: fresh systems, random tenants and chaos; nothing hangs."""

from __future__ import annotations

import json

import pytest

from pathdask.bench import stress


@pytest.mark.slow
def test_small_stress(tmp_path):
    result = stress.run(stress.Config.small(), out=str(tmp_path), echo=lambda s: None)
    summary = result["summary"]
    problems = [(r["seed"], r["hang_reason"], r["diagnosis"], r["wrong"], r["leftover_error"])
                for r in result["runs"] if r["hang"] or r["wrong"] or r["bytes_left"] or r["leftover_error"]]
    assert summary["runs"] == stress.Config.small().runs
    assert summary["runs_with_hangs"] == 0, problems
    assert summary["wrong_results"] == 0, problems
    assert summary["runs_with_bytes_left"] == 0, problems
    assert summary["programs_checked"] > 0
    assert json.loads((tmp_path / "stress.json").read_text())["summary"] == json.loads(json.dumps(summary))
