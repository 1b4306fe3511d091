"""Ctrl-C ends a long run with one short message and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

PATHDASK = str(Path(sys.executable).with_name("pathdask"))


@pytest.mark.slow
def test_ctrl_c_ends_the_demo_with_one_line_and_no_processes_left():
    proc = subprocess.Popen([PATHDASK, "demo", "--steps", "1000000", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the cluster is up once the demo prints its dashboard
            if line.startswith("dashboard:"):
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the demo started no worker processes"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()  # a process this test started, by its PID
    assert proc.returncode == 130
    assert err.strip() == "Interrupted; the cluster was shut down.", err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [c.pid for c in alive]
