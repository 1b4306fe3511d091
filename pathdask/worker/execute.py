"""Running one device's part of a gang: kernels, reshards and puts."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..blocks import as_block
from ..collectives import bind
from ..errors import ReplicationError, ShapeMismatchError
from ..ops import GangSpec, KernelOp, LoadOp, Op, OutSpec, PutOp, ReshardOp
from ..sharding import contiguous
from ..stopwatch import mark
from ..topology import DeviceInfo
from .driver import yield_to_others
from .transfer import Aborted, wait_until

if TYPE_CHECKING:
    from ..core.ledger import HostProgram
    from .host import Host


class KernelContext:
    """The gang context a kernel body sees: its mesh position and an exchange."""

    def __init__(self, rt: Host, prog: HostProgram, gang: GangSpec, device: DeviceInfo, position: int) -> None:
        self.rt, self.prog, self.gang, self.device = rt, prog, gang, device
        self.mesh = gang.mesh
        self.position = position
        self.seq = 0

    def exchange(self, sends: dict[int, np.ndarray], sources: Sequence[int], like: np.ndarray,
                 seq: int | None = None) -> dict[int, np.ndarray]:
        """One collective's exchange; ``seq`` numbers it (by default, the body's next)."""
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        devices = self.mesh.devices
        got = self.rt.exchange(
            self.prog.pid, self.gang.index, seq, self.device,
            {devices[p]: np.asarray(a) for p, a in sends.items()},
            {devices[p].id for p in sources},
        )
        return {p: got[devices[p].id] for p in sources}


def _outputs(op: Op) -> tuple[OutSpec, ...]:
    if isinstance(op, KernelOp):
        return op.outputs
    if isinstance(op, ReshardOp):
        return (op.output,) if op.output is not None else ()
    return (op.output,)


def _check(gang: GangSpec, outs: Any, specs: tuple[OutSpec, ...]) -> tuple[np.ndarray, ...]:
    values = outs if isinstance(outs, tuple) else (outs,)
    if len(values) != len(specs):
        raise ShapeMismatchError(
            f"Function {gang.name!r} returned {len(values)} output(s) on this device, but "
            f"{len(specs)} were inferred; a body must return the same structure on every call"
        )
    arrays = []
    for i, (v, s) in enumerate(zip(values, specs)):
        a = as_block(v, gang.name, i)
        if a.shape != s.shape or a.dtype != np.dtype(s.dtype):
            raise ShapeMismatchError(
                f"Function {gang.name!r} output {i}: expected a block of shape {s.shape} and "
                f"dtype {s.dtype} (inferred for this input signature), got shape {a.shape} and "
                f"dtype {a.dtype}. Shapes are static: make the body's block shapes depend only "
                "on its input shapes"
            )
        arrays.append(contiguous(a))
    return tuple(arrays)


def run_op(rt: Host, prog: HostProgram, device: DeviceInfo, op: Op, clock: float | None = None) -> float:
    """Run ``op`` on ``device``; on failure its outputs carry the error and the gang aborts.

    ``clock`` is the modelled end of the device's previous gang when this one was
    already queued behind it: the device is then modelled as busy back to back,
    so this gang's modelled time runs from there, and the real time spent between
    the two (a sleep's overshoot, Python overhead) does not add up over a stream
    of gangs. Returns the modelled end of this gang.
    """
    gang = prog.plan.gangs[op.gang]
    outs = _outputs(op)
    dev = device.id
    allocated = 0
    try:
        try:
            inputs = _read_inputs(rt, prog, op, dev)  # first, so that reads are counted on every path
        finally:
            cause = prog.check(op.gang)
            if cause is not None:  # a dropped program's inputs may be gone: the drop is the cause
                raise Aborted(cause)
        need = sum(o.nbytes for o in outs)
        rt.store.allocate(dev, need, lambda: prog.check(op.gang))
        allocated = need
        now = time.perf_counter()
        # back to back: a kernel starts where the last gang ended, but never ends in the past;
        # a move's pieces leave when the last gang ended
        start = now if clock is None else min(max(clock, now - gang.cost_s) if isinstance(op, KernelOp) else clock, now)
        if isinstance(op, KernelOp):
            assert gang.body is not None
            yield_to_others()  # devices woken with this one end their waits before its compute
            ctx = KernelContext(rt, prog, gang, device, op.position)
            with bind(ctx), np.errstate(all="ignore"):
                values = _check(gang, gang.body(*inputs), op.outputs)
            rt.close_gang(prog.pid, gang, dev, ctx.seq)
            if gang.replicated:
                _check_replicated(ctx, gang, values)
            deadline = start + gang.cost_s
            worked = time.perf_counter()
            wait_until(deadline, lambda: prog.check(op.gang))
            # If it waited for its deadline, the gang ended at its modelled time; else its real work did.
            modelled_end = deadline if worked < deadline else time.perf_counter()
        elif isinstance(op, ReshardOp):
            # sending takes no device time; receiving ends when the last piece arrived
            values, modelled_end = _reshard(rt, prog, op, device, inputs, start)
        else:
            assert isinstance(op, (PutOp, LoadOp))
            values = (op.take(),)
            modelled_end = time.perf_counter()
        rt.account(dev, modelled_end - start)
    except BaseException as e:  # noqa: BLE001 - every failure is contained to its gang
        if allocated:
            rt.store.unallocate(dev, allocated)
        cause = e.cause if isinstance(e, Aborted) else e
        for o in outs:
            rt.store.fail((prog.pid, o.vid), dev, cause)
        if not isinstance(e, Aborted):
            rt.abort_gang(prog, gang, cause)
        rt.account(dev, 0.0)
        mark("ran", prog.pid)
        return time.perf_counter()
    mark("ran", prog.pid)  # before the values are stored: storing the last one answers its fetch
    for o, v in zip(outs, values):
        rt.store.put((prog.pid, o.vid), dev, v, o.nbytes)
    return modelled_end


def _check_replicated(ctx: KernelContext, gang: GangSpec, values: tuple[np.ndarray, ...]) -> None:
    """Every output must be equal along the mesh axes its out_spec leaves out (JAX's replication
    check). The gang's devices exchange digests of their blocks, outside the body's collectives."""
    mine = np.array([_digest(v) if axes else 0 for v, axes in zip(values, gang.replicated)], dtype=np.uint64)
    peers = sorted({p for axes in gang.replicated if axes for p in ctx.mesh.group(ctx.position, axes)}
                   - {ctx.position})
    got = ctx.exchange(dict.fromkeys(peers, mine), peers, mine, seq=-1)
    for i, axes in enumerate(gang.replicated):
        for p in ctx.mesh.group(ctx.position, axes) if axes else ():
            if p != ctx.position and got[p][i] != mine[i]:
                raise ReplicationError(
                    f"Function {gang.name!r} output {i} is declared replicated along mesh axes "
                    f"{list(axes)} (its out_spec leaves them out), but device {ctx.device.id} at "
                    f"{ctx.mesh.coords(ctx.position)} and the device at {ctx.mesh.coords(p)} hold "
                    "different blocks. Reduce over those axes first (e.g. pw.psum), or name them in "
                    "out_specs; set pathdask.check-replication to False to skip this check"
                )


def _digest(block: np.ndarray) -> int:
    data = np.ascontiguousarray(block).reshape(-1).view(np.uint8).data
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _read_inputs(rt: Host, prog: HostProgram, op: Op, dev: int) -> list[np.ndarray]:
    """Read (and count as read) every input; the first error is raised after all are counted."""
    refs = op.inputs if isinstance(op, KernelOp) else ((op.input,) if isinstance(op, ReshardOp) and op.input else ())
    values, error = [], None
    for ref in refs:
        try:
            values.append(rt.store.read(prog.resolve(ref), dev))
        except BaseException as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error
    return values


def _reshard(rt: Host, prog: HostProgram, op: ReshardOp, device: DeviceInfo, inputs: list[np.ndarray],
             start: float) -> tuple[tuple[np.ndarray, ...], float]:
    """Send this device's pieces at ``start``, receive its own; returns its block (if it is a
    target) and when its last piece arrived (modelled)."""
    src = inputs[0] if inputs else None
    sends = {}
    for dst, index in op.sends:
        assert src is not None
        sends[dst] = src[index]  # a view: same-host pieces are not copied, remote ones stream
    got, arrived = rt.move(prog.pid, op.gang, 0, device, sends, {s for s, _ in op.recvs}, start=start,
                           scale=op.scale)
    if op.output is None:
        return (), arrived
    if len(op.recvs) == 1:
        whole = got[op.recvs[0][0]]
        if whole.shape == op.output.shape and whole.dtype == np.dtype(op.output.dtype):
            return (contiguous(whole),), arrived  # the one piece is the block: kept (buffers are immutable)
    out = np.empty(op.output.shape, dtype=op.output.dtype)
    for s, index in op.recvs:
        out[index] = got[s]
    return (out,), arrived
