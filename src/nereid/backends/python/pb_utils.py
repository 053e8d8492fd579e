"""The `triton_python_backend_utils` module that Triton `model.py` files import, as Nereid's worker provides it.

The worker installs this module under Triton's name before it imports a model. Everything here runs inside the
worker process: requests arrive as views of the shared-memory input arena, and logging, custom metrics and BLS go
back to the server over the worker's channel (see `worker.Runtime`). This module must not import the server.
"""

from __future__ import annotations

import enum
import json
import re
import struct
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from nereid.backends.python.pb_strings import as_message, as_text
from nereid.backends.python.protocol import (
    CALL_FAMILY,
    CALL_LOAD,
    CALL_METRIC_VALUE,
    CALL_MODEL_READY,
    CALL_UNLOAD,
    RESERVED_PARAMETERS,
    CallError,
)
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START

__all__ = [
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "TritonError",
    "TritonModelException",
    "Logger",
    "LogLevel",
    "MetricFamily",
    "Metric",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_model_dir",
    "load_model",
    "unload_model",
    "is_model_ready",
    "TRITON_STRING_TO_NUMPY",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = SEQUENCE_START
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = SEQUENCE_END
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2


# -- data types --------------------------------------------------------------------------------------
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


# Wire names -> numpy dtypes. BF16 has no numpy type: its raw 16-bit words are carried as uint16.
NUMPY_OF: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(np.object_),
}
_WIRE_OF: dict[np.dtype, str] = {dt: name for name, dt in NUMPY_OF.items() if name not in ("BF16", "BYTES")}

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_NUMPY_OF_CODE: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def wire_dtype_of(array: np.ndarray) -> str:
    """The wire name for an array's dtype: object, bytes and str arrays are BYTES."""
    dtype = array.dtype
    name = _WIRE_OF.get(dtype)
    if name is not None:
        return name
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    raise TritonModelException(f"numpy dtype {dtype} has no Triton data type")


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type for a TRITONSERVER data type number (13, BYTES, is np.object_); None when unknown."""
    return _NUMPY_OF_CODE.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER data type number for a numpy type or dtype; None when it has none."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S"):
        return int(DataType.BYTES)
    name = _WIRE_OF.get(dtype)
    return int(DataType[name]) if name is not None else None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


# -- BYTES tensors -------------------------------------------------------------------------------------
_U32 = struct.Struct("<I")


def _element_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes:
    """Triton's BYTES layout: every element (C order) as a 4-byte little-endian length and its bytes."""
    pack = _U32.pack
    parts: list[bytes] = []
    for item in input_tensor.reshape(-1).tolist() if input_tensor.dtype.kind != "O" else input_tensor.reshape(-1):
        data = _element_bytes(item)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_bytes(buffer: Any, offset: int, nbytes: int, count: int) -> np.ndarray:
    """`count` BYTES elements from buffer[offset:offset+nbytes] as a 1-D object array of bytes."""
    result = np.empty(count, dtype=np.object_)
    view = memoryview(buffer)[offset : offset + nbytes]
    unpack = _U32.unpack_from
    position = 0
    try:
        for index in range(count):
            (length,) = unpack(view, position)
            position += 4
            end = position + length
            if end > nbytes:
                raise ValueError("a BYTES element runs past the end of its tensor")
            result[index] = bytes(view[position:end])
            position = end
    except struct.error:
        raise ValueError("a BYTES tensor is shorter than its shape says") from None
    finally:
        view.release()
    return result


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    items: list[bytes] = []
    view = memoryview(encoded_tensor)
    position = 0
    while position < len(view):
        (length,) = _U32.unpack_from(view, position)
        position += 4
        items.append(bytes(view[position : position + length]))
        position += length
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


# -- errors ----------------------------------------------------------------------------------------------
class TritonModelException(Exception):
    """Raised by this module when a model misuses it; a model may raise it too."""


class ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error for one response: `InferenceResponse(error=TritonError("bad input", TritonError.INVALID_ARG))`."""

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        self._message = as_message(message)
        try:
            self._code = ErrorCode(int(code))
        except ValueError:
            self._code = ErrorCode.INTERNAL

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"


# -- the runtime the worker plugs in -----------------------------------------------------------------------
class _Detached:
    """What this module talks to before a worker binds it (for example when a model file is imported in a test)."""

    version_dir = ""
    in_execute = False

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        sys.stderr.write(f"{filename}:{lineno}] {message}\n")

    def metric_op(self, op: tuple[Any, ...]) -> None:
        raise TritonModelException("custom metrics work only inside a model served by the Python backend")

    def call(self, kind: str, payload: Any) -> Any:
        raise TritonModelException("this call works only inside a model served by the Python backend")

    def send_response(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None:
        raise TritonModelException("response senders work only inside a model served by the Python backend")

    def is_cancelled(self, request: InferenceRequest) -> bool:
        return False

    def repository_call(self, kind: str, payload: Any, action: str) -> Any:
        raise TritonModelException(f"{action}_model works only inside a model served by the Python backend")

    def bls(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a model served by the Python backend")

    def bls_async(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a model served by the Python backend")


_runtime: Any = _Detached()


def _bind(runtime: Any) -> None:
    global _runtime
    _runtime = runtime


def _call(kind: str, payload: Any, what: str) -> Any:
    try:
        return _runtime.call(kind, payload)
    except CallError as exc:
        raise TritonModelException(f"{what}: {exc.message}") from None


# -- tensors -----------------------------------------------------------------------------------------------
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


def read_array(buffer: Any, dtype: str, shape: Any, offset: int, nbytes: int, copy: bool) -> np.ndarray:
    """One tensor laid out in an arena: a view, or a copy when the writer will reuse the space (BYTES elements
    are always copied out into an object array)."""
    if dtype == "BYTES":
        count = 1
        for dim in shape:
            count *= dim
        return decode_bytes(buffer, offset, nbytes, count).reshape(shape)
    np_dtype = NUMPY_OF[dtype]
    if nbytes == 0:
        return np.empty(shape, np_dtype)
    array = np.frombuffer(buffer, np_dtype, nbytes // np_dtype.itemsize, offset).reshape(shape)
    return array.copy() if copy else array


def decode_input(buffer: Any, name: str, dtype: str, shape: tuple[int, ...], offset: int, nbytes: int) -> Tensor:
    """An input tensor as a view of the arena."""
    return Tensor._wrap(name, read_array(buffer, dtype, shape, offset, nbytes, copy=False), dtype)


# -- requests and responses ----------------------------------------------------------------------------------
class InferenceResponseSender:
    """Sends a request's responses: any number, then one with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL (decoupled
    models, from any thread, during or after execute()); a model that is not decoupled sends exactly one response,
    with the final flag, during execute() and returns None."""

    __slots__ = ("_request",)

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        _runtime.send_response(self._request, response, flags)

    def is_cancelled(self) -> bool:
        return bool(_runtime.is_cancelled(self._request))


class InferenceRequest:
    """A request the model received, or (when a model builds one) a BLS request to another model."""

    __slots__ = (
        "_id",
        "_correlation_id",
        "_flags",
        "_timeout",
        "_parameters",
        "_requested",
        "_wire_inputs",
        "_buffer",
        "_tensors",
        "_model_outputs",
        "_model_name",
        "_model_version",
        "_release_flags",
        "_seq",
        "_index",
        "_final",
        "_sent",
        "_parameters_json",
    )

    def __init__(
        self,
        model_name: str = "",
        requested_output_names: Iterable[str] | None = None,
        inputs: Iterable[Tensor] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # Names and ids are read as Triton's pybind11 layer reads a std::string: bytes (a name taken out of a BYTES
        # tensor) and numpy strings are text too.
        self._model_name = as_text(model_name, "InferenceRequest model_name")
        self._model_version = model_version
        self._requested = tuple(
            as_text(name, "InferenceRequest requested_output_names") for name in requested_output_names or ()
        )
        self._tensors: list[Tensor] | None = list(inputs or ())
        self._wire_inputs: tuple[Any, ...] = ()
        self._buffer = None
        self._model_outputs: tuple[str, ...] = ()
        self._id = as_text(request_id, "InferenceRequest request_id")
        if isinstance(correlation_id, str):
            correlation_id = as_text(correlation_id, "InferenceRequest correlation_id")
        elif not isinstance(correlation_id, int):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters = _request_parameters(parameters)
        self._parameters_json: str | None = json.dumps(self._parameters)  # as Triton renders a model's own request
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._seq = self._index = 0
        self._final = False
        self._sent: InferenceResponse | None = None

    @classmethod
    def _received(
        cls, wire: tuple[Any, ...], buffer: Any, model_outputs: tuple[str, ...], seq: int, index: int
    ) -> InferenceRequest:
        request = cls.__new__(cls)
        (
            request._id,
            request._correlation_id,
            request._flags,
            request._timeout,
            request._parameters,
            request._requested,
            request._wire_inputs,
        ) = wire
        request._buffer = buffer
        request._tensors = None
        request._model_outputs = model_outputs
        request._model_name = ""
        request._model_version = -1
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._seq = seq
        request._index = index
        request._final = False
        request._sent = None  # the response a model that is not decoupled sent through its sender
        request._parameters_json = None
        return request

    # -- what the model reads ------------------------------------------------------------------------
    def inputs(self) -> list[Tensor]:
        tensors = self._tensors
        if tensors is None:
            buffer = self._buffer
            tensors = self._tensors = [decode_input(buffer, *meta) for meta in self._wire_inputs]
        return tensors

    def _input(self, name: str) -> Tensor | None:
        for tensor in self.inputs():
            if tensor._name == name:
                return tensor
        return None

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        if self._parameters_json is not None:
            return self._parameters_json
        params = self._parameters
        if params and not RESERVED_PARAMETERS.isdisjoint(params):
            params = {k: v for k, v in params.items() if k not in RESERVED_PARAMETERS}
        return json.dumps(params or {}, separators=(",", ":"))

    def requested_output_names(self) -> set[str]:
        return set(self._requested) if self._requested else set(self._model_outputs)

    def is_cancelled(self) -> bool:
        return bool(_runtime.is_cancelled(self))

    def get_response_sender(self) -> InferenceResponseSender:
        return InferenceResponseSender(self)

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = flags

    def trace(self) -> None:
        return None

    # -- BLS ------------------------------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the server's model `model_name` and wait: its InferenceResponse (an error of the
        request is inside it, not raised), or with `decoupled=True` an iterator over the responses of a decoupled
        model that ends after the final one. Works from execute() and from any thread the model starts."""
        return _runtime.bls(self, bool(decoupled))

    def async_exec(self, decoupled: bool = False) -> Any:
        """Send this request now and return an awaitable of what exec() returns; call it from a coroutine (`async
        def execute`), so that several requests are in flight at once."""
        return _runtime.bls_async(self, bool(decoupled))


def _request_parameters(parameters: Any) -> dict[str, Any]:
    """A BLS request's parameters, checked as Triton checks them when the request is built."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    result: dict[str, Any] = {}
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        result[str.__str__(key)] = str.__str__(value) if isinstance(value, str) else value
    return result


class InferenceResponse:
    """One response: output tensors, or an error; `parameters` (a dict or JSON object) travel with it."""

    __slots__ = ("_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._tensors = list(output_tensors) if output_tensors is not None else []
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse(error=...) takes a pb_utils.TritonError, got {type(error).__name__}")
        self._error = error
        if parameters is None:
            self._parameters = None
        else:
            if isinstance(parameters, str):
                parameters = json.loads(parameters) if parameters else {}
            if not isinstance(parameters, dict):
                raise TypeError("InferenceResponse(parameters=...) takes a dict or a JSON object string")
            for key, value in parameters.items():
                if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
                    raise TypeError(
                        f"response parameter '{key}': keys must be strings and values str, int, float or bool"
                    )
            self._parameters = parameters or None

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters or {}, separators=(",", ":"))


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    if isinstance(inference_request, InferenceRequest):
        return inference_request._input(name)
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# -- model configuration helpers -------------------------------------------------------------------------------
def _config_dict(model_config: dict[str, Any] | str) -> dict[str, Any]:
    return json.loads(model_config) if isinstance(model_config, str) else model_config


def get_input_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    for entry in _config_dict(model_config).get("input", []):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    for entry in _config_dict(model_config).get("output", []):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any] | str) -> bool:
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives: the config so far, and ways to fill it in."""

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        self._config: dict[str, Any] = _config_dict(model_config)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def _model(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"model '{self._model()}': auto_complete_config sets max_batch_size {max_batch_size}, below the "
                f"max_batch_size {configured} that the configuration asks for"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"model '{self._model()}': auto_complete_config asks for dynamic_batching but the configuration "
                    f"already uses '{other}'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._model()
        label = f"{kind} '{tensor.get('name', '')}'"
        unknown = [key for key in tensor if key not in allowed]
        if unknown:
            raise ValueError(
                f"model '{model}': auto_complete_config {label} has properties {unknown}; only {list(allowed)} may be set"
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"model '{model}': auto_complete_config {label} is missing '{required}'")
        for existing in self._config.setdefault(kind, []):
            if existing.get("name") != tensor["name"]:
                continue
            configured_type = existing.get("data_type", "TYPE_INVALID")
            if configured_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"model '{model}', {label}: the configuration says data_type {configured_type} but the model "
                    f"says {tensor['data_type']}"
                )
            configured_dims = existing.get("dims") or []
            if configured_dims and list(configured_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', {label}: the configuration says dims {list(configured_dims)} but the model "
                    f"says {list(tensor['dims'])}"
                )
            if "optional" in existing and "optional" in tensor and existing["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', {label}: the configuration says optional {existing['optional']} but the "
                    f"model says {tensor['optional']}"
                )
            existing["data_type"] = tensor["data_type"]
            existing["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                existing["optional"] = tensor["optional"]
            return
        self._config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._model()
        unknown = [key for key in transaction_policy_dict if key != "decoupled"]
        if unknown:
            raise ValueError(
                f"model '{model}': auto_complete_config model_transaction_policy has properties {unknown}; only "
                f"'decoupled' may be set"
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"model '{model}': auto_complete_config cannot change 'decoupled', which the configuration "
                    f"sets to {policy['decoupled']}"
                )
            policy["decoupled"] = wanted


# -- logging ---------------------------------------------------------------------------------------------------
class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Writes to the server's log, with the caller's file and line: `pb_utils.Logger.log_info("loaded")`."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        frame = sys._getframe(1)
        _runtime.log(int(level), as_message(message), frame.f_code.co_filename, frame.f_lineno)

    @staticmethod
    def log_info(message: str) -> None:
        frame = sys._getframe(1)
        _runtime.log(0, as_message(message), frame.f_code.co_filename, frame.f_lineno)

    @staticmethod
    def log_warn(message: str) -> None:
        frame = sys._getframe(1)
        _runtime.log(1, as_message(message), frame.f_code.co_filename, frame.f_lineno)

    @staticmethod
    def log_error(message: str) -> None:
        frame = sys._getframe(1)
        _runtime.log(2, as_message(message), frame.f_code.co_filename, frame.f_lineno)

    @staticmethod
    def log_verbose(message: str) -> None:
        frame = sys._getframe(1)
        _runtime.log(3, as_message(message), frame.f_code.co_filename, frame.f_lineno)


# -- custom metrics ----------------------------------------------------------------------------------------------
class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricFamily:
    """A custom metric family on the server's metrics endpoint; `family.Metric(labels=...)` makes one series."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        try:
            self._kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException(f"metric family '{name}': unknown kind {kind!r}") from None
        self._name = as_text(name, "MetricFamily name")
        self._description = as_text(description, "MetricFamily description")
        _call(CALL_FAMILY, (self._name, self._description, int(self._kind)), f"cannot create metric family '{name}'")

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        return Metric(self, labels, buckets)


class Metric:
    """One labelled series of a MetricFamily."""

    __slots__ = ("_family", "_kind", "_key")

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> None:
        self._family = family._name
        self._kind = family._kind
        label_items = []
        for key, value in (labels or {}).items():
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                raise TritonModelException(f"metric family '{family._name}': invalid label name {key!r}")
            if isinstance(value, (bytes, bytearray)):  # Triton's labels go through json.dumps, which refuses bytes
                raise TypeError(f"metric family '{family._name}': label '{key}' must be a str, got {type(value).__name__}")
            label_items.append((key, str(value)))
        self._key = tuple(sorted(label_items))
        bucket_list: tuple[float, ...] | None = None
        if family._kind == MetricKind.HISTOGRAM:
            if buckets is None:
                raise TritonModelException(f"metric family '{family._name}' is a histogram: Metric() needs buckets")
            bucket_list = tuple(sorted(float(b) for b in buckets))
        elif buckets is not None:
            raise TritonModelException(
                f"metric family '{family._name}' is a {family._kind.name.lower()}: only histograms take buckets"
            )
        _runtime.metric_op(("m", self._family, self._key, bucket_list))

    def _refuse(self, what: str) -> TritonModelException:
        return TritonModelException(f"metric family '{self._family}' is a {self._kind.name}: {what}() is not supported")

    def increment(self, value: float) -> None:
        if self._kind == MetricKind.HISTOGRAM:
            raise self._refuse("increment")
        if self._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(f"metric family '{self._family}' is a COUNTER: it cannot decrease ({value})")
        _runtime.metric_op(("i", self._family, self._key, float(value)))

    def set(self, value: float) -> None:
        if self._kind != MetricKind.GAUGE:
            raise self._refuse("set")
        _runtime.metric_op(("s", self._family, self._key, float(value)))

    def observe(self, value: float) -> None:
        if self._kind != MetricKind.HISTOGRAM:
            raise self._refuse("observe")
        _runtime.metric_op(("o", self._family, self._key, float(value)))

    def value(self) -> float:
        if self._kind == MetricKind.HISTOGRAM:
            raise self._refuse("value")
        return float(_call(CALL_METRIC_VALUE, (self._family, self._key), f"cannot read metric '{self._family}'"))


# -- the rest of the module's surface ------------------------------------------------------------------------------
class PreferredMemory:
    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def get_model_dir() -> str:
    """The folder of the running model.py (the model version folder)."""
    return str(_runtime.version_dir)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, optionally with a JSON config and `file:<path>` contents
    (explicit model control mode only, as Triton's load API)."""
    model_name = as_text(model_name, "load_model model_name")
    overrides: dict[str, bytes] = {}
    for key, value in (files or {}).items():
        if not isinstance(key, (str, bytes, bytearray)) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise TritonModelException(f"load_model('{model_name}'): files maps 'file:<path>' strings to bytes")
        overrides[as_text(key, "load_model files key")] = bytes(value)
    config_text = as_text(config, "load_model config") if config else ""
    _runtime.repository_call(CALL_LOAD, (model_name, config_text, overrides), "load")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _runtime.repository_call(CALL_UNLOAD, (as_text(model_name, "unload_model model_name"), bool(unload_dependents)), "unload")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    name = as_text(model_name, "is_model_ready model_name")
    version = as_text(model_version, "is_model_ready model_version") if model_version else ""
    return bool(_runtime.repository_call(CALL_MODEL_READY, (name, version), "query"))
