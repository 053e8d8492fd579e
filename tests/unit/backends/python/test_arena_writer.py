"""The server's input-arena writer (one code path for a batch's inputs and a BLS response's outputs), and the tensor
read-back both processes share."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from nereid.backends.python import pb_utils
from nereid.backends.python.arena import Arena, create_arena_fd, read_array
from nereid.backends.python.arena_writer import InputArenaWriter
from nereid.backends.python.protocol import CONTROL_BYTES, REPLIES_TAKEN
from nereid.core.types import InputTensor, OutputTensor


@pytest.fixture
def writer() -> Iterator[InputArenaWriter]:
    inputs, outputs = Arena(create_arena_fd("test-in", 1 << 16)), Arena(create_arena_fd("test-out", 1 << 16))
    yield InputArenaWriter(inputs, outputs)
    inputs.close()
    outputs.close()


def _read(writer: InputArenaWriter, meta: tuple) -> np.ndarray:
    name, datatype, shape, offset, nbytes = meta
    return read_array(writer.arena.mm, datatype, shape, offset, nbytes, copy=True)


def test_a_batch_of_requests_lands_in_one_region_each_tensor_aligned_and_readable(writer: InputArenaWriter) -> None:
    first = [InputTensor("A", "FP32", (1, 3), np.arange(3, dtype=np.float32).reshape(1, 3))]
    second = [
        InputTensor("A", "FP32", (1, 3), np.full((1, 3), 7, np.float32)),
        InputTensor("S", "BYTES", (2,), np.array([b"ab", "cd\u00e9"], dtype=object)),
    ]
    (metas_1, metas_2), start, end = writer.write([first, second])
    assert start == CONTROL_BYTES and all(meta[3] % 64 == 0 for meta in (*metas_1, *metas_2))
    assert end >= metas_2[-1][3] + metas_2[-1][4]
    np.testing.assert_array_equal(_read(writer, metas_1[0]), first[0].data)
    np.testing.assert_array_equal(_read(writer, metas_2[0]), second[0].data)
    assert list(_read(writer, metas_2[1])) == [b"ab", "cd\u00e9".encode()]


def test_a_non_contiguous_array_is_written_in_c_order(writer: InputArenaWriter) -> None:
    data = np.arange(12, dtype=np.int64).reshape(3, 4).T  # a transposed view
    ((meta,),), _, _ = writer.write([[OutputTensor("T", "INT64", (4, 3), data)]], data_shapes=True)
    assert meta[2] == (4, 3)
    np.testing.assert_array_equal(_read(writer, meta), data)


def test_space_is_reused_around_what_is_still_in_use(writer: InputArenaWriter) -> None:
    tensor = [InputTensor("A", "UINT8", (100,), np.ones(100, np.uint8))]
    _, start_1, end_1 = writer.write([tensor])
    writer.hold_batch(1, (start_1, end_1))
    _, start_2, end_2 = writer.write([tensor])
    assert start_2 >= end_1  # batch 1 is in flight: not over it
    writer.hold_batch(2, (start_2, end_2))
    writer.release_batch(1)
    _, start_3, _ = writer.write([tensor])
    assert start_3 == CONTROL_BYTES  # batch 1's space is free again, before batch 2's region


def test_a_bls_response_holds_its_region_until_the_worker_says_it_took_it(writer: InputArenaWriter) -> None:
    tensor = [OutputTensor("O", "FP32", (8,), np.zeros(8, np.float32))]
    _, start, end = writer.write([tensor], data_shapes=True)
    writer.hold_reply(1, (start, end))
    assert writer.write([tensor])[1] >= end
    REPLIES_TAKEN.pack_into(writer.outputs.mm, 0, 1)
    assert writer.write([tensor])[1] == CONTROL_BYTES


def test_the_arena_grows_for_a_batch_larger_than_it(writer: InputArenaWriter) -> None:
    big = np.arange(1 << 15, dtype=np.float64)  # 256 KiB into a 64 KiB arena
    ((meta,),), _, _ = writer.write([[InputTensor("B", "FP64", big.shape, big)]])
    assert writer.arena.size >= meta[3] + meta[4]
    np.testing.assert_array_equal(_read(writer, meta), big)


def test_bytes_that_do_not_match_their_shape_are_refused() -> None:
    buffer = pb_utils.serialize_byte_tensor(np.array([b"a", b"b"], dtype=object))
    with pytest.raises(ValueError):
        read_array(buffer, "BYTES", (3,), 0, len(buffer), copy=True)
