"""The messages between the server and a Python-backend worker: one NamedTuple per kind, and their framing.

A frame is a 4-byte little-endian body length, a 1-byte message kind and the marshal-encoded fields of the message.
marshal refuses tuple subclasses, so `encode` sends the fields as a plain tuple (the hot path's messages have
builders that frame their fields without making the NamedTuple), and `decode` puts them back in their NamedTuple
without calling its constructor. Tensor bytes never travel here (they live in the shared-memory arenas
of `arena`). The worker imports this module, so it must not import the server, protobuf or anything heavy.
"""

from __future__ import annotations

import marshal
import struct
from typing import Any, NamedTuple

__all__ = [
    "FRAME",
    "ErrorInfo",
    "TensorMeta",
    "WireRequest",
    "WireResponse",
    "MetricOp",
    "Init",
    "Execute",
    "ExecuteGroup",
    "Shutdown",
    "CallReply",
    "BlsResponse",
    "IsReady",
    "AutoComplete",
    "Ready",
    "Completed",
    "Result",
    "Log",
    "Call",
    "BlsRequest",
    "Metrics",
    "Done",
    "ReadyState",
    "Response",
    "Message",
    "MESSAGE_KINDS",
    "encode",
    "decode",
    "execute_frame",
    "execute_group_frame",
    "result_frame",
    "response_frame",
    "bls_request_frame",
    "bls_response_frame",
    "FRAME_BUILDERS",
    "split_frames",
    "CONSUMED",
    "CONTROL_BYTES",
    "REPLIES_TAKEN",
    "CALL_CANCELLED",
    "CALL_FAMILY",
    "CALL_METRIC_VALUE",
    "CALL_LOAD",
    "CALL_UNLOAD",
    "CALL_MODEL_READY",
    "CALL_TRACE_CONTEXT",
    "CALL_CANCEL_BLS",
    "ERROR_CODES",
    "INTERNAL_CODE",
    "INVALID_ARG_CODE",
    "RESCHEDULED_CODE",
    "RESPONSE_COMPLETE_FINAL",
]

# (body length, message kind) in front of every marshal-encoded body.
FRAME = struct.Struct("<IB")

# -- the records inside messages (plain tuples on the wire: these aliases are their schema) -----------------------
# (code, message): a TritonError code (see ERROR_CODES) and its text.
ErrorInfo = tuple[int, str]
# (name, datatype, shape, offset, nbytes): one tensor laid out in an arena.
TensorMeta = tuple[str, str, tuple[int, ...], int, int]
# (id, correlation_id, flags, timeout_us, parameters, requested output names | None, inputs in the input arena)
WireRequest = tuple[str, "int | str", int, int, dict[str, Any], "tuple[str, ...] | None", tuple[TensorMeta, ...]]
# (error | None, parameters | None, outputs in the output arena)
WireResponse = tuple["ErrorInfo | None", "dict[str, Any] | None", tuple[TensorMeta, ...]]
# A custom-metric operation of pb_utils (see custom_metrics.MetricRegistry.apply).
MetricOp = tuple[Any, ...]


# -- server -> worker --------------------------------------------------------------------------------------------
class Init(NamedTuple):
    """Load the model and call initialize(args); answered with Ready. (Whether the model is decoupled travels in
    args["model_config"], as in Triton.)"""

    args: dict[str, str]
    model_file: str
    version_dir: str


class Execute(NamedTuple):
    """One batch for execute(), its input tensors in the input arena (remapped first when it grew past the worker's
    mapping); answered with one Result. After answering, the worker polls for the next message for up to `poll_ns`
    instead of blocking at once (see ModelWorker.serve)."""

    seq: int
    in_arena_size: int
    requests: list[WireRequest]
    poll_ns: int


class ExecuteGroup(NamedTuple):
    """Requests of a model without batching that queued behind a running one, handed over together: execute() is
    called once per request, in order (as Triton calls a model that does not batch), and one Result answers them
    all, so the worker and the server wake once for the group instead of once per request. That Result's `times` hold
    the two stamps of every request's execute(), and an execute() that raised is its request's error."""

    seq: int
    in_arena_size: int
    requests: list[WireRequest]
    poll_ns: int


class Shutdown(NamedTuple):
    """Call finalize(), answer Done and exit."""


class CallReply(NamedTuple):
    """The answer to a worker's Call: an error, or the call's value."""

    call_id: int
    error: ErrorInfo | None
    value: Any


class BlsResponse(NamedTuple):
    """One response to a worker's BlsRequest (many for a decoupled model, the last one `final`). Its outputs lie in
    the input arena, written after everything else; the worker stores `reply_no` at REPLIES_TAKEN once it has copied
    them out."""

    call_id: int
    in_arena_size: int
    error: ErrorInfo | None
    parameters: dict[str, Any] | None
    outputs: tuple[TensorMeta, ...]
    final: bool
    reply_no: int


class IsReady(NamedTuple):
    """Ask the model's optional is_ready(); answered with ReadyState."""

    call_id: int


class AutoComplete(NamedTuple):
    """Run the model's auto_complete_config on `config_json`; answered with Completed."""

    config_json: str
    model_file: str
    version_dir: str


# -- worker -> server --------------------------------------------------------------------------------------------
class Ready(NamedTuple):
    """initialize() has returned (or failed with `error`)."""

    error: ErrorInfo | None
    pid: int
    has_is_ready: bool
    # execute() is a plain function of a model that is not decoupled: requests may be handed over as ExecuteGroup.
    runs_groups: bool


class Completed(NamedTuple):
    """auto_complete_config has returned the completed config (or failed with `error`)."""

    error: ErrorInfo | None
    config_json: str


class Result(NamedTuple):
    """The outcome of one Execute: a batch error, or one response per request (None for a decoupled model, whose
    responses went as Response messages). `oseq` numbers every message whose tensors are in the output arena
    (Result, Response, BlsRequest); the server stores the last one it has consumed at CONSUMED, and the worker
    reuses the space up to it. `times` are the monotonic stamps around execute() (around each execute() of an
    ExecuteGroup, two per request)."""

    seq: int
    oseq: int
    out_arena_size: int
    batch_error: ErrorInfo | None
    responses: list[WireResponse] | None
    times: tuple[int, ...]
    ops: tuple[MetricOp, ...]


class Log(NamedTuple):
    """A pb_utils.Logger record; level 0 info, 1 warning, 2 error, 3 verbose."""

    level: int
    message: str
    filename: str
    lineno: int


class Call(NamedTuple):
    """The worker asks the server something (`kind` is one of the CALL_* names) and blocks until the CallReply."""

    call_id: int
    kind: str
    payload: Any


class BlsRequest(NamedTuple):
    """A model's InferenceRequest(...).exec(): its inputs lie in the output arena, written there like a response's
    outputs (so it takes an `oseq`, and the server copies them out before it marks that oseq consumed). Answered with
    one BlsResponse per response; errors of the request come back inside a response, as Triton's BLS does."""

    call_id: int
    oseq: int
    out_arena_size: int
    model_name: str
    model_version: str
    request_id: str
    correlation_id: int | str
    flags: int
    timeout_us: int
    parameters: dict[str, Any]
    requested_outputs: tuple[str, ...]
    inputs: tuple[TensorMeta, ...]
    decoupled: bool
    # trace=request.trace(): the caller's (seq, request index), whose trace the BLS request's is a child of.
    trace_of: tuple[int, int] | None


class Metrics(NamedTuple):
    """Custom-metric operations made outside execute (initialize, finalize, other threads)."""

    ops: tuple[MetricOp, ...]


class Done(NamedTuple):
    """finalize() has run; the worker exits next."""

    error: ErrorInfo | None


class ReadyState(NamedTuple):
    """The answer to IsReady."""

    call_id: int
    ready: bool


class Response(NamedTuple):
    """One response of a decoupled model, sent by InferenceResponseSender.send at any time and from any thread; final
    when `flags` has TRITONSERVER_RESPONSE_COMPLETE_FINAL (`outputs` None is a bare final flag)."""

    seq: int
    request_index: int
    oseq: int
    out_arena_size: int
    error: ErrorInfo | None
    parameters: dict[str, Any] | None
    outputs: tuple[TensorMeta, ...] | None
    flags: int


Message = (
    Init
    | Execute
    | ExecuteGroup
    | Shutdown
    | CallReply
    | BlsResponse
    | IsReady
    | AutoComplete
    | Ready
    | Completed
    | Result
    | Log
    | Call
    | BlsRequest
    | Metrics
    | Done
    | ReadyState
    | Response
)

# The kind byte of each message type (server -> worker below 20).
MESSAGE_KINDS: dict[type[Any], int] = {
    Init: 1,
    Execute: 2,
    Shutdown: 3,
    CallReply: 4,
    IsReady: 5,
    AutoComplete: 6,
    BlsResponse: 7,
    ExecuteGroup: 8,
    Ready: 20,
    Result: 21,
    Log: 22,
    Call: 23,
    Metrics: 24,
    Done: 25,
    ReadyState: 26,
    Response: 27,
    Completed: 28,
    BlsRequest: 29,
}
_TYPE_OF_KIND: dict[int, type[Any]] = {kind: cls for cls, kind in MESSAGE_KINDS.items()}
_HEADER = FRAME.size
_pack = FRAME.pack
_unpack_from = FRAME.unpack_from


def encode(message: Message) -> bytes:
    """One frame: the header, then the message's fields as a plain tuple (marshal's fastest form)."""
    body = marshal.dumps(message[:])  # a tuple subclass sliced is a plain tuple
    return _pack(len(body), MESSAGE_KINDS[type(message)]) + body


# -- the hot path's frames: built straight from their fields, without the NamedTuple instance that `encode` would
# slice back into a plain tuple (a unit test keeps each builder's parameters equal to its message's fields).
_EXECUTE = MESSAGE_KINDS[Execute]
_EXECUTE_GROUP = MESSAGE_KINDS[ExecuteGroup]
_RESULT = MESSAGE_KINDS[Result]
_RESPONSE = MESSAGE_KINDS[Response]
_BLS_REQUEST = MESSAGE_KINDS[BlsRequest]
_BLS_RESPONSE = MESSAGE_KINDS[BlsResponse]
_dumps = marshal.dumps


def execute_frame(seq: int, in_arena_size: int, requests: list[WireRequest], poll_ns: int) -> bytes:
    """An Execute message, framed."""
    body = _dumps((seq, in_arena_size, requests, poll_ns))
    return _pack(len(body), _EXECUTE) + body


def execute_group_frame(seq: int, in_arena_size: int, requests: list[WireRequest], poll_ns: int) -> bytes:
    """An ExecuteGroup message, framed."""
    body = _dumps((seq, in_arena_size, requests, poll_ns))
    return _pack(len(body), _EXECUTE_GROUP) + body


def result_frame(
    seq: int,
    oseq: int,
    out_arena_size: int,
    batch_error: ErrorInfo | None,
    responses: list[WireResponse] | None,
    times: tuple[int, ...],
    ops: tuple[MetricOp, ...],
) -> bytes:
    """A Result message, framed."""
    body = _dumps((seq, oseq, out_arena_size, batch_error, responses, times, ops))
    return _pack(len(body), _RESULT) + body


def response_frame(
    seq: int,
    request_index: int,
    oseq: int,
    out_arena_size: int,
    error: ErrorInfo | None,
    parameters: dict[str, Any] | None,
    outputs: tuple[TensorMeta, ...] | None,
    flags: int,
) -> bytes:
    """A Response message, framed."""
    body = _dumps((seq, request_index, oseq, out_arena_size, error, parameters, outputs, flags))
    return _pack(len(body), _RESPONSE) + body


def bls_request_frame(
    call_id: int,
    oseq: int,
    out_arena_size: int,
    model_name: str,
    model_version: str,
    request_id: str,
    correlation_id: int | str,
    flags: int,
    timeout_us: int,
    parameters: dict[str, Any],
    requested_outputs: tuple[str, ...],
    inputs: tuple[TensorMeta, ...],
    decoupled: bool,
    trace_of: tuple[int, int] | None = None,
) -> bytes:
    """A BlsRequest message, framed."""
    body = _dumps(
        (
            call_id,
            oseq,
            out_arena_size,
            model_name,
            model_version,
            request_id,
            correlation_id,
            flags,
            timeout_us,
            parameters,
            requested_outputs,
            inputs,
            decoupled,
            trace_of,
        )
    )
    return _pack(len(body), _BLS_REQUEST) + body


def bls_response_frame(
    call_id: int,
    in_arena_size: int,
    error: ErrorInfo | None,
    parameters: dict[str, Any] | None,
    outputs: tuple[TensorMeta, ...],
    final: bool,
    reply_no: int,
) -> bytes:
    """A BlsResponse message, framed."""
    body = _dumps((call_id, in_arena_size, error, parameters, outputs, final, reply_no))
    return _pack(len(body), _BLS_RESPONSE) + body


# Each hot-path message and the builder of its frame.
FRAME_BUILDERS: dict[type[Any], Any] = {
    Execute: execute_frame,
    ExecuteGroup: execute_group_frame,
    Result: result_frame,
    Response: response_frame,
    BlsRequest: bls_request_frame,
    BlsResponse: bls_response_frame,
}


def decode(kind: int, body: bytes | bytearray) -> Message:
    """The message of a frame's kind and body."""
    message: Message = tuple.__new__(_TYPE_OF_KIND[kind], marshal.loads(body))
    return message


def split_frames(data: bytes | bytearray) -> tuple[list[Message], int]:
    """The complete frames at the start of `data`, decoded, and how many bytes they took."""
    messages: list[Message] = []
    offset = 0
    total = len(data)
    new = tuple.__new__
    loads = marshal.loads
    types = _TYPE_OF_KIND
    while total - offset >= _HEADER:
        size, kind = _unpack_from(data, offset)
        start = offset + _HEADER
        end = start + size
        if end > total:
            break
        messages.append(new(types[kind], loads(data[start:end])))
        offset = end
    return messages, offset


# -- shared-memory control words ------------------------------------------------------------------------------------
# The input arena's first bytes are a control block: at CONSUMED the server keeps (u64) the last `oseq` it has
# consumed. The server's input tensors start at CONTROL_BYTES.
CONSUMED = struct.Struct("<Q")
CONTROL_BYTES = 64
# The output arena's first CONTROL_BYTES are a control block too: at REPLIES_TAKEN the worker keeps (u64) the last
# BLS `reply_no` whose tensors it has copied out of the input arena; the server rewinds its input arena only when
# no batch is in flight and every reply has been taken. The worker's outputs start at CONTROL_BYTES.
REPLIES_TAKEN = struct.Struct("<Q")

# -- Call kinds and their payloads ----------------------------------------------------------------------------------
# (seq, request_index): whether a request's client went away; value: bool.
CALL_CANCELLED = "cancelled"
# (name, description, kind): create a custom metric family; value None.
CALL_FAMILY = "family"
# (family name, label key): a metric's value; value: float.
CALL_METRIC_VALUE = "metric_value"
# pb_utils.load_model (name, config_json, files: dict[str, bytes]), unload_model (name, unload_dependents) and
# is_model_ready (name, version): the server's model-repository API; value None, None and a bool.
CALL_LOAD = "load"
CALL_UNLOAD = "unload"
CALL_MODEL_READY = "model_ready"
# (seq, request index): the trace context of a request the model received (InferenceTrace.get_context); a str or None.
CALL_TRACE_CONTEXT = "trace_context"
# (call_id,): cancel the model's own decoupled BLS call in flight (ResponseIterator.cancel()); value None.
CALL_CANCEL_BLS = "cancel_bls"

# TritonError codes (pb_utils.TritonError.<NAME>) in the order of their integer values.
ERROR_CODES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)
INTERNAL_CODE = ERROR_CODES.index("INTERNAL")
INVALID_ARG_CODE = ERROR_CODES.index("INVALID_ARG")
# In a Result, the error of a request the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (an
# iterative_sequence model runs it again): a code no TritonError has.
RESCHEDULED_CODE = -1
# The flag of a Response that is its request's last (pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL).
RESPONSE_COMPLETE_FINAL = 1

