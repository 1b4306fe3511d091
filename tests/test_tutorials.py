"""The tutorials in ``tutorials/`` run top to bottom in a fresh kernel and leave no process behind.

They are stored with their outputs, so that they read well on the web; this
runs each one again as ``tutorials/execute.py`` does, without writing.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent


def _load_executor():
    spec = importlib.util.spec_from_file_location("tutorials_execute", ROOT / "tutorials" / "execute.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute = _load_executor()
NOTEBOOKS = execute.notebooks()


def test_every_tutorial_is_listed_and_stored_with_its_outputs():
    assert len(NOTEBOOKS) >= 5
    listing = (ROOT / "tutorials" / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"({path.name})" in listing, f"tutorials/README.md does not link {path.name}"
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        counts = [c.execution_count for c in code]
        assert counts == list(range(1, len(code) + 1)), (
            f"{path.name} is not stored as one run from the top (execution counts {counts}); "
            f"store it with `python tutorials/execute.py --write {path.name}`"
        )
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{path.name} is stored with an error: {errors[0].get('ename')}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tutorial_runs(path: Path) -> None:
    seconds = execute.execute(path)
    print(f"{path.name} ran in {seconds:.1f} s")  # a goal (< 2 min each), not asserted


@pytest.mark.slow
def test_a_notebook_that_leaves_a_process_behind_fails(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import subprocess, sys\n"
        "code = 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)'\n"
        "proc = subprocess.Popen([sys.executable, '-c', code])\n"
        f"open({str(pid_file)!r}, 'w').write(str(proc.pid))"
    )])
    path = tmp_path / "leaky.ipynb"
    nbformat.write(nb, path)
    try:
        with pytest.raises(CellExecutionError, match="left processes behind"):
            execute.execute(path)
    finally:
        if pid_file.exists():  # the process this test had the notebook start, by its id
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
