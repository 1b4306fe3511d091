"""pathdask: Pathways-style single-controller, gang-scheduled sharded computation on Dask.

The public surface is re-exported here; everything else is private.
"""

from __future__ import annotations

from . import config as _config  # noqa: F401  (registers the pathdask.* config defaults)
from . import pipeline  # pathdask.pipeline: GPipe and 1F1B over stage meshes
from .client.array import ShardedArray
from .client.checkpoint import CheckpointFuture
from .client.client import Client, connect
from .client.function import Function, function
from .client.program import ProgramFunction, program
from .client.tracing import Program
from .collectives import (
    all_gather,
    all_to_all,
    axis_index,
    axis_size,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
)
from .dashboard import trace as _trace  # noqa: F401  (registers the Dataset accessor .pathdask)
from .errors import (
    ArrayLostError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointIncompleteError,
    CheckpointWriteError,
    ClientClosedError,
    DeviceLostError,
    DeviceOutOfMemoryError,
    DispatchError,
    GangAbortedError,
    KernelOutputError,
    MeshError,
    PipelineError,
    PlanMissingError,
    ReplicationError,
    ShapeMismatchError,
    ShardingError,
    SliceTooLargeError,
    TopologyError,
    UnfusedGraphError,
)
from .mesh import Mesh
from .spec import P, PartitionSpec
from .system import LocalSystem
from .topology import Link, Topology

__version__ = "0.1.0"

__all__ = [
    "ArrayLostError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFuture",
    "CheckpointIncompleteError",
    "CheckpointWriteError",
    "Client",
    "ClientClosedError",
    "DeviceLostError",
    "DeviceOutOfMemoryError",
    "DispatchError",
    "Function",
    "GangAbortedError",
    "KernelOutputError",
    "LocalSystem",
    "Link",
    "Mesh",
    "MeshError",
    "P",
    "PartitionSpec",
    "PipelineError",
    "PlanMissingError",
    "ReplicationError",
    "Program",
    "ProgramFunction",
    "ShapeMismatchError",
    "ShardedArray",
    "ShardingError",
    "SliceTooLargeError",
    "Topology",
    "TopologyError",
    "UnfusedGraphError",
    "all_gather",
    "all_to_all",
    "axis_index",
    "axis_size",
    "connect",
    "function",
    "pipeline",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "program",
    "psum",
]
