"""Typed errors of pathdask.

Each error subclasses the built-in exception a Python user would expect, so
``except ValueError`` still catches a bad sharding, and each message names what
was expected, what came, and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ArrayLostError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointIncompleteError",
    "CheckpointWriteError",
    "ClientClosedError",
    "DeviceLostError",
    "DeviceOutOfMemoryError",
    "DispatchError",
    "GangAbortedError",
    "KernelOutputError",
    "MeshError",
    "PipelineError",
    "PlanMissingError",
    "ProtocolError",
    "ReplicationError",
    "ShapeMismatchError",
    "ShardingError",
    "SliceTooLargeError",
    "TopologyError",
    "UnfusedGraphError",
]


class TopologyError(ValueError):
    """A topology field is missing or has a value that cannot be parsed."""


class ShardingError(ValueError):
    """A shape, mesh axis or partition spec does not fit together."""


class MeshError(ShardingError):
    """Arrays or functions were combined on meshes that do not match."""


class PipelineError(ValueError):
    """A pipeline's stages, parameters or microbatches do not fit together."""


class SliceTooLargeError(ValueError):
    """A mesh asks for more devices than any island (or the chosen one) has."""


class ShapeMismatchError(ValueError):
    """A kernel returned blocks whose shape or dtype differ from the inferred ones."""


class DeviceOutOfMemoryError(MemoryError):
    """A single allocation is larger than a device's HBM capacity."""


class DeviceLostError(RuntimeError):
    """A device that a program uses has left the cluster."""


class GangAbortedError(RuntimeError):
    """A gang was aborted: its client closed, or a peer in the gang failed."""


class PlanMissingError(RuntimeError):
    """A call named a program plan that its host does not hold (the worker restarted)."""


class DispatchError(RuntimeError):
    """A program's dispatch failed on one of its hosts, so it was dropped on all of them."""


class KernelOutputError(TypeError):
    """A function body returned something that is not a numeric array block."""


class ReplicationError(ValueError):
    """A replicated output (its out_spec leaves a mesh axis out) differs between devices."""


class ClientClosedError(RuntimeError):
    """The client that made an array or mesh is closed; its device buffers were freed."""


class CheckpointError(ValueError):
    """A path given to ``resume`` holds no pathdask checkpoint, or one this version cannot read;
    or a path given to ``suspend`` holds something else, which it will not overwrite."""


class CheckpointIncompleteError(CheckpointError):
    """A checkpoint was never committed (no commit record: what an interrupted suspend leaves),
    or lacks chunks its commit record lists; the message names what is missing."""


class CheckpointCorruptError(CheckpointError):
    """A chunk of a committed checkpoint does not match the checksum its commit record holds."""


class CheckpointWriteError(OSError):
    """A host or the client could not write a checkpoint (a full disk, no permission): nothing
    was committed, and what the path held before is unchanged."""


class UnfusedGraphError(RuntimeError):
    """A program's per-gang graph was run task by task; it is for inspection, call the program."""


class ArrayLostError(DeviceLostError):
    """Every copy of some block of an array was on devices that are gone; it cannot be recovered."""


class ProtocolError(RuntimeError):
    """A pathdask message that is unknown, sent on the wrong route or missing fields
    (``pathdask/protocol.py``); it names the message and its sender."""
