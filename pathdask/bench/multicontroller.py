"""The multi-controller baseline: every host runs the same loop itself (the JAX analogue).

There is no central dispatch: through ``client.run``, each host registers the
same sequence of programs with its own runtime, in the same order, under the
same program ids, so that the gangs meet in their collectives. The data plane
(device streams, exchanges, link models) is exactly pathdask's; no scheduler hears of
these programs, not even of their ends (``HostCore.run_alone``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..client.lowering import lower
from ..client.program import ProgramFunction

if TYPE_CHECKING:
    from ..client.array import ShardedArray
    from ..client.client import Client


#: seconds a host waits for its last program before the run is given up: with no scheduler,
#: nothing ends the programs of a host whose peer was lost (their collectives wait for it)
TIMEOUT = 600.0


async def _host_loop(plans: dict[str, Any], inputs: tuple[tuple[str, int], ...], iterations: int,
                     tag: str, output_vid: int, timeout: float = TIMEOUT,
                     dask_worker: Any = None) -> tuple[float, float] | None:
    """On one host: register ``iterations`` programs, each reading the previous one's output.
    Past ``timeout`` seconds, they are dropped here and ``TimeoutError`` is raised."""
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
    try:
        await asyncio.wait_for(rt.wait_program(prev), timeout)
        end = time.perf_counter()
    except TimeoutError:
        error = TimeoutError(f"the multi-controller run {tag} did not end on host {dask_worker.address} within "
                             f"{timeout:g}s (a peer lost or stalled?); its programs were dropped there")
        rt.apply(rt.core.drop_client(tag, error))
        raise error from None
    finally:
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
