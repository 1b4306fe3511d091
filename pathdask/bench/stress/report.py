"""The stress runs one after another: a line per run, a summary table, ``stress.json``."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from typing import Any

from ..report import table, write_json
from .harness import run_once
from .scenario import Config, Echo, plan_run


def _line(r: dict[str, Any], runs: int) -> str:
    procs = sum(c["process"] for c in r["clients"])
    chaos = ",".join(e["kind"] for e in r["chaos_events"]) or "none"
    stall = "-" if r["stall_end_s"] is None else f"{r['stall_end_s']:.2f}s"
    status = "HANG" if r["hang"] else ("FAIL" if r["wrong"] or r["bytes_left"] or r["leftover_error"] else "ok")
    return (f"run {r['run'] + 1}/{runs} seed {r['seed']}: {status}; {len(r['clients'])} client(s) ({procs} proc), "
            f"{r['policy']}, fan-out above {r.get('fanout_threshold', '-')} host(s), "
            f"jitter {r['dispatch_jitter'] * 1e3:.1f} ms, chaos {chaos}; "
            f"{r['programs_checked']} checked, {len(r['typed_failures'])} typed failure(s), "
            f"{len(r['wrong'])} wrong, {r['bytes_left']} bytes left, stall_end {stall}, {r['seconds']:.1f} s")


def _one(cfg: Config, index: int, budget: list[int | None], echo: Echo) -> dict[str, Any]:
    """Run ``index``, with its progress line and, for a failed run, what went wrong."""
    r = run_once(cfg, plan_run(cfg, index, budget), index)
    echo(_line(r, cfg.runs))
    for problem in r["wrong"][:5]:
        echo(f"  wrong: {problem}")
    if r["hang"]:
        echo(f"  hang: {r['hang_reason']}\n{r['diagnosis']}")
    if r["leftover_error"]:
        echo(f"  leftover: {r['leftover_error']}")
    return r


def summarize(runs: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    stalls = [r["stall_end_s"] for r in runs if r["stall_end_s"] is not None]
    return {
        "runs": len(runs),
        "runs_with_hangs": sum(r["hang"] for r in runs),
        "wrong_results": sum(len(r["wrong"]) for r in runs),
        "runs_with_bytes_left": sum(bool(r["bytes_left"] or r["leftover_error"]) for r in runs),
        "programs_checked": sum(r["programs_checked"] for r in runs),
        "typed_failures": sum(len(r["typed_failures"]) for r in runs),
        "max_stall_end_s": max(stalls) if stalls else None,
        "runs_per_minute": 60 * len(runs) / seconds if seconds else None,
    }


class ClosedCommFilter(logging.Filter):
    """Drops the scheduler's "Closed comm ... while trying to write" for clients closed mid-stream
    on purpose (that is the chaos); everything else is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Closed comm")


def run(cfg: Config, out: str = "bench-results", echo: Echo = print) -> dict[str, Any]:
    """Run ``cfg.runs`` fresh systems; print a line per run and a summary; write ``<out>/stress.json``.

    Returns ``{"config", "runs": [per-run reports], "summary"}``; failures are reported, not raised.
    """
    budget: list[int | None] = [cfg.process_client_budget]
    reports = []
    start = time.perf_counter()
    echo(f"pathdask bench stress: {cfg.runs} run(s), seed {cfg.seed}, "
         f"{'worker processes' if cfg.processes else 'threads'}, hang after {cfg.hang_seconds:g}s")
    quiet = ClosedCommFilter()
    logging.getLogger("distributed.scheduler").addFilter(quiet)
    try:
        for i in range(cfg.runs):
            reports.append(_one(cfg, i, budget, echo))
    finally:
        logging.getLogger("distributed.scheduler").removeFilter(quiet)
    summary = summarize(reports, time.perf_counter() - start)
    echo(table(["runs", "runs with hangs", "wrong results", "runs with bytes left", "programs checked",
                "typed failures", "max stall_end_s", "runs per minute"],
               [[summary[k] for k in ("runs", "runs_with_hangs", "wrong_results", "runs_with_bytes_left",
                                      "programs_checked", "typed_failures", "max_stall_end_s",
                                      "runs_per_minute")]]))
    result = {"config": asdict(cfg), "runs": reports, "summary": summary}
    write_json(os.path.join(out, "stress.json"), result)
    echo(f"wrote {os.path.join(out, 'stress.json')}")
    return result
