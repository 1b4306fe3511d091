"""Run the tutorial notebooks top to bottom in a fresh kernel, as CI does.

.. code-block:: bash

    .venv/bin/python tutorials/execute.py                 # run them all; fail on the first error
    .venv/bin/python tutorials/execute.py --write 01-first-program.ipynb   # and store the outputs

Each notebook runs in its own kernel on this interpreter (whatever Jupyter
kernels the machine has installed), from the ``tutorials/`` folder, with a
time limit per cell. A last check, run in the same kernel after the notebook's
own cells, fails the run if the notebook left a process behind: a notebook
must stop every cluster and command it started.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

__all__ = ["CELL_TIMEOUT", "LEFTOVER_CHECK", "execute", "notebooks"]

HERE = Path(__file__).resolve().parent

#: seconds one cell may run; a notebook as a whole aims for well under two minutes
CELL_TIMEOUT = 120

#: run after the last cell: the kernel's child processes that are still there
LEFTOVER_CHECK = """\
import psutil as _psutil

def _leftovers():
    found = []
    for p in _psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except _psutil.Error:  # ended meanwhile
            continue
        if "multiprocessing.resource_tracker" not in cmd:  # Python's own helper, shared by all
            found.append(f"{p.pid}: {cmd[:200]}")
    return found

if _leftovers():
    raise RuntimeError(f"The notebook left processes behind: {_leftovers()}")
"""

#: what a stored notebook says it runs on (any Python 3 kernel with pathdask installed)
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


class ThisPython(AsyncKernelManager):
    """A kernel manager whose kernel is this interpreter, not whatever ``python3`` means on PATH."""

    @property
    def kernel_spec(self) -> KernelSpec:
        from ipykernel.kernelspec import get_kernel_dict

        spec = get_kernel_dict()
        spec.pop("kernel_protocol_version", None)
        return KernelSpec(resource_dir="", **spec)


def notebooks() -> list[Path]:
    """The tutorials, in reading order."""
    return sorted(HERE.glob("[0-9][0-9]-*.ipynb"))


def execute(path: Path, *, write: bool = False, timeout: int = CELL_TIMEOUT) -> float:
    """Run the notebook at ``path`` in a fresh kernel; returns its seconds.

    Raises ``nbclient.exceptions.CellExecutionError`` (with the cell's traceback)
    when a cell fails, ``CellTimeoutError`` when one runs past ``timeout``, and
    the leftover check's error when processes are left behind. With ``write``,
    the outputs are stored in the file.
    """
    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell(LEFTOVER_CHECK)
    nb.cells.append(probe)
    client = NotebookClient(nb, timeout=timeout, kernel_manager_class=ThisPython, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        nb.cells.remove(probe)
    seconds = time.perf_counter() - start
    if write:
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
        nbformat.validate(nb)
        nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: all of tutorials/)")
    parser.add_argument("--write", action="store_true", help="store the outputs in the notebooks")
    args = parser.parse_args(argv)
    paths = [HERE / Path(n).name for n in args.names] if args.names else notebooks()
    total = 0.0
    for path in paths:
        seconds = execute(path, write=args.write)
        total += seconds
        print(f"{path.name}: {seconds:.1f} s{' (outputs stored)' if args.write else ''}")
    print(f"{len(paths)} notebook(s) in {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
