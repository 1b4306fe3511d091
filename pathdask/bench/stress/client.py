"""One stress client: the same loop in a thread or in a process of its own."""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .programs import Chain, random_chain
from .scenario import TYPED, ClientPlan, Sink

#: the chance that a submission holds the client's calls in one batch until it next waits
HOLD_CHANCE = 0.3


@dataclass
class Call:
    k: int
    out: Any
    expected: np.ndarray
    t0: float
    desc: str = ""


def check(call: Call, timeout: float) -> tuple[str, str]:
    """``(outcome, detail)``: ``ok``, ``typed`` (an allowed error), ``timeout`` or ``wrong``."""
    try:
        got = call.out.result(timeout=timeout)
    except TimeoutError as e:
        return "timeout", str(e)
    except TYPED as e:
        return "typed", repr(e)
    except Exception as e:  # noqa: BLE001 - any other error is a wrong result
        return "wrong", repr(e)
    exp = call.expected
    scale = max(1.0, float(np.abs(exp).max()))
    if got.shape != exp.shape or not np.allclose(got, exp, rtol=1e-9, atol=1e-9 * scale):
        diff = float(np.abs(got - exp).max()) if got.shape == exp.shape else math.nan
        return "wrong", f"mismatch: shape {got.shape} vs {exp.shape}, max abs diff {diff:g}"
    return "ok", ""


def _submit(client: Any, rng: random.Random, meshes: list[Any], library: list[Chain], last: Call | None,
            k: int, max_steps: int) -> Call:
    chain = rng.choice(library) if rng.random() < 0.5 else random_chain(rng, meshes, max_steps)
    t0 = time.time()
    if last is not None and last.expected.shape == chain.shape and rng.random() < 0.3:
        x, value = last.out, last.expected  # the previous program's output, maybe still pending
        source = f"program {last.k}'s output"
    else:
        value = np.random.default_rng(rng.randrange(2**32)).normal(size=chain.shape)
        x = client.put(value, chain.mesh, chain.spec)
        source = f"a put on devices {list(chain.mesh.device_ids)} as {chain.spec}"
    out = chain.prog(x)
    # its program id is read at its end: reading it now would send a batch it waits in
    desc = f"{chain.names} on meshes {[(m.shape, list(m.device_ids)) for m in meshes]} of input {source}"
    return Call(k, out, chain.reference(value), t0, desc)


def _end(sink: Sink, call: Call, timeout: float) -> str:
    outcome, detail = check(call, timeout)
    if outcome != "ok":
        pid = getattr(call.out, "_program_id", "?") or "none: its batch never went"
        detail = f"{detail} [program {call.desc}; pid {pid}]"
    sink("program", k=call.k, t0=call.t0, t1=time.time(), outcome=outcome, detail=detail)
    return outcome


def drive(client: Any, plan: ClientPlan, sink: Sink, stop: threading.Event, timeout: float) -> None:
    """Submit ``plan.programs`` random programs, ``plan.depth`` in flight, checking each in order.

    Stops at the first error; closes the client itself (chaos) at ``plan.close_after``.
    """
    rng = random.Random(plan.seed)
    meshes = [client.mesh(shape, island=island) for shape, island in zip(plan.shapes, plan.islands)]
    sink("started")
    library = [random_chain(rng, meshes, plan.max_steps) for _ in range(rng.randint(1, 3))]
    pending: deque[Call] = deque()
    last: Call | None = None
    failed = False
    held = contextlib.ExitStack()  # calls held in the client's batch (client/batching.py) until it waits
    for k in range(plan.programs):
        if stop.is_set() or failed:
            break
        if rng.random() < HOLD_CHANCE:
            held.enter_context(client._batcher.holding())
        t0 = time.time()
        try:
            last = _submit(client, rng, meshes, library, last, k, plan.max_steps)
        except Exception as e:  # noqa: BLE001 - classified like a result
            sink("program", k=k, t0=t0, t1=time.time(), outcome="typed" if isinstance(e, TYPED) else "wrong",
                 detail=f"at submission: {e!r}")
            break
        pending.append(last)
        if plan.close_after == k + 1:
            sink("chaos", what="close-client")
            client.close()
            return
        if plan.kill_after == k + 1:
            sink("kill_me")
        if len(pending) >= plan.depth:
            held.close()
        while len(pending) >= plan.depth and not failed:
            failed = _end(sink, pending.popleft(), timeout) != "ok"
    held.close()
    if failed:
        _end_all(sink, pending, timeout)
    while pending and not stop.is_set():
        _end(sink, pending.popleft(), timeout)


def _end_all(sink: Sink, pending: deque[Call], timeout: float) -> None:
    """Wait for every pending call at once (after a failure, each may take long to fail)."""
    threads = [threading.Thread(target=_end, args=(sink, call, timeout), daemon=True) for call in pending]
    pending.clear()
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 10
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))


def client_body(make: Callable[[], Any], plan: ClientPlan, sink: Sink, stop: threading.Event,
                 timeout: float) -> None:
    client = None
    try:
        client = make()
        drive(client, plan, sink, stop, timeout)
    except BaseException as e:  # noqa: BLE001 - reported to the harness
        sink("crash", error=repr(e), typed=isinstance(e, TYPED))
    finally:
        if client is not None:
            client.close()
        sink("finished")


def process_client(address: str, plan: ClientPlan, conn: Connection, timeout: float) -> None:
    """A client in a process of its own (spawned): reports each event on ``conn``."""
    from ... import connect

    lock = threading.Lock()  # a Connection is not thread-safe; _end_all reports from threads

    def sink(kind: str, **data: Any) -> None:
        data.setdefault("t", time.time())
        with lock:
            conn.send((kind, data))

    try:
        client_body(lambda: connect(address, name=plan.name, weight=plan.weight), plan, sink,
                     threading.Event(), timeout)
    finally:
        conn.close()
