"""A small soak in CI: several clients, random programs under proportional share."""

from __future__ import annotations

import json

import pytest

from pathdask.bench import soak


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_small_soak(tmp_path, seed):
    cfg = soak.Config.small()
    cfg.seed = seed
    result = soak.run(cfg, out=str(tmp_path), echo=lambda s: None, processes=False)
    assert result["programs_checked"] == [cfg.programs] * cfg.clients  # each matched NumPy
    assert result["bytes_left"] == 0 and not result["errors"]
    assert json.loads((tmp_path / "soak.json").read_text())["programs_checked"] == result["programs_checked"]
