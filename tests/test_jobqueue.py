"""The same preload on dask-jobqueue: the job script every SLURM job runs carries it."""

from __future__ import annotations

import pytest

dask_jobqueue = pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (the test extra has it)")


def test_slurm_job_script_carries_the_preload_and_the_scheduler_has_the_plugin():
    cluster = dask_jobqueue.SLURMCluster(
        cores=2, processes=1, memory="4GB",  # one worker per job: one host
        scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0",
                           "preload": ["pathdask.preload"], "preload_argv": ["--pathdask-topology", "local"]},
        worker_extra_args=["--preload", "pathdask.preload"],
        job_script_prologue=["export DASK_PATHDASK__HOST_TIMEOUT=10s"],
    )
    try:
        script = cluster.job_script()
        worker_line = next(line for line in script.splitlines() if "dask_worker" in line or "dask worker" in line)
        assert worker_line.split()[-2:] == ["--preload", "pathdask.preload"], worker_line
        assert "--nthreads 2" in worker_line and "--nworkers" not in worker_line  # one process per job
        assert any(word.startswith("tcp://127.0.0.1:") for word in worker_line.split())  # the scheduler
        assert "export DASK_PATHDASK__HOST_TIMEOUT=10s" in script
        assert "pathdask" in cluster.scheduler.plugins  # the scheduler loaded the preload too
        assert cluster.scheduler.plugins["pathdask"].topology.num_hosts == 4
    finally:
        cluster.close()
