"""Triton's generate extension: a flat JSON object whose keys are input tensors, answered by a flat JSON
object whose keys are output tensors; `generate_stream` sends each response as a Server-Sent Event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson

from nereid.config.model_config import ModelConfig, mc
from nereid.core.dtypes import config_to_triton, float32_to_bf16, numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.request_parameters import apply_request_parameters, parameters_object
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, OutputTensor
from nereid.frontends.http.codec import json_object
from nereid.frontends.http.json_data import flatten, wrong_kind
from nereid.frontends.http.non_finite_json import dumps_marked, mark_non_finite

__all__ = ["generate_request", "generate_body", "sse_events"]

_RESERVED = ("id", "parameters")
_TRITON_KIND_WORDS = {
    "BYTES": ": attempt to access JSON non-string as string",
    "BOOL": ": attempt to access JSON non-boolean as boolean",
}


def _input_array(value: Any, datatype: str, name: str, model: str) -> np.ndarray:
    values = value if isinstance(value, list) else [value]
    flat = flatten(values)
    bad = wrong_kind(flat, datatype)
    if bad is not None:  # Triton's parser takes only its own kind of JSON value for each data type
        words = _TRITON_KIND_WORDS.get(datatype, "")  # Triton's, after ours
        raise NereidError.invalid(f"generate request for model '{model}': input '{name}' expects {datatype}, got {bad}{words}")
    try:
        if datatype == "BYTES":
            array = np.empty(len(flat), dtype=object)
            array[:] = [v.encode() for v in flat]
            return array
        if datatype == "BF16":
            return float32_to_bf16(np.asarray(values, dtype=np.float32))
        return np.asarray(values, dtype=numpy_dtype(datatype))
    except (TypeError, ValueError, OverflowError) as exc:
        raise NereidError.invalid(f"generate request for model '{model}': input '{name}' expects {datatype} ({exc})") from None


def _shape(dims: list[int], count: int, name: str) -> tuple[int, ...]:
    """The input's shape as Triton's generate extension pads `count` values into it: the fixed dimensions take their
    share, the innermost variable one the rest, the other variable ones 1."""
    left = count
    for dim in dims:
        if dim != -1:
            if dim == 0 or left % dim:
                if dim == 0 and left == 0:
                    continue
                raise NereidError.invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= dim
    shape = list(dims)
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index], left = left, 1
    if left != 1 and count:
        raise NereidError.invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def _parameter(key: str, value: Any) -> Any:
    """A key that names no input is a request parameter, as in Triton: a string, integer, boolean or number."""
    if isinstance(value, (str, int, float)):  # bool is an int
        return value
    raise NereidError.invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _repeated_input(body: bytes, keys: list[str]) -> str | None:
    """The first input key the body's top-level object gives twice, in the body's order (Triton refuses it; orjson
    keeps the last value). A name whose quoted form appears once in the body cannot be repeated, so the careful
    parse runs only when one appears more than once (the same text inside a value costs that parse, nothing more)."""
    if not any(body.count(b'"%s"' % key.encode()) > 1 for key in keys):
        return None
    top: list[tuple[str, Any]] = []

    def pairs(members: list[tuple[str, Any]]) -> dict[str, Any]:
        top[:] = members  # the hook sees inner objects first: the top-level object is the last call
        return dict(members)

    json.loads(body, object_pairs_hook=pairs)
    wanted, seen = set(keys), set()
    for key, _ in top:
        if key in wanted and key in seen:
            return key
        seen.add(key)
    return None


def generate_request(body: bytes, model: str, version: str, config: ModelConfig) -> InferenceRequest:
    """Map each key of the JSON object to the model input of that name, shaped to the input's dims as Triton pads
    them (a batch of one when batching); a key that names no input is a request parameter."""
    doc = json_object(body, non_finite=True)  # as in /infer's tensor data, Triton reads NaN and Infinity here
    specs = {t.name: t for t in config.input}
    repeated = _repeated_input(body, [key for key in doc if key in specs])
    if repeated is not None:
        raise NereidError.invalid(f"input '{repeated}' already exists in request")  # tritonserver's words
    batch = [-1] if config.max_batch_size > 0 else []
    inputs: list[InputTensor] = []
    extra: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _RESERVED:
            continue
        spec = specs.get(key)
        if spec is None:
            extra[key] = _parameter(key, value)
            continue
        datatype = config_to_triton(mc.DataType.Name(spec.data_type))
        array = _input_array(value, datatype, key, model)
        shape = _shape(batch + list(spec.dims), array.size, key)  # nested JSON lists are taken flat
        inputs.append(InputTensor(key, datatype, shape, array.reshape(shape)))
    request = InferenceRequest(model, version, inputs, id=str(doc.get("id", "")))
    given = doc.get("parameters")
    if given is not None and not isinstance(given, dict):
        raise NereidError.invalid("Expected JSON object for keyword: 'parameters'")  # tritonserver's words
    for key, value in (given or {}).items():
        if isinstance(value, (dict, list)):
            raise NereidError.invalid(
                f"Converting keyword: 'parameters': parameter '{key}' has invalid type. It should be either 'int', "
                "'bool', or 'string'."
            )
    parameters = {**extra, **parameters_object(given, "generate request")}
    if parameters:
        apply_request_parameters(request, parameters)
    return request


def _output_values(output: OutputTensor) -> tuple[list[Any], bool]:
    """The output's values, flat, and whether a NaN or infinity among them was marked (see mark_non_finite)."""
    data = output.data.reshape(-1)
    if output.datatype == "BYTES":
        return [b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b) for b in data], False
    values = data.tolist()
    if data.dtype.kind != "f" or np.isfinite(data).all():
        return values, False
    mark_non_finite(values)
    return values, True


def generate_body(response: InferenceResponse) -> bytes:
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    non_finite = False
    for output in response.outputs:
        values, marked = _output_values(output)
        doc[output.name] = values[0] if len(values) == 1 else values
        non_finite |= marked
    if response.parameters:
        for key, value in response.parameters.items():
            doc.setdefault(key, value)
    # orjson writes NaN and infinities as null; Triton writes its literals.
    return dumps_marked(doc) if non_finite else orjson.dumps(doc)


async def sse_events(responses: AsyncIterator[InferenceResponse]) -> AsyncIterator[bytes]:
    """`data: {...}` events; an error mid-stream becomes an `{"error": ...}` event, as Triton sends it."""
    try:
        async for response in responses:
            if response.error is not None:
                yield b"data: " + orjson.dumps({"error": response.error.message}) + b"\n\n"
                continue
            if response.complete_only:
                continue
            yield b"data: " + generate_body(response) + b"\n\n"
    except NereidError as exc:
        yield b"data: " + orjson.dumps({"error": exc.message}) + b"\n\n"
