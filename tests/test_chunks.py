"""Large pieces are cut into chunks and put back together byte for byte, strided or not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathdask.chunking import split
from pathdask.worker.chunks import Reassembly

KEY = ("p", 0, 0, 1)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), chunk=st.integers(1, 300),
       step=st.integers(1, 3), dtype=st.sampled_from(["f8", "i2", "u1"]))
def test_split_and_reassemble_give_back_the_piece(shape, chunk, step, dtype):
    block = np.arange(np.prod(shape) * 3, dtype=dtype).reshape(shape[0] * 3, *shape[1:])
    piece = block[::step] if len(shape) == 1 else block[::step, ::step]  # often strided
    parts = list(split(piece, chunk))
    assert sum(p.nbytes for _, p in parts) == piece.nbytes
    assert all(p.nbytes <= max(chunk, piece.itemsize) for _, p in parts)
    re = Reassembly()
    got = None
    for offset, data in reversed(parts):  # order does not matter
        meta = (KEY, 3, piece.shape, piece.dtype.str, offset, (0.0, 1.0))
        re.target(meta, data.nbytes)[:] = data
        got = re.landed(meta, data.nbytes)
    assert got is not None and not re.partial
    np.testing.assert_array_equal(got, piece)
    assert not got.flags.writeable


def test_a_contiguous_piece_is_cut_without_copies():
    piece = np.arange(1000.0)
    for _, data in split(piece, 800):
        assert np.shares_memory(np.frombuffer(data, np.uint8), piece)


def test_chunks_of_a_program_that_ended_are_received_and_forgotten():
    re = Reassembly()
    meta = (KEY, 3, (100,), "<f8", 0, (0.0, 1.0))
    re.target(meta, 400)
    re.drop("p")
    assert not re.partial
    re.target((KEY, 3, (100,), "<f8", 400, (0.0, 1.0)), 400)[:] = b"x" * 400  # late chunk: scratch space
    assert re.landed(meta, 400) is None and not re.partial


@pytest.mark.parametrize("part", [7, 64, 10**6])
def test_a_put_block_is_rebuilt_from_its_parts(part):
    from pathdask.ops import OutSpec, PutOp

    block = np.arange(60.0).reshape(6, 10)[:, ::2]  # strided: parts are copies, one at a time
    op = PutOp(0, OutSpec(0, block.shape, block.dtype.str), PutOp.parts_of(block, part))
    assert sum(p.nbytes for p in op.parts) == block.nbytes
    np.testing.assert_array_equal(op.take(), block)
    assert not op.parts  # each part was let go
