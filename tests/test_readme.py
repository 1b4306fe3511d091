"""The README's first program runs verbatim as a script, from any directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def first_program() -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"```python\n(import numpy as np\n.*?)```", readme, re.S)
    assert found, "the README has no first program"
    return found.group(1)


@pytest.mark.slow
def test_first_program_runs_as_a_script_from_another_directory(tmp_path):
    script = tmp_path / "first.py"
    script.write_text(first_program())
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.count("[1. 1. 1. 1.]") == 8
    assert "'same_host'" in proc.stdout
