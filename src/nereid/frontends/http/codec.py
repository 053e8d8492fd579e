"""JSON + binary-extension encoding of inference requests and responses for the HTTP protocol."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson

from nereid.core.decode_plan import ID_CUT, PLAN_HEADER_BYTES, PlanTable
from nereid.core.dtypes import bf16_to_float32, element_size, float32_to_bf16, numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.request_parameters import apply_request_parameters, parameters_object, reserved_header_error
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.tensor_codec import array_from_buffer, element_count, reshape_checked, tensor_bytes
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, RequestedOutput
from nereid.frontends.http.json_data import flatten, wrong_kind
from nereid.frontends.http.non_finite_json import (
    FLOAT_DATATYPES,
    dumps_with_non_finite,
    first_non_finite,
    literal,
    loads_with_non_finite,
)
from nereid.frontends.http.numeric_json import loads_numeric

__all__ = ["decode_request", "encode_response", "json_object"]

# Binary-mode JSON headers already decoded (see core/decode_plan.py).
_PLANS = PlanTable()
# A header that starts with its request id, as perf_analyzer's async mode (`{"id":"7","inputs":...`) and
# tritonclient (`{"id": "7", "inputs": ...`) write it; an id with escapes or control characters is left in.
_LEADING_ID = re.compile(rb'\{"id": ?"([^"\\\x00-\x1f]*)", ?')


def _plan_key(header: bytes) -> tuple[bytes, str | None]:
    """The decode plan's key for a JSON header: the header, or where it starts with its id, the rest of it marked
    with ID_CUT, and that id."""
    if not header.startswith(b'{"id"') or header.startswith(b'{"id":"",'):
        return header, None  # no id first, or perf_analyzer's empty one in its sync mode: the header repeats whole
    match = _LEADING_ID.match(header)
    # Not where "id" comes again: JSON's last value wins, and the key would have kept the wrong one.
    if match is None or header.find(b'"id"', match.end()) >= 0:
        return header, None
    try:
        request_id = match.group(1).decode()
    except UnicodeDecodeError:
        return header, None
    return ID_CUT + header[match.end() :], request_id


def json_object(body: bytes, non_finite: bool = False) -> dict[str, Any]:
    """A JSON object body (an empty body is {}), or Triton's parse error. With `non_finite`, the NaN and Infinity
    literals Triton reads in tensor data are read too."""
    value = _loads(body, non_finite)[0] if body else {}
    if not isinstance(value, dict):
        raise NereidError.invalid("failed to parse the request JSON buffer: expected a JSON object")
    return value


def _loads(body: bytes | memoryview, non_finite: bool) -> tuple[Any, bool]:
    """orjson's parse of `body`, and False; where orjson refused it and `non_finite` allows, the parse that reads
    Triton's NaN/Infinity literals, and True. Triton's parse error otherwise."""
    try:
        return orjson.loads(body), False
    except orjson.JSONDecodeError as exc:
        # Triton reads NaN/Infinity/-Infinity literals (Python's json.dumps writes them); orjson does not, so
        # only a body orjson refused pays for the second parse.
        if non_finite:
            try:
                return loads_with_non_finite(body), True
            except ValueError:
                pass
        raise NereidError.invalid(f"failed to parse the request JSON buffer: {exc}") from None


def _json_string(item: Any) -> bytes:
    """One BYTES element of a JSON body. Only strings: bytes(n) of a number would allocate n zero bytes, so a body
    of a few bytes asking for 10**10 of them would take the server to gigabytes of memory."""
    if not isinstance(item, str):
        raise TypeError(f"expected a string, got {type(item).__name__}")
    return item.encode("utf-8")


_INT64_MAX = 2**63 - 1


def _check_overflow(count: int, datatype: str, shape: tuple[int, ...], name: str) -> None:
    """A shape whose element count, or byte size, does not fit in 64 bits: refused in tritonserver's words."""
    if count > _INT64_MAX:
        raise NereidError.invalid(
            f"invalid shape for input '{name}': shape [{','.join(map(str, shape))}] causes total element count to exceed "
            f"maximum size of {_INT64_MAX}"
        )
    try:
        size = element_size(datatype)
    except KeyError:
        return  # an unknown data type is refused in words of its own
    if size > 1 and count > _INT64_MAX // size:
        raise NereidError.invalid(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) exceeds maximum "
            f"allowed size ({_INT64_MAX})"
        )


def _json_data(data: Any, datatype: str, shape: tuple[int, ...], name: str, model: str) -> np.ndarray:
    count = element_count(shape)
    if count > 2**31:  # only a shape this large can overflow
        _check_overflow(count, datatype, shape, name)
    try:
        flat: np.ndarray | list[Any]
        if isinstance(data, np.ndarray):  # numbers numeric_json read, of the right JSON kind already
            flat = data
        else:
            flat = flatten(data)  # any nesting, ragged included, as Triton reads it
            # BYTES elements are checked one by one below, with words of their own.
            bad = wrong_kind(flat, datatype) if datatype != "BYTES" else None
            if bad is not None:
                raise NereidError.invalid(
                    f"Unable to parse 'data' of input '{name}' for model '{model}': expected {datatype} values, got {bad}"
                )
        if datatype == "BYTES":
            array = np.empty(len(flat), dtype=object)
            array[:] = [_json_string(item) for item in flat]
        elif datatype == "BF16":
            array = float32_to_bf16(np.asarray(flat, dtype=np.float32).reshape(-1))
        else:
            array = np.asarray(flat, dtype=numpy_dtype(datatype)).reshape(-1)
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


def _shape(value: Any, name: str, model: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise NereidError.invalid(f"input '{name}' for model '{model}': 'shape' must be a list of non-negative integers")
    return tuple(value)


def decode_request(
    body: bytes, header_length: int | None, model: str, version: str, shm: SharedMemoryRegistry
) -> InferenceRequest:
    """Parse a /infer body: JSON, optionally followed by the binary tensor data the JSON points into."""
    plan_key = None
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise NereidError.invalid(
                f"Inference-Header-Content-Length {header_length} is larger than the {len(body)}-byte request body"
            )
        if header_length <= PLAN_HEADER_BYTES:
            plan_key, cut_id = _plan_key(body[:header_length])
            plan = _PLANS.get(plan_key)
            planned = plan.request_in(body, header_length, model, version, cut_id) if plan is not None else None
            if planned is not None:
                return planned
        header_bytes = memoryview(body)[:header_length]
        binary = memoryview(body)[header_length:]
    else:
        header_bytes = body  # type: ignore[assignment]
        binary = memoryview(b"")
    non_finite = False
    doc = loads_numeric(header_bytes)  # large bodies: their tensors' numbers skip Python's objects
    if doc is None:
        doc, non_finite = _loads(header_bytes, non_finite=True)
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
            array = shm.input_array(params, datatype, shape, name, model, request_id)
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
    parameters = parameters_object(doc.get("parameters"))
    if parameters:
        for key in parameters:
            if key.startswith("triton_"):  # tritonserver's HTTP refuses them; gRPC streams use some of them
                raise reserved_header_error(key, "parameter")
        apply_request_parameters(request, parameters)
    raw_outputs = doc.get("outputs")
    if raw_outputs:
        if not isinstance(raw_outputs, list):
            raise NereidError.invalid(f"inference request for model '{model}': 'outputs' must be a JSON array")
        request.outputs = [_requested_output(o, model) for o in raw_outputs]
    if plan_key is not None and not non_finite and all("binary_data_size" in t.parameters for t in inputs):
        _PLANS.keep(plan_key, request)
    return request


def _requested_output(raw: Any, model: str) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise NereidError.invalid(f"every requested output of a request for model '{model}' needs a 'name'")
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise NereidError.invalid(f"output '{raw['name']}' for model '{model}': 'parameters' must be a JSON object")
    return RequestedOutput(raw["name"], params)


def _json_values(array: np.ndarray, datatype: str, name: str) -> Any:
    if datatype == "BYTES":
        try:
            return [b.decode() if isinstance(b, bytes) else str(b) for b in array.reshape(-1)]
        except UnicodeDecodeError:
            # Triton writes the bytes as they are, and the client cannot read the JSON; a lossy decode would
            # hand back other bytes than the model wrote without a word.
            raise NereidError.invalid(
                f"output '{name}' holds BYTES that are not valid UTF-8 and cannot be sent as JSON; request it as "
                "binary data (binary_data: true)"
            ) from None
    if datatype == "BF16":
        return bf16_to_float32(array).reshape(-1)
    return array.reshape(-1)


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
            raw = tensor_bytes(output.data, output.datatype)
            entry.setdefault("parameters", {})["binary_data_size"] = len(raw)
            chunks.append(raw)
        else:
            entry["data"] = _json_values(output.data, output.datatype, output.name)
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
