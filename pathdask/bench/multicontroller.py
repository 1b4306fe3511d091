"""The multi-controller baseline: every host runs the same loop itself (the JAX analogue).

There is no central dispatch: through ``client.run``, each host registers the
same sequence of programs with its own runtime, in the same order, under the
same program ids, so that the gangs meet in their collectives. The data plane
(device streams, exchanges, link models) is exactly pathdask's.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from ..client.lowering import lower
from ..client.program import ProgramFunction

if TYPE_CHECKING:
    from ..client.array import ShardedArray
    from ..client.client import Client


async def _host_loop(plans: dict[str, Any], inputs: tuple[tuple[str, int], ...], iterations: int,
                     tag: str, output_vid: int, dask_worker: Any = None) -> tuple[float, float] | None:
    """On one host: register ``iterations`` programs, each reading the previous one's output."""
    rt = dask_worker.plugins["pathdask"]
    plan = plans.get(dask_worker.address)
    if plan is None:
        return None
    start = time.perf_counter()
    prev: str | None = None
    for i in range(iterations):
        pid = f"{tag}-{i}"
        rt.register(pid, plan, inputs, tag)
        if prev is not None:
            rt.release_output(prev, 0)  # the next program's readers keep it alive
        inputs, prev = ((pid, output_vid),), pid
    assert prev is not None
    await rt.wait_program(prev)
    end = time.perf_counter()
    rt.release_output(prev, 0)
    return start, end


def run_multicontroller(client: Client, fn: ProgramFunction, x: ShardedArray, iterations: int) -> float:
    """Seconds for every host to run ``fn`` ``iterations`` times, chained through its output.

    ``fn`` is a ``@pathdask.program`` of one argument and one output of the same
    sharding, so its output can feed its next call.
    """
    program = fn.trace(x)
    if program.n_inputs != 1 or len(program.outputs) != 1:
        raise ValueError("the multi-controller baseline runs programs of one input and one output")
    plans = lower(program)
    tag = f"mc-{uuid.uuid4().hex[:12]}"
    spans = client.dask.run(_host_loop, plans, (x.key,), iterations, tag, program.outputs[0],
                            workers=list(plans))
    done = [s for s in spans.values() if s is not None]
    return max(e for _, e in done) - min(s for s, _ in done)
