"""The pipeline schedules, GPipe and 1F1B, and the clock that orders a pipeline's calls.

:func:`schedule_table` gives each stage's order of forwards and backwards;
:func:`simulate` times them on a clock (a forward takes 1 unit, a backward 2);
:func:`trace_order` turns those times into the order in which a
:class:`~pathdask.pipeline.Pipeline` calls its gangs and moves.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PipelineError

__all__ = ["SCHEDULES", "Step", "schedule_table", "simulate", "trace_order"]

#: the schedules a :class:`~pathdask.pipeline.Pipeline` runs
SCHEDULES = ("gpipe", "1f1b")

Step = tuple[str, int]  # ("F" | "B", microbatch)


def schedule_table(stages: int, microbatches: int, schedule: str) -> list[list[Step]]:
    """Per stage, the order of its steps ``("F" | "B", microbatch)`` under ``schedule``."""
    if schedule not in SCHEDULES:
        raise PipelineError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    table: list[list[Step]] = []
    for s in range(stages):
        if schedule == "gpipe":
            table.append([("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)])
            continue
        warmup = min(stages - s - 1, microbatches)
        steps: list[Step] = [("F", m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            steps += [("F", warmup + i), ("B", i)]
        steps += [("B", m) for m in range(microbatches - warmup, microbatches)]
        table.append(steps)
    return table


def simulate(table: Sequence[Sequence[Step]], forward: float = 1.0,
             backward: float = 2.0) -> dict[tuple[str, int, int], tuple[float, float]]:
    """``(start, end)`` of each step ``(kind, stage, microbatch)`` on a clock.

    Each stage runs its steps in table order, one at a time; ``F(s, m)`` waits for
    ``F(s-1, m)`` and ``B(s, m)`` for ``B(s+1, m)`` and ``F(s, m)``.
    """
    n = len(table)
    times: dict[tuple[str, int, int], tuple[float, float]] = {}
    pos, free = [0] * n, [0.0] * n
    left = sum(len(t) for t in table)
    while left:
        progressed = False
        for s in range(n):
            while pos[s] < len(table[s]):
                kind, m = table[s][pos[s]]
                if kind == "F":
                    deps = [("F", s - 1, m)] if s > 0 else []
                else:
                    deps = [("F", s, m)] + ([("B", s + 1, m)] if s + 1 < n else [])
                if any(d not in times for d in deps):
                    break
                start = max([free[s]] + [times[d][1] for d in deps])
                end = start + (forward if kind == "F" else backward)
                times[(kind, s, m)] = (start, end)
                free[s], pos[s], left, progressed = end, pos[s] + 1, left - 1, True
        if not progressed:
            stuck = {s: table[s][pos[s]] for s in range(n) if pos[s] < len(table[s])}
            raise PipelineError(f"The schedule cannot proceed: each stage's next step waits for another {stuck}")
    return times


def trace_order(table: Sequence[Sequence[Step]]) -> list[tuple[str, int, int]]:
    """The trace order: steps by simulated start time, each move at the end of the step that makes it.

    A backward's gradient accumulation (``"acc"``) also comes at its end, after
    the move of its ``dx``. At equal times moves come first (a stage sends what
    it made before it goes on), then accumulations, then steps; lower stages first.
    """
    n = len(table)
    timed: list[tuple[float, int, int, str, int]] = []
    for (kind, s, m), (start, end) in simulate(table).items():
        timed.append((start, 2, s, kind, m))
        if kind == "F" and s + 1 < n:
            timed.append((end, 0, s, "sendF", m))
        elif kind == "B":
            timed.append((end, 1, s, "acc", m))
            if s > 0:
                timed.append((end, 0, s, "sendB", m))
    timed.sort()
    return [(kind, s, m) for _, _, s, kind, m in timed]
