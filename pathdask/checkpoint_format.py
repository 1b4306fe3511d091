"""A checkpoint on disk: its layout, its commit record, its checksums, and how both sides check them.

A checkpoint at ``path`` is a symbolic link, ``path -> <name>.pathdask-<token>``,
to a sibling directory that holds a plain zarr group (so ``xarray.open_zarr(path)``
reads it without pathdask). A suspend writes a new sibling directory, never the
one the link names:

1. the client creates the group and its arrays' metadata (:func:`create`);
2. each host writes the shards it holds, one chunk file per distinct shard
   (:func:`write_chunk`), and answers the CRC-32 of each chunk's stored bytes;
3. the client writes the commit record, the group attribute ``pathdask``: the
   arrays' meshes and specs, and per array every chunk's key and checksum
   (:func:`commit`);
4. the client points ``path`` at the new directory with one ``os.replace`` of a
   new link over the old one (atomic on POSIX), then removes every other
   ``<name>.pathdask-*`` sibling: the previous checkpoint, and anything that
   interrupted suspends left.

So whatever stops a suspend (a lost host, a killed client, a full disk) before
step 4 leaves ``path`` naming the previous checkpoint, whole; after it, the new
one. :func:`open_committed` reads the record and checks that every chunk it
lists is there with its size; :func:`read_block` (run by the device that loads a
block) checks each chunk's checksum. Either raises a typed
:class:`~pathdask.errors.CheckpointError` that names what is missing or wrong.

Only one writer at a time per path: a client queues its own checkpoints to one
path, but two processes suspending to one path at once may remove each other's
directory (the loser's suspend then fails; the path stays valid).
"""

from __future__ import annotations

import os
import shutil
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from .errors import CheckpointCorruptError, CheckpointError, CheckpointIncompleteError

__all__ = ["FORMAT", "ArrayLayout", "checksum", "chunk_coords", "chunk_key", "clean", "commit", "create", "new_directory",
           "normalize", "open_committed", "overlapping", "read_block", "check_target", "write_chunk"]

#: the version of the commit record this module writes and reads
FORMAT = 2
#: what marks a checkpoint's directories (and a link on its way) beside its path
MARK = ".pathdask-"
#: the group attribute that is the commit record
RECORD = "pathdask"

Index = tuple[slice, ...]
Coords = tuple[int, ...]


@dataclass(frozen=True)
class ArrayLayout:
    """One array of a checkpoint, as the client creates it."""

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    dims: tuple[str, ...]


def normalize(path: str | os.PathLike[str]) -> str:
    """The path as a string, without a trailing separator (which would name the link's target)."""
    return os.path.normpath(os.fspath(path))


def new_directory(path: str) -> str:
    """A new sibling directory name for a checkpoint of ``path``."""
    return f"{path}{MARK}{uuid.uuid4().hex[:16]}"


def _siblings(path: str) -> list[str]:
    parent, base = os.path.split(path)
    try:
        names = os.listdir(parent or ".")
    except FileNotFoundError:
        return []
    return [os.path.join(parent, n) for n in names if n.startswith(base + MARK)]


def check_target(path: str) -> None:
    """Raise unless ``path`` is free, a checkpoint link, or an empty directory (which goes)."""
    if os.path.islink(path) or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)
        return
    what = "a directory" if os.path.isdir(path) else "a file"
    raise CheckpointError(
        f"Cannot suspend to {path!r}: it is {what}, not a checkpoint link that pathdask made "
        f"(a checkpoint is a link to a sibling directory '{os.path.basename(path)}{MARK}...', swapped "
        "in one step when complete; an older pathdask wrote plain directories). pathdask does not "
        "overwrite it: move it away or remove it, or suspend to another path"
    )


def create(directory: str, arrays: Mapping[str, ArrayLayout]) -> None:
    """The zarr group at ``directory`` with its arrays' metadata, and no commit record yet."""
    import zarr

    os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
    group = zarr.open_group(directory, mode="w-")
    for name, a in arrays.items():
        group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=a.chunks, compressors=None,
                           serializer={"name": "bytes", "configuration": {"endian": "little"}},
                           fill_value=0, dimension_names=a.dims,
                           chunk_key_encoding={"name": "default", "separator": "/"})


def write_chunk(directory: str, name: str, key: str, block: np.ndarray) -> int:
    """Write ``block`` as chunk ``key`` of array ``name`` in ``directory``, as zarr stores it
    (uncompressed bytes, C order, little-endian: the arrays :func:`create` makes), in one
    write that lets go of the GIL; its checksum. Every chunk is written, even one equal to
    the fill value, so that a missing one means a lost write."""
    data = _stored(block)
    path = os.path.join(directory, name, *key.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return zlib.crc32(data)


def _stored(block: np.ndarray) -> memoryview:
    """The block's bytes as its chunk file holds them."""
    return np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")).reshape(-1).view(np.uint8).data


def checksum(block: np.ndarray) -> int:
    """CRC-32 of the block's bytes as zarr stores them: C order, little-endian (the chunk file's bytes)."""
    return zlib.crc32(_stored(block))


def chunk_key(coords: Coords) -> str:
    """A chunk's key in its array (its file, under the array's directory): ``c/1/0``."""
    return "/".join(["c", *map(str, coords)])


def chunk_coords(key: str) -> Coords:
    """The chunk coordinates of a key of :func:`chunk_key`."""
    return tuple(int(c) for c in key.split("/")[1:])


def _grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[Coords]:
    """Every chunk of an array (none if it is empty)."""
    if any(n == 0 for n in shape):
        return []
    return list(product(*(range(-(-n // c)) for n, c in zip(shape, chunks))))


def overlapping(region: Index, chunks: tuple[int, ...]) -> list[Coords]:
    """The chunks that ``region`` (of a non-empty array) touches."""
    if any(s.stop <= s.start for s in region):
        return []
    return list(product(*(range(s.start // c, -(-s.stop // c)) for s, c in zip(region, chunks))))


def commit(path: str, directory: str, record: dict[str, Any]) -> None:
    """Write the commit record into ``directory``, then point ``path`` at it, atomically."""
    import warnings

    import zarr

    group = zarr.open_group(directory, mode="r+")
    group.attrs[RECORD] = {"format": FORMAT, **record}
    with warnings.catch_warnings():  # zarr notes that v3 has no consolidated metadata in its spec yet;
        warnings.simplefilter("ignore")  # xarray reads it, and opens the group in one read
        zarr.consolidate_metadata(directory)
    link = f"{path}{MARK}link-{uuid.uuid4().hex[:16]}"
    os.symlink(os.path.basename(directory), link)
    try:
        os.replace(link, path)  # the commit: one rename, atomic on POSIX
    except OSError:
        os.unlink(link)
        raise


def clean(path: str, keep: str | None = None) -> None:
    """Remove ``path``'s siblings that pathdask wrote, except ``keep`` and the one ``path`` names.

    Best effort: a host of a killed client may still be writing into one; what stays
    goes with the next suspend.
    """
    current = _target(path)
    for sibling in _siblings(path):
        if sibling in (keep, current):
            continue
        if os.path.islink(sibling) or not os.path.isdir(sibling):
            try:
                os.unlink(sibling)
            except FileNotFoundError:
                pass
        else:
            shutil.rmtree(sibling, ignore_errors=True)


def _target(path: str) -> str | None:
    """The directory the link ``path`` names (``None`` if ``path`` is no link)."""
    if not os.path.islink(path):
        return None
    return os.path.join(os.path.dirname(path), os.readlink(path))


def open_committed(path: str) -> tuple[str, Any, dict[str, Any]]:
    """The directory that ``path`` names, its zarr group and its commit record, once checked:
    the record is there, of this format, and every chunk it lists is there with its size."""
    import zarr

    directory = _target(path) or path
    if not os.path.isdir(directory):
        via = f"; it links to {directory!r}, which is gone" if directory != path else ""
        raise CheckpointError(f"No pathdask checkpoint at {path!r}{via}; expected one written by "
                              "client.suspend or client.checkpoint")
    try:
        group = zarr.open_group(directory, mode="r")
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"No pathdask checkpoint at {path!r} ({type(e).__name__}: {e}); expected a zarr group "
            "written by client.suspend"
        ) from None
    record = group.attrs.get(RECORD)
    if not isinstance(record, dict):
        interrupted = MARK in os.path.basename(directory)
        raise CheckpointIncompleteError(
            f"The zarr group at {path!r} has no pathdask commit record (group attribute {RECORD!r}), "
            "which a suspend writes last, once every host wrote its shards. "
            + ("This directory is what an interrupted suspend left: resume the path it was "
               "suspending to instead; the next suspend there removes it" if interrupted else
               "It is not a complete checkpoint of pathdask's: suspend it again, or read it with "
               "xarray.open_zarr if you know it is whole")
        )
    if record.get("format") != FORMAT:
        raise CheckpointError(
            f"The checkpoint at {path!r} has format {record.get('format')!r}; this version of pathdask "
            f"reads format {FORMAT}, whose commit record lists each chunk and its checksum. A format-1 "
            "checkpoint has neither, so it cannot be told complete: if you know it is, read it with "
            "xarray.open_zarr(path) and client.put the arrays, then suspend them again"
        )
    _check_chunks(path, directory, group, record)
    return directory, group, record


def _check_chunks(path: str, directory: str, group: Any, record: dict[str, Any]) -> None:
    problems = []
    for name, info in record["arrays"].items():
        try:
            arr = group[name]
        except KeyError:
            problems.append(f"array {name!r} is missing")
            continue
        shape, chunks = tuple(arr.shape), tuple(arr.chunks)
        listed: dict[str, int] = info.get("chunks", {})
        expected = [chunk_key(c) for c in _grid(shape, chunks)]
        unlisted = sorted(set(expected) - set(listed))
        if unlisted:
            problems.append(f"array {name!r}: the record lists no checksum for chunks {unlisted}")
        nbytes = int(np.prod(chunks, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
        absent, sized = [], []
        for key in expected:
            try:
                size = os.path.getsize(os.path.join(directory, name, key))
            except OSError:
                absent.append(key)
                continue
            if size != nbytes:
                sized.append(f"{key} ({size} bytes)")
        if absent:
            problems.append(f"array {name!r} lacks chunks {absent} of {len(expected)}")
        if sized:
            problems.append(f"array {name!r} has chunks of the wrong size, expected {nbytes} bytes: {sized}")
    if problems:
        raise CheckpointIncompleteError(
            f"The checkpoint at {path!r} (directory {directory!r}) is not whole: " + "; ".join(problems)
            + ". Its chunks changed after it was committed (files removed or truncated): resume another "
            "checkpoint, or suspend the arrays again"
        )


def read_block(path: str, name: str, region: Index, shape: tuple[int, ...], chunks: tuple[int, ...],
               checksums: Mapping[Coords, int]) -> np.ndarray:
    """Region ``region`` of array ``name`` of the checkpoint directory ``path``, each chunk it
    touches checked against its checksum (``checksums``, by chunk)."""
    import zarr

    out_shape = tuple(s.stop - s.start for s in region)
    try:
        arr = zarr.open_array(store=f"{path}/{name}", mode="r")
        if not checksums:
            return np.asarray(arr[region]).reshape(out_shape)  # an empty region
        block = np.empty(out_shape, np.dtype(arr.dtype))
        for coords in sorted(checksums):
            whole = tuple(slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, chunks, shape))
            chunk = np.asarray(arr[whole]).reshape(tuple(s.stop - s.start for s in whole))
            found = checksum(chunk)
            if found != checksums[coords]:
                raise CheckpointCorruptError(
                    f"Chunk {chunk_key(coords)} of array {name!r} in the checkpoint {path!r} has CRC-32 "
                    f"{found:#010x}; its commit record says {checksums[coords]:#010x}. The chunk changed "
                    "or was damaged after the commit: resume another checkpoint, or suspend the arrays again"
                )
            inner = tuple(slice(max(r.start, w.start), min(r.stop, w.stop)) for r, w in zip(region, whole))
            block[tuple(slice(i.start - r.start, i.stop - r.start) for i, r in zip(inner, region))] = \
                chunk[tuple(slice(i.start - w.start, i.stop - w.start) for i, w in zip(inner, whole))]
        return block
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a vanished or unreadable checkpoint, told as one
        raise CheckpointIncompleteError(
            f"Could not read array {name!r} of the checkpoint {path!r} ({type(e).__name__}: {e}): was it "
            "removed or replaced while it was being resumed? Resume it again"
        ) from e
