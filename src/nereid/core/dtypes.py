"""Triton data types: names, numpy equivalents, sizes, and the length-prefixed BYTES encoding."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

__all__ = [
    "TRITON_DTYPES",
    "numpy_dtype",
    "triton_dtype_of",
    "element_size",
    "config_to_triton",
    "triton_to_config",
    "serialize_bytes",
    "deserialize_bytes",
    "bf16_to_float32",
    "float32_to_bf16",
]

# BF16 has no numpy type: its raw bits travel as uint16 words inside the core.
_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "BF16": np.dtype(np.uint16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
TRITON_DTYPES = tuple(_TO_NUMPY)

_FROM_NUMPY: dict[np.dtype, str] = {v: k for k, v in _TO_NUMPY.items() if k != "BF16"}


# The table's own lookup, not a Python function around it: the Python backend calls it for every tensor it reads.
numpy_dtype: Callable[[str], np.dtype] = _TO_NUMPY.__getitem__


def triton_dtype_of(array: np.ndarray) -> str:
    """The Triton name for an array's dtype; strings and bytes arrays are BYTES."""
    dt = array.dtype
    name = _FROM_NUMPY.get(dt)
    if name is not None:
        return name
    if dt.kind in ("S", "U", "O"):
        return "BYTES"
    raise ValueError(f"numpy dtype {dt} has no Triton equivalent")


def element_size(triton: str) -> int:
    """Bytes per element; 0 for BYTES, whose elements vary."""
    return 0 if triton == "BYTES" else _TO_NUMPY[triton].itemsize


def config_to_triton(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    name = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if name == "STRING" else name


def triton_to_config(triton: str) -> str:
    return "TYPE_STRING" if triton == "BYTES" else "TYPE_" + triton


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES wire form: each element as a 4-byte little-endian length then its bytes."""
    parts: list[bytes] = []
    pack = struct.Struct("<I").pack
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """The inverse of serialize_bytes; raises ValueError when the buffer is malformed."""
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    end = len(view)
    while offset < end:
        if offset + 4 > end:
            raise ValueError("truncated length prefix in BYTES tensor")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element runs past the end of its buffer")
        items.append(bytes(view[offset : offset + length]))
        offset += length
        if count is not None and len(items) > count:
            break
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16)
