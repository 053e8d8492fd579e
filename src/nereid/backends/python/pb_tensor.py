"""pb_utils.Tensor and Triton's data-type helpers of pb_utils (numbers, numpy types, the BYTES layout), on the
dtype table and BYTES codec of core.dtypes. Inputs view the shared-memory arena without copies. Runs in the worker:
it must not import the server."""

from __future__ import annotations

import enum
import sys
from typing import Any

import numpy as np

from nereid.backends.python.arena import read_array
from nereid.backends.python.pb_errors import TritonModelException
from nereid.backends.python.pb_strings import as_text
from nereid.core.dtypes import (
    TRITON_DTYPES,
    deserialize_bytes,
    numpy_dtype,
    serialize_bytes,
    triton_dtype_of,
    triton_to_config,
)

__all__ = [
    "DataType",
    "Tensor",
    "TRITON_STRING_TO_NUMPY",
    "wire_dtype_of",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "decode_input",
]


class DataType(enum.IntEnum):
    """TRITONSERVER_DataType: what Tensor.triton_dtype() returns (the same numbers as config TYPE_*)."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


# Config type names -> numpy types, as Triton's pb_utils has them (TYPE_BOOL is Python's bool; no BF16).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    triton_to_config(name): bool if name == "BOOL" else numpy_dtype(name).type for name in TRITON_DTYPES if name != "BF16"
}
_NUMPY_OF_NUMBER: dict[int, Any] = {int(DataType[name]): numpy_dtype(name).type for name in TRITON_DTYPES if name != "BF16"}


def wire_dtype_of(array: np.ndarray) -> str:
    """The wire name for an array's dtype: object, bytes and str arrays are BYTES."""
    try:
        return triton_dtype_of(array)
    except ValueError:
        raise TritonModelException(f"numpy dtype {array.dtype} has no Triton data type") from None


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type for a TRITONSERVER data type number (13, BYTES, is np.object_); None when unknown."""
    return _NUMPY_OF_NUMBER.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER data type number for a numpy type or dtype; None when it has none (np.str_ has none, as in
    Triton)."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S"):
        return int(DataType.BYTES)
    if dtype.kind == "U":
        return None
    try:
        return int(DataType[triton_dtype_of(np.empty(0, dtype))])
    except ValueError:
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes:
    """Triton's BYTES layout: every element (C order) as a 4-byte little-endian length and its bytes."""
    if input_tensor.dtype.kind not in ("O", "S", "U"):  # numbers as Python writes them (str(0.1), not float32's)
        input_tensor = np.array(input_tensor.tolist(), dtype=np.object_)
    return serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    return deserialize_bytes(encoded_tensor)


class _DLPackCapsule:
    """Lets numpy import a bare DLPack capsule, which `np.from_dlpack` only takes through this protocol."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor: `Tensor("OUTPUT0", numpy_array)`. Inputs view the shared-memory arena without copies."""

    __slots__ = ("_name", "_array", "_dtype")

    def __init__(self, name: str, array: np.ndarray) -> None:
        if type(name) is not str:
            name = as_text(name, "pb_utils.Tensor name")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"pb_utils.Tensor('{name}', ...) takes a numpy.ndarray, got {type(array).__name__}")
        self._name = name
        self._array = array
        self._dtype = wire_dtype_of(array)

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, dtype: str) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._dtype = dtype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> DataType:
        return DataType[self._dtype]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._dtype == "BYTES":
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors cannot be shared through DLPack")
        array = self._array if self._array.flags.c_contiguous else np.ascontiguousarray(self._array)
        if self._dtype == "BF16":
            # numpy has no bfloat16: hand the raw words over as a torch bfloat16 tensor, which DLPack can describe.
            torch = _torch(f"tensor '{self._name}' is BF16")
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).__dlpack__()
        try:
            return array.__dlpack__()
        except BufferError:
            return np.array(array).__dlpack__()

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        name = as_text(name, "pb_utils.Tensor.from_dlpack name")
        if _is_bfloat16(tensor):
            return Tensor._from_bfloat16(name, tensor)
        source = tensor if hasattr(tensor, "__dlpack__") else _DLPackCapsule(tensor)
        try:
            array = np.from_dlpack(source)
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            if not hasattr(tensor, "__dlpack__") and "torch" in sys.modules:
                imported = sys.modules["torch"].utils.dlpack.from_dlpack(tensor)
                if _is_bfloat16(imported):
                    return Tensor._from_bfloat16(name, imported)
            raise TritonModelException(
                f"tensor '{name}': cannot import it through DLPack ({exc}); only CPU tensors of numpy data types "
                f"and torch bfloat16 tensors are supported"
            ) from None
        return Tensor(name, array)

    @staticmethod
    def _from_bfloat16(name: str, tensor: Any) -> Tensor:
        torch = sys.modules["torch"]
        words = tensor.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        return Tensor._wrap(name, words, "BF16")

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._dtype}, shape={list(self._array.shape)})"


def _torch(why: str) -> Any:
    try:
        import torch
    except ImportError:
        raise TritonModelException(f"{why}: sharing BF16 tensors through DLPack needs torch installed") from None
    return torch


def _is_bfloat16(tensor: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bfloat16


def decode_input(buffer: Any, name: str, dtype: str, shape: tuple[int, ...], offset: int, nbytes: int) -> Tensor:
    """An input tensor as a view of the arena."""
    return Tensor._wrap(name, read_array(buffer, dtype, shape, offset, nbytes, copy=False), dtype)
