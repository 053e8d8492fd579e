"""The tensor codec both frontends use: wire bytes into a numpy view without a copy, BYTES elements from their
length prefixes, and INVALID_ARG with Triton's words for sizes, counts, datatypes and shapes that do not add up."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.core.dtypes import serialize_bytes
from nereid.core.errors import NereidError, Status
from nereid.core.tensor_codec import array_from_buffer, element_count, reshape_checked


def test_element_count_of_a_scalar_shape_is_one() -> None:
    assert element_count(()) == 1
    assert element_count([2, 3]) == 6
    assert element_count((4, 0)) == 0


@pytest.mark.parametrize(("datatype", "dtype"), [("FP32", np.float32), ("INT8", np.int8), ("UINT64", np.uint64), ("BOOL", np.bool_)])
def test_fixed_size_tensors_round_trip_as_views(datatype: str, dtype: type) -> None:
    original = np.arange(6).astype(dtype).reshape(2, 3)
    buffer = original.tobytes()
    array = array_from_buffer(buffer, datatype, (2, 3), "X", "m")
    np.testing.assert_array_equal(array, original)
    assert array.dtype == np.dtype(dtype)
    assert not array.flags.owndata  # a view on the request's bytes, not a copy


def test_bytes_tensors_round_trip_through_the_length_prefixed_form() -> None:
    original = np.array([b"one", b"", b"\xff\x00"], dtype=np.object_)
    array = array_from_buffer(serialize_bytes(original), "BYTES", (3, 1), "TEXT", "m")
    assert array.shape == (3, 1) and array.ravel().tolist() == original.tolist()


def _refusal(buffer: bytes, datatype: str, shape: tuple[int, ...]) -> str:
    with pytest.raises(NereidError) as refused:
        array_from_buffer(buffer, datatype, shape, "X", "m", "r7")
    assert refused.value.status == Status.INVALID_ARG
    return refused.value.message


def test_a_byte_size_mismatch_is_refused_in_tritons_words() -> None:
    assert _refusal(b"\0" * 7, "FP32", (2,)) == (
        "[request id: r7] input byte size mismatch for input 'X' for model 'm'. Expected 8, got 7"
    )


def test_a_wrong_bytes_element_count_and_a_bad_prefix_are_refused() -> None:
    """Triton 2.51's words (asked; qa/L0_input_validation test_input_string_shape_validation): too few elements are
    counted, too many named by the first one past the expected count."""
    assert _refusal(serialize_bytes(np.array([b"a"], dtype=np.object_)), "BYTES", (2,)) == (
        "[request id: r7] expected 2 string elements for inference input 'X' for model 'm', got 1"
    )
    assert _refusal(serialize_bytes(np.array([b"a"] * 5, dtype=np.object_)), "BYTES", (2,)) == (
        "[request id: r7] unexpected number of string elements 3 for inference input 'X' for model 'm', expecting 2"
    )
    assert "input 'X' for model 'm'" in _refusal(b"\x09\0\0\0ab", "BYTES", (1,))


def test_unknown_datatypes_and_negative_dims_are_refused() -> None:
    assert _refusal(b"", "FP128", (0,)) == "invalid datatype 'FP128' for input 'X' of model 'm'"
    assert "shape dims must be >= 0, got [-1]" in _refusal(b"", "FP32", (-1,))


def test_a_shape_numpy_cannot_make_is_refused_not_raised() -> None:
    with pytest.raises(NereidError, match="input 'X' for model 'm': shape .* is too large"):
        reshape_checked(np.zeros(0, np.float32), (0, 2**40, 2**40, 2**40), "X", "m")
