"""The plugins install every handler under the pathdask_ prefix, on the scheduler and each worker."""

from __future__ import annotations

from pathdask.scheduler.plugin import HANDLERS

WORKER_HANDLERS = {"pathdask_stream", "pathdask_fetch", "pathdask_save", "pathdask_message", "pathdask_plans", "pathdask_diagnose", "pathdask_status", "pathdask_stats", "pathdask_wait_idle",
                   "pathdask_timeline", "pathdask_activity", "pathdask_reset_observations",
                   "pathdask_transfers"}
WORKER_STREAM_OPS = {"pathdask-order", "pathdask-dispatch", "pathdask-xfer", "pathdask-chunk", "pathdask-abort", "pathdask-drop-client",
                     "pathdask-release-outputs", "pathdask-drop-programs", "pathdask-host-lost",
                     "pathdask-host-joined"}


def test_every_handler_is_installed(system, client):
    on_scheduler = client.dask.run_on_scheduler(
        lambda dask_scheduler: (sorted(h for h in dask_scheduler.handlers if h.startswith("pathdask_")),
                                sorted(h for h in dask_scheduler.stream_handlers if h.startswith("pathdask-")),
                                sorted(dask_scheduler.plugins)))
    handlers, stream_ops, plugins = on_scheduler
    assert set(handlers) == set(HANDLERS)
    assert stream_ops == ["pathdask-call", "pathdask-dispatch-failed", "pathdask-program-done"]
    assert "pathdask" in plugins
    per_worker = client.dask.run(
        lambda dask_worker: (sorted(h for h in dask_worker.handlers if h.startswith("pathdask_")),
                             sorted(h for h in dask_worker.stream_handlers if h.startswith("pathdask-")),
                             "pathdask" in dask_worker.plugins))
    assert len(per_worker) == system.topology.num_hosts
    for handlers, ops, installed in per_worker.values():
        assert set(handlers) == WORKER_HANDLERS
        assert set(ops) == WORKER_STREAM_OPS
        assert installed
