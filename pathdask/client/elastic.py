"""Recovering arrays after a host was lost: onto a new mesh, from the copies that survived.

An array whose every block still has a copy on a live device (a replicated
array, or one whose lost shards were replicated elsewhere) is fetched from
those copies, the lost devices avoided, and put onto the new mesh with its spec.
An array that lost every copy of some block cannot be recovered: the error
names it and its blocks, and a checkpoint (``client.resume``) is the way back.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ArrayLostError
from ..mesh import Mesh
from .array import ShardedArray
from .checkpoint import ArrayClient


def recover(client: ArrayClient, arrays: Mapping[str, ShardedArray], mesh: Mesh) -> dict[str, ShardedArray]:
    """``arrays`` again, on ``mesh``, from their surviving copies; see ``Client.recover``."""
    live = {d["address"] for d in client.devices()}
    # by address: a worker that took a lost host's place has its device ids, not its buffers
    lost = {name: frozenset(d.id for d in a.mesh.devices if d.address not in live) for name, a in arrays.items()}
    gone = {name: a.ref.missing(lost[name]) for name, a in arrays.items()}
    gone = {name: blocks for name, blocks in gone.items() if blocks}
    if gone:
        raise ArrayLostError(
            "Every copy of some blocks of " + "; ".join(
                f"{name!r} (blocks {blocks} of mesh {arrays[name].mesh.shape}, lost devices "
                f"{sorted(lost[name])})" for name, blocks in gone.items())
            + " is gone. Restore them from a checkpoint with client.resume(path, mesh=...), or "
            "replicate the arrays you cannot lose"
        )
    return {name: client.put(client._fetch(a, avoid=lost[name]), mesh, a.spec) for name, a in arrays.items()}
