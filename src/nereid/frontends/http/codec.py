"""JSON + binary-extension encoding of inference requests and responses for the HTTP protocol."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from nereid.core.dtypes import bf16_to_float32, float32_to_bf16, numpy_dtype, serialize_bytes
from nereid.core.errors import NereidError
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.tensor_codec import array_from_buffer, element_count, reshape_checked
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, RequestedOutput
from nereid.frontends.http.non_finite_json import (
    FLOAT_DATATYPES,
    dumps_with_non_finite,
    first_non_finite,
    literal,
    loads_with_non_finite,
)

__all__ = ["decode_request", "encode_response"]

# The request parameters Triton reserves, and the JSON kind each must have.
_RESERVED_PARAMETERS = {
    "sequence_id": "id",
    "sequence_start": "bool",
    "sequence_end": "bool",
    "priority": "uint",
    "timeout": "uint",
    "binary_data_output": "bool",
}


def _json_data(data: Any, datatype: str, shape: tuple[int, ...], name: str, model: str) -> np.ndarray:
    count = element_count(shape)
    try:
        if datatype == "BYTES":
            flat = _flatten(data)
            array = np.empty(len(flat), dtype=object)
            array[:] = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in flat]
        elif datatype == "BF16":
            array = float32_to_bf16(np.asarray(data, dtype=np.float32).reshape(-1))
        else:
            array = np.asarray(data, dtype=numpy_dtype(datatype)).reshape(-1)
    except KeyError:
        raise NereidError.invalid(f"invalid datatype '{datatype}' for input '{name}' of model '{model}'") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise NereidError.invalid(
            f"Unable to parse 'data' of input '{name}' for model '{model}': expected {datatype} values ({exc})"
        ) from None
    if array.size != count:
        raise NereidError.invalid(
            f"Unable to parse 'data' of input '{name}' for model '{model}': shape {list(shape)} needs {count} "
            f"elements, got {array.size}"
        )
    return reshape_checked(array, shape, name, model)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item))
    return flat


def _shape(value: Any, name: str, model: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise NereidError.invalid(f"input '{name}' for model '{model}': 'shape' must be a list of non-negative integers")
    return tuple(value)


def decode_request(
    body: bytes, header_length: int | None, model: str, version: str, shm: SharedMemoryRegistry
) -> InferenceRequest:
    """Parse a /infer body: JSON, optionally followed by the binary tensor data the JSON points into."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise NereidError.invalid(
                f"Inference-Header-Content-Length {header_length} is larger than the {len(body)}-byte request body"
            )
        header_bytes = memoryview(body)[:header_length]
        binary = memoryview(body)[header_length:]
    else:
        header_bytes = body  # type: ignore[assignment]
        binary = memoryview(b"")
    non_finite = False
    try:
        doc = orjson.loads(header_bytes)
    except orjson.JSONDecodeError as exc:
        # Triton reads NaN/Infinity/-Infinity literals (Python's json.dumps writes them); orjson does not, so
        # only a body orjson refused pays for the second parse.
        try:
            doc = loads_with_non_finite(header_bytes)
        except ValueError:
            raise NereidError.invalid(f"failed to parse the request JSON buffer: {exc}") from None
        non_finite = True
    if not isinstance(doc, dict):
        raise NereidError.invalid("failed to parse the request JSON buffer: expected a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise NereidError.invalid(f"inference request for model '{model}' must have an 'inputs' array")
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise NereidError.invalid(
            f"Unable to parse 'id': attempt to access JSON non-string as string (the request id must be a string, "
            f"got {json.dumps(request_id, default=str)})"
        )
    offset = 0
    inputs: list[InputTensor] = []
    for raw in raw_inputs:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise NereidError.invalid(f"every input of a request for model '{model}' needs a 'name'")
        name = raw["name"]
        datatype = raw.get("datatype")
        if not isinstance(datatype, str):
            raise NereidError.invalid(f"input '{name}' for model '{model}' needs a 'datatype'")
        shape = _shape(raw.get("shape"), name, model)
        params = raw.get("parameters") or {}
        if not isinstance(params, dict):
            raise NereidError.invalid(f"input '{name}' for model '{model}': 'parameters' must be a JSON object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise NereidError.invalid(
                    f"unexpected size for input '{name}', expecting {size} additional bytes for model '{model}'"
                )
            array = array_from_buffer(binary[offset : offset + size], datatype, shape, name, model, request_id)
            offset += size
        elif "shared_memory_region" in params:
            array = _from_shared_memory(shm, params, datatype, shape, name, model, request_id)
        elif "data" in raw:
            if non_finite and datatype not in FLOAT_DATATYPES:
                bad = first_non_finite(raw["data"])
                if bad is not None:
                    raise NereidError.invalid(
                        f"Unable to parse 'data' of input '{name}' for model '{model}': expected {datatype} values, "
                        f"got {literal(bad)}"
                    )
            array = _json_data(raw["data"], datatype, shape, name, model)
        else:
            raise NereidError.invalid(f"input '{name}' for model '{model}' has no 'data', binary data or shared memory")
        inputs.append(InputTensor(name, datatype, shape, array, params))
    if offset != len(binary):
        raise NereidError.invalid(
            f"the request for model '{model}' has {len(binary) - offset} bytes of binary data that no input claims"
        )
    request = InferenceRequest(model, version, inputs, id=request_id)
    parameters = doc.get("parameters")
    if parameters:
        if not isinstance(parameters, dict):
            raise NereidError.invalid("request 'parameters' must be a JSON object")
        request.parameters = parameters
        apply_request_parameters(request, parameters)
    raw_outputs = doc.get("outputs")
    if raw_outputs:
        if not isinstance(raw_outputs, list):
            raise NereidError.invalid(f"inference request for model '{model}': 'outputs' must be a JSON array")
        request.outputs = [_requested_output(o, model) for o in raw_outputs]
    return request


def _requested_output(raw: Any, model: str) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise NereidError.invalid(f"every requested output of a request for model '{model}' needs a 'name'")
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise NereidError.invalid(f"output '{raw['name']}' for model '{model}': 'parameters' must be a JSON object")
    return RequestedOutput(raw["name"], params)


def _bad_parameter(request: InferenceRequest, key: str, value: Any, expected: str) -> NereidError:
    return NereidError.invalid(
        f"Unable to parse '{key}' of the request for model '{request.model_name}': expected {expected}, got {value!r}"
    )


def apply_request_parameters(request: InferenceRequest, parameters: dict[str, Any]) -> None:
    """Triton's reserved request parameters (sequence control, priority, timeout), checked like Triton checks
    them; every other parameter must be a string, integer, float or boolean."""
    for key, value in parameters.items():
        if key in _RESERVED_PARAMETERS:
            kind = _RESERVED_PARAMETERS[key]
            if kind == "bool":
                if not isinstance(value, bool):
                    raise _bad_parameter(request, key, value, "a boolean")
            elif kind == "uint":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise _bad_parameter(request, key, value, "an unsigned integer")
            elif not isinstance(value, (int, str)) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
                raise _bad_parameter(request, key, value, "an unsigned integer or a string")
        elif value is not None and not isinstance(value, (str, int, float)):
            raise NereidError.invalid(
                f"parameter '{key}' of the request for model '{request.model_name}' has invalid type. It should be "
                f"either 'int', 'bool', 'float' or 'string'."
            )
    if "sequence_id" in parameters:
        request.correlation_id = parameters["sequence_id"]
    if parameters.get("sequence_start"):
        request.flags |= SEQUENCE_START
    if parameters.get("sequence_end"):
        request.flags |= SEQUENCE_END
    if "priority" in parameters:
        request.priority = parameters["priority"]
    if "timeout" in parameters:
        request.timeout_us = parameters["timeout"]


def _from_shared_memory(
    shm: SharedMemoryRegistry,
    params: dict[str, Any],
    datatype: str,
    shape: tuple[int, ...],
    name: str,
    model: str,
    request_id: str,
) -> np.ndarray:
    region = params["shared_memory_region"]
    try:
        byte_size = int(params.get("shared_memory_byte_size", 0))
        offset = int(params.get("shared_memory_offset", 0))
    except (TypeError, ValueError):
        raise NereidError.invalid(
            f"input '{name}' for model '{model}': shared_memory_byte_size and shared_memory_offset must be integers"
        ) from None
    region_view = shm.read(str(region), offset, byte_size, "UINT8", (byte_size,))
    return array_from_buffer(region_view.data, datatype, shape, name, model, request_id)


def _json_values(array: np.ndarray, datatype: str) -> Any:
    if datatype == "BYTES":
        return [b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b) for b in array.reshape(-1)]
    if datatype == "BF16":
        return bf16_to_float32(array).reshape(-1)
    return array.reshape(-1)


def _raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array).tobytes()


def encode_response(
    response: InferenceResponse, request: InferenceRequest
) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs follow the JSON, the JSON header's length."""
    binary_default = bool(request.parameters.get("binary_data_output", False)) if request.parameters else False
    wanted: dict[str, dict[str, Any]] = {o.name: o.parameters for o in request.outputs} if request.outputs else {}
    outputs: list[dict[str, Any]] = []
    json_floats = False  # a float output written as JSON: it may hold NaN or infinities
    chunks: list[bytes] = []
    for output in response.outputs:
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": list(output.shape)}
        if output.parameters:
            if "shared_memory_region" in output.parameters:
                # The data is in the region; like Triton, the entry carries no data and no shm parameters.
                outputs.append(entry)
                continue
            entry["parameters"] = dict(output.parameters)
        params = wanted.get(output.name)
        binary = params.get("binary_data", binary_default) if params else binary_default
        if binary:
            raw = _raw(output.data, output.datatype)
            entry.setdefault("parameters", {})["binary_data_size"] = len(raw)
            chunks.append(raw)
        else:
            entry["data"] = _json_values(output.data, output.datatype)
            if output.datatype in FLOAT_DATATYPES:
                json_floats = True
        outputs.append(entry)
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if json_floats and b"null" in header:  # orjson writes NaN and infinities as null; Triton writes its literals
        header = dumps_with_non_finite(doc)
    if not chunks or not any(chunks):  # no binary bytes (none asked, or all empty): a JSON body, as Triton
        return header, None
    return header + b"".join(chunks), len(header)
