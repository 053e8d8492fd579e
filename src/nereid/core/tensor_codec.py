"""Turn raw tensor bytes (binary extension, gRPC raw contents, shared memory) into arrays, checking sizes, and
arrays back into the raw bytes every protocol sends."""

from __future__ import annotations

import math

import numpy as np

from nereid.core.dtypes import deserialize_bytes, element_size, numpy_dtype, serialize_bytes
from nereid.core.errors import NereidError

__all__ = ["array_from_buffer", "element_count", "reshape_checked", "tensor_bytes"]


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape) if shape else 1


def array_from_buffer(
    buffer: bytes | memoryview,
    datatype: str,
    shape: tuple[int, ...],
    input_name: str,
    model_name: str,
    request_id: str = "",
) -> np.ndarray:
    """A view on `buffer` shaped `shape`; BYTES elements are decoded from their length prefixes."""
    if shape and min(shape) < 0:
        raise NereidError.invalid(
            f"input '{input_name}' for model '{model_name}': shape dims must be >= 0, got {list(shape)}"
        )
    count = element_count(shape)
    if datatype == "BYTES":
        try:
            array = deserialize_bytes(buffer, count)
        except ValueError as exc:
            raise NereidError.invalid(f"input '{input_name}' for model '{model_name}': {exc}") from None
        # Triton 2.51's words (asked): too few elements are counted, too many reported as the first one past `count`.
        if array.size < count:
            raise NereidError.invalid(
                f"[request id: {request_id or '<id_unknown>'}] expected {count} string elements for inference input "
                f"'{input_name}' for model '{model_name}', got {array.size}"
            )
        if array.size > count:
            raise NereidError.invalid(
                f"[request id: {request_id or '<id_unknown>'}] unexpected number of string elements {array.size} "
                f"for inference input '{input_name}' for model '{model_name}', expecting {count}"
            )
        return reshape_checked(array, shape, input_name, model_name)
    try:
        dtype = numpy_dtype(datatype)
    except KeyError:
        raise NereidError.invalid(f"invalid datatype '{datatype}' for input '{input_name}' of model '{model_name}'") from None
    expected = count * element_size(datatype)
    if len(buffer) != expected:
        raise NereidError.invalid(
            f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch for input '{input_name}' for "
            f"model '{model_name}'. Expected {expected}, got {len(buffer)}"
        )
    return reshape_checked(np.frombuffer(buffer, dtype=dtype), shape, input_name, model_name)


def reshape_checked(array: np.ndarray, shape: tuple[int, ...], input_name: str, model_name: str) -> np.ndarray:
    """`array` (whose size is already checked) in `shape`, or INVALID_ARG where numpy cannot make that shape."""
    try:
        return array.reshape(shape)
    except ValueError:  # an empty tensor whose other dims multiply past what numpy can index
        raise NereidError.invalid(
            f"input '{input_name}' for model '{model_name}': shape {list(shape)} is too large"
        ) from None


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The raw form of a tensor: BYTES elements each behind its 4-byte length, other types their C-order bytes."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array).tobytes()
