"""pb_utils' requests and responses: InferenceRequest (one the model received, or a BLS request it builds),
InferenceResponse, InferenceResponseSender, InferenceTrace, and Triton's request and response flags. Runs in the
worker: it must not import the server."""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable
from typing import Any

from nereid.backends.python import pb_runtime
from nereid.backends.python.pb_errors import TritonError, TritonModelException
from nereid.backends.python.pb_strings import as_text
from nereid.backends.python.pb_tensor import Tensor, decode_input
from nereid.backends.python.protocol import CALL_TRACE_CONTEXT, RESPONSE_COMPLETE_FINAL
from nereid.core.request_parameters import HIDDEN_PARAMETERS
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
]

# Triton's flags for requests, responses and memory: pb_utils exports them (their public home).
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = SEQUENCE_START
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = SEQUENCE_END
TRITONSERVER_RESPONSE_COMPLETE_FINAL = RESPONSE_COMPLETE_FINAL
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2


class InferenceResponseSender:
    """Sends a request's responses: any number, then one with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL (decoupled
    models, from any thread, during or after execute()); a model that is not decoupled sends exactly one response,
    with the final flag, during execute() or (execute() having returned None for its request) later, from any
    thread; its request is complete when the final flag comes."""

    __slots__ = ("_request", "__weakref__")

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request

    def __del__(self) -> None:
        # A request of a batch that waits for its final flag (see model_worker._Pending) whose sender is gone would
        # wait forever: the batch hears of it and fails the request.
        pending = self._request._pending
        if pending is not None:
            pending.dropped(self._request)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        pb_runtime.current.send_response(self._request, response, flags)

    def is_cancelled(self) -> bool:
        return bool(pb_runtime.current.is_cancelled(self._request))


class InferenceTrace:
    """A request's trace, as `request.trace()` gives it. A BLS request built with `trace=request.trace()` is traced as
    a child of that request (Triton traces a BLS request only then, and only when its caller is traced)."""

    __slots__ = ("_of",)

    def __init__(self, of: tuple[int, int] | None = None) -> None:
        self._of = of  # the received request's batch and place in it; None: no request, no trace

    def get_context(self) -> str | None:
        """The trace context in the opentelemetry trace mode, `{"traceparent": "00-<trace>-<span>-01"}` as JSON
        (the span is the request's model span); None in the triton mode or when the request is not traced."""
        if self._of is None:
            return None
        context = pb_runtime.call(CALL_TRACE_CONTEXT, self._of, "InferenceTrace.get_context")
        return context if isinstance(context, str) else None


_NO_TRACE = InferenceTrace()


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
        "_sender",
        "_pending",
        "_parameters_json",
        "_trace",
    )

    def __init__(
        self,
        model_name: str = "",
        requested_output_names: Iterable[str] = (),
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # None for any of these is a TypeError, as Triton's pybind11 layer (none(false)) makes it; a None among the
        # inputs a TritonModelException, among the output names a TypeError.
        for argument, value in (("model_name", model_name), ("requested_output_names", requested_output_names),
                                ("inputs", inputs), ("request_id", request_id), ("correlation_id", correlation_id),
                                ("model_version", model_version), ("flags", flags), ("timeout", timeout)):  # fmt: skip
            if value is None:
                raise TypeError(f"InferenceRequest(): {argument} must not be None")
        inputs, requested_output_names = list(inputs), list(requested_output_names)
        if any(tensor is None for tensor in inputs):
            raise TritonModelException("InferenceRequest(): an input tensor is None")
        if any(name is None for name in requested_output_names):
            raise TypeError("InferenceRequest(): a requested output name is None")
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
        self._sender: weakref.ref[InferenceResponseSender] | None = None
        self._pending: Any = None
        if trace is not None and not isinstance(trace, InferenceTrace):
            raise TypeError(f"InferenceRequest(trace=...) takes what request.trace() returns, got {type(trace).__name__}")
        self._trace: InferenceTrace = trace or _NO_TRACE

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
        request._sender = None  # the sender get_response_sender() gave, while it lives
        request._pending = None  # while its batch waits for its final flag after execute() returned (not decoupled)
        request._parameters_json = None
        return request  # _trace stays unset until the model asks for it: nothing more per request

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
        if params and not HIDDEN_PARAMETERS.isdisjoint(params):
            params = {k: v for k, v in params.items() if k not in HIDDEN_PARAMETERS}
        return json.dumps(params or {}, separators=(",", ":"))

    def requested_output_names(self) -> set[str]:
        return set(self._requested) if self._requested else set(self._model_outputs)

    def is_cancelled(self) -> bool:
        return bool(pb_runtime.current.is_cancelled(self))

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's sender: one object while it lives (the worker learns when the model lets go of it)."""
        ref = self._sender
        sender = ref() if ref is not None else None
        if sender is None:
            sender = InferenceResponseSender(self)
            self._sender = weakref.ref(sender)
        return sender

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = flags

    def trace(self) -> InferenceTrace:
        try:
            return self._trace  # always set on a request the model built
        except AttributeError:  # a request the model received: its trace is the one of its batch and place
            trace = self._trace = InferenceTrace((self._seq, self._index))
            return trace

    # -- BLS ------------------------------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the server's model `model_name` and wait: its InferenceResponse (an error of the
        request is inside it, not raised), or with `decoupled=True` an iterator over the responses of a decoupled
        model that ends after the final one. Works from execute() and from any thread the model starts."""
        return pb_runtime.current.bls(self, bool(decoupled))

    def async_exec(self, decoupled: bool = False) -> Any:
        """Send this request now and return an awaitable of what exec() returns; call it from a coroutine (`async
        def execute`), so that several requests are in flight at once."""
        return pb_runtime.current.bls_async(self, bool(decoupled))


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
        output_tensors: Iterable[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:  # as Triton's pybind11 layer: None is no list; a None in it no tensor
            raise TypeError("InferenceResponse(): output_tensors must not be None")
        self._tensors = list(output_tensors)
        if any(tensor is None for tensor in self._tensors):
            raise TritonModelException("InferenceResponse(): an output tensor is None")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse(error=...) takes a pb_utils.TritonError, got {type(error).__name__}")
        self._error = error
        if parameters is None:
            self._parameters = None
        else:
            if isinstance(parameters, str):
                parameters = json.loads(parameters) if parameters else {}
            # The checks and words of the python_backend releases that have response parameters (floats refused).
            if not isinstance(parameters, dict):
                raise TritonModelException(f"Expect dict, got {type(parameters)}")
            for key, value in parameters.items():
                if not isinstance(key, str):
                    raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
                if not isinstance(value, (str, int, bool)):
                    raise TritonModelException(
                        f"Expect parameters values to have type bool/int/str, found type {type(value)}"
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
