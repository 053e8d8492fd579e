"""Convert between gRPC ModelInfer messages and core requests/responses."""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.internal.encoder import _VarintBytes as _varint  # protobuf's own varint writer
from tritonclient.grpc import service_pb2 as pb

from nereid.core.decode_plan import ID_CUT, PLAN_HEADER_BYTES, PlanTable
from nereid.core.dtypes import numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.request_parameters import (
    RESERVED_PARAMETERS,
    apply_request_parameters,
    reserved_for_triton,
    reserved_header_error,
)
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.tensor_codec import array_from_buffer, element_count, reshape_checked, tensor_bytes
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, RequestedOutput

__all__ = ["decode_infer_request", "encode_infer_response", "parameters_to_dict", "dict_to_parameters"]

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# The value kinds Triton takes for an inference request's own parameters (its reserved ones are checked by value,
# as tritonclient sends `priority` as a uint64_param); an unset or uint64 value is refused.
_INFER_PARAMETER_KINDS = frozenset({"bool_param", "int64_param", "string_param", "double_param"})
_ANY_KIND = frozenset({*_INFER_PARAMETER_KINDS, "uint64_param", "bytes_param"})  # every field of both oneofs


def parameters_to_dict(parameters: Any, kinds: frozenset[str] = _ANY_KIND) -> dict[str, Any]:
    """A protobuf parameter map (InferParameter or ModelRepositoryParameter values) as a dict; a value whose oneof
    is unset reads as None. With `kinds`, a value of another kind (or unset) is refused in Triton's words, but for
    the reserved parameters. The one reading of such a map, for inference and repository requests alike."""
    result: dict[str, Any] = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        if which in kinds:  # the common case costs one set lookup
            result[key] = getattr(value, which)
        elif kinds is _ANY_KIND or key in RESERVED_PARAMETERS:
            result[key] = getattr(value, which) if which else None
        else:
            raise NereidError.invalid(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
            )
    return result


def dict_to_parameters(target: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


# The typed fields of InferTensorContents in the order Triton reads them, and the type each one carries.
_CONTENTS_TYPES = (
    ("bool_contents", "BOOL"),
    ("int_contents", "INT32"),
    ("int64_contents", "INT64"),
    ("uint_contents", "UINT32"),
    ("uint64_contents", "UINT64"),
    ("fp32_contents", "FP32"),
    ("fp64_contents", "FP64"),
    ("bytes_contents", "BYTES"),
)


def _typed_contents(tensor: Any, datatype: str, shape: tuple[int, ...], model: str, request_id: str) -> np.ndarray:
    """An input's data from its typed `contents`, refused as Triton refuses it: two fields set, a field that is
    not the one for the datatype, or an element count that does not fill the shape."""
    name = tensor.name
    contents = tensor.contents
    wanted = _CONTENTS_FIELD.get(datatype)
    values: Any = None
    for field, field_type in _CONTENTS_TYPES:
        candidate = getattr(contents, field)
        if not candidate:
            continue
        if values is not None:
            raise NereidError.invalid(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', binary data was "
                f"already supplied."
            )
        if field != wanted:
            raise NereidError.invalid(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{field_type}', expected datatype '{datatype}'"
            )
        values = candidate
    count = element_count(shape)
    got = len(values) if values is not None else 0
    prefix = f"[request id: {request_id or '<id_unknown>'}]"
    if datatype == "BYTES":
        if got < count:
            raise NereidError.invalid(
                f"{prefix} expected {count} string elements for inference input '{name}' for model '{model}', got {got}"
            )
        if got > count:
            raise NereidError.invalid(
                f"{prefix} unexpected number of string elements {got} for inference input '{name}' for model "
                f"'{model}', expecting {count}"
            )
        array = np.empty(count, dtype=object)
        array[:] = list(values or ())
        return reshape_checked(array, shape, name, model)
    try:
        dtype = numpy_dtype(datatype)
    except KeyError:
        raise NereidError.invalid(f"invalid datatype '{datatype}' for input '{name}' of model '{model}'") from None
    if got != count:
        size = dtype.itemsize
        raise NereidError.invalid(
            f"{prefix} input byte size mismatch for input '{name}' for model '{model}'. Expected {count * size}, "
            f"got {got * size}"
        )
    return reshape_checked(np.asarray(values if values is not None else (), dtype=dtype), shape, name, model)


# ModelInfer headers already decoded: the serialized message up to its raw input contents (see core/decode_plan.py).
_PLANS = PlanTable()
_RAW_TAG = 0x3A  # raw_input_contents: field 7, length-delimited
_NAME_TAG, _VERSION_TAG, _ID_TAG = 0x0A, 0x12, 0x1A  # model_name, model_version, id: fields 1-3, length-delimited


def _check_forwarded(forwarded: dict[str, str]) -> None:
    """Forwarded metadata may not take a parameter name reserved for Triton; tritonserver refuses the request."""
    for name in forwarded:
        if reserved_for_triton(name):
            raise reserved_header_error(name)


def _prefix(tag: int, length: int) -> bytes:
    """A length-delimited field's tag and length as protobuf writes them."""
    return bytes((tag, length)) if length < 0x80 else bytes((tag,)) + _varint(length)


def _field(tag: int, value: str) -> bytes:
    """A string field as protobuf writes it (nothing where the value is empty)."""
    if not value:
        return b""
    encoded = value.encode()
    return _prefix(tag, len(encoded)) + encoded


def _plan_key(header: bytes, message: Any) -> tuple[bytes, str | None]:
    """The decode plan's key for a ModelInfer header: the header, or where it has the request id right after the
    model's name and version (protobuf writes fields in their order), the rest of it marked with ID_CUT, and that
    id. The field cut is the one the parsed message holds, so a repeated id field cannot make two keys alike."""
    request_id = message.id
    if not request_id:
        return header, None
    position = len(_field(_NAME_TAG, message.model_name)) + len(_field(_VERSION_TAG, message.model_version))
    field = _field(_ID_TAG, request_id)
    if not header.startswith(field, position):
        return header, None
    return ID_CUT + header[:position] + header[position + len(field) :], request_id


def _header_of(payload: bytes, raw: list[bytes]) -> bytes | None:
    """The bytes of `payload` before its raw input contents when those are its last fields, one after another (as
    tritonclient and perf_analyzer write them) and the bytes before are at most PLAN_HEADER_BYTES; else None."""
    prefixes = [_prefix(_RAW_TAG, len(r)) for r in raw]
    start = len(payload) - sum(map(len, raw)) - sum(map(len, prefixes))
    if not 0 <= start <= PLAN_HEADER_BYTES:
        return None
    position = start
    for item, prefix in zip(raw, prefixes):
        if not payload.startswith(prefix, position):
            return None
        position += len(prefix) + len(item)
    return payload[:start]


def decode_infer_request(
    message: Any, shm: SharedMemoryRegistry, forwarded: dict[str, str] | None = None, payload: bytes = b""
) -> InferenceRequest:
    """`forwarded`: string parameters from request metadata; they come after the message's own (tritonserver
    keeps both under one name; read as a map, as a model's JSON parameters are, the header's value wins).
    `payload`: the serialized message, when the caller has it: its header then keys a decode plan."""
    model = message.model_name
    raw = message.raw_input_contents
    header = None
    if payload:
        raw = list(raw)  # read once: each read of a repeated bytes field makes a new bytes object
        header = _header_of(payload, raw)
        plan = cut_id = None
        if header is not None:
            header, cut_id = _plan_key(header, message)
            plan = _PLANS.get(header)
        if plan is not None and plan.sizes == [len(r) for r in raw]:
            request = plan.request(raw, model, message.model_version, cut_id)
            if forwarded:
                _check_forwarded(forwarded)
                request.parameters = {**request.parameters, **forwarded}
            return request
    # raw_input_contents holds one entry per input that is not in shared memory, in the inputs' order.
    raw_index = 0
    inputs: list[InputTensor] = []
    for tensor in message.inputs:
        shape = tuple(tensor.shape)
        datatype = tensor.datatype
        params = parameters_to_dict(tensor.parameters) if tensor.parameters else {}
        if any(d < 0 for d in shape):
            raise NereidError.invalid(f"input '{tensor.name}' for model '{model}': shape dims must be >= 0")
        if "shared_memory_region" in params:
            if tensor.HasField("contents"):
                raise NereidError.invalid(
                    f"unexpected 'content' provided when using shared memory for input tensor '{tensor.name}' for "
                    f"model '{model}'"
                )
            array = shm.input_array(params, datatype, shape, tensor.name, model, message.id)
        elif raw:
            if tensor.HasField("contents"):
                raise NereidError.invalid(
                    f"contents field must not be specified when using raw_input_contents for '{tensor.name}' for "
                    f"model '{model}'"
                )
            if raw_index >= len(raw):
                raise NereidError.invalid(
                    f"unable to find data for input tensor '{tensor.name}' for model '{model}' in request."
                )
            array = array_from_buffer(raw[raw_index], datatype, shape, tensor.name, model, message.id)
            raw_index += 1
        elif tensor.HasField("contents"):
            array = _typed_contents(tensor, datatype, shape, model, message.id)
        else:
            raise NereidError.invalid(
                f"unable to find data for input tensor '{tensor.name}' for model '{model}' in request."
            )
        inputs.append(InputTensor(tensor.name, datatype, shape, array, params))
    if raw_index != len(raw):
        raise NereidError.invalid(
            f"the request for model '{model}' has {len(raw)} raw input contents but only {raw_index} inputs read "
            f"raw contents"
        )
    request = InferenceRequest(model, message.model_version, inputs, id=message.id)
    if message.parameters:
        parameters = parameters_to_dict(message.parameters, _INFER_PARAMETER_KINDS)
        sequence_id = parameters.get("sequence_id")
        if isinstance(sequence_id, int) and not isinstance(sequence_id, bool) and sequence_id < 0:
            # Triton reads an int64_param sequence ID as the uint64 with the same bits.
            parameters["sequence_id"] = sequence_id + (1 << 64)
        apply_request_parameters(request, parameters)
    if message.outputs:
        request.outputs = [
            RequestedOutput(o.name, parameters_to_dict(o.parameters) if o.parameters else {}) for o in message.outputs
        ]
    if header is not None and raw_index == len(inputs):  # every input from its raw contents
        _PLANS.keep(header, request)
    if forwarded:
        _check_forwarded(forwarded)
        request.parameters = {**request.parameters, **forwarded}
    return request


def encode_infer_response(response: InferenceResponse) -> Any:
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version, id=response.id)
    raw = message.raw_output_contents
    for output in response.outputs:
        entry = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if output.parameters:
            if "shared_memory_region" in output.parameters:
                raw.append(b"")  # the data is in the region; keeps raw_output_contents aligned with outputs
                continue
            dict_to_parameters(entry.parameters, output.parameters)
        raw.append(tensor_bytes(output.data, output.datatype))
    if response.parameters:
        dict_to_parameters(message.parameters, response.parameters)
    return message
