"""The picklable forms of requests, responses and errors that cross a Serve deployment handle between the ingress
and a replica. Core types carry callbacks and traces that must stay in their process; these carry only data."""

from __future__ import annotations

from typing import Any

from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, OutputTensor, RequestedOutput

__all__ = [
    "PackedError",
    "PackedRequest",
    "PackedResponse",
    "pack_error",
    "pack_request",
    "pack_response",
    "unpack_error",
    "unpack_request",
    "unpack_response",
]

PackedError = tuple[str, str]  # (Status name, message)
PackedRequest = tuple[Any, ...]
PackedResponse = tuple[Any, ...]


def pack_error(error: BaseException) -> PackedError:
    if isinstance(error, NereidError):
        return (error.status.name, error.message)
    return (Status.INTERNAL.name, f"{type(error).__name__}: {error}")


def unpack_error(packed: PackedError) -> NereidError:
    return NereidError(Status[packed[0]], packed[1])


def pack_request(request: InferenceRequest) -> PackedRequest:
    inputs = [(t.name, t.datatype, t.shape, t.data, t.parameters) for t in request.inputs]
    outputs = None if request.outputs is None else [(o.name, o.parameters) for o in request.outputs]
    return (
        request.model_name,
        request.model_version,
        request.id,
        inputs,
        outputs,
        request.parameters,
        request.priority,
        request.timeout_us,
        request.correlation_id,
        request.flags,
    )


def unpack_request(packed: PackedRequest) -> InferenceRequest:
    name, version, request_id, inputs, outputs, parameters, priority, timeout_us, correlation_id, flags = packed
    return InferenceRequest(
        name,
        version,
        [InputTensor(n, d, tuple(s), data, p) for n, d, s, data, p in inputs],
        id=request_id,
        outputs=None if outputs is None else [RequestedOutput(n, p) for n, p in outputs],
        parameters=parameters,
        priority=priority,
        timeout_us=timeout_us,
        correlation_id=correlation_id,
        flags=flags,
    )


def pack_response(response: InferenceResponse) -> PackedResponse:
    outputs = [(t.name, t.datatype, t.shape, t.data, t.parameters) for t in response.outputs]
    error = None if response.error is None else pack_error(response.error)
    return (
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters,
        error,
        response.final,
        response.complete_only,
    )


def unpack_response(packed: PackedResponse) -> InferenceResponse:
    name, version, response_id, outputs, parameters, error, final, complete_only = packed
    return InferenceResponse(
        name,
        version,
        response_id,
        [OutputTensor(n, d, tuple(s), data, p) for n, d, s, data, p in outputs],
        parameters,
        None if error is None else unpack_error(error),
        final,
        complete_only,
    )
