"""The server's side of one running Python-backend worker: its channel and arenas, and what is in flight on them.

It sends batches (one Execute each, the tensors through the input arena) and turns the worker's messages into
batch outcomes, decoupled responses, log records and metric updates; the model's calls into the server and the
channel's end go to its owner's `WorkerHooks`. This runs on the server's event loop: per message, a few tuple builds
and one shared-memory copy per tensor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from nereid.backends.python.arena import Arena, read_array
from nereid.backends.python.arena_writer import InputArenaWriter
from nereid.backends.python.error_codes import error_from_wire
from nereid.backends.python.protocol import (
    CONSUMED,
    RESCHEDULED_CODE,
    RESPONSE_COMPLETE_FINAL,
    BlsRequest,
    Call,
    Done,
    ErrorInfo,
    IsReady,
    Log,
    Message,
    Metrics,
    Ready,
    ReadyState,
    Response,
    Result,
    TensorMeta,
    WireRequest,
    WireResponse,
    bls_response_frame,
    encode,
    execute_frame,
    execute_group_frame,
)
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

if TYPE_CHECKING:
    from nereid.backends.python.worker_launch import WorkerProcess

__all__ = [
    "BatchOutcome",
    "PythonWorkerProcess",
    "WorkerHooks",
    "ignore_response",
    "log_model_record",
    "sanitize_parameters",
    "wire_requests",
]

log = logging.getLogger("nereid.python")
# Records of model.py's pb_utils.Logger calls, with the model file and line as their origin.
model_log = logging.getLogger("nereid.python.model")

_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_new_tuple = tuple.__new__


class BatchOutcome(NamedTuple):
    """What a batch's future resolves to."""

    # The batch failed as a whole (execute() raised, or returned something that is not one response per request).
    error: NereidError | None
    # One response per request, in order (an error for one request is its own response's); None for a decoupled
    # model, whose responses went to their requests as they came, and for a failed batch.
    responses: list[InferenceResponse] | None
    # The worker's monotonic stamps around execute(): its start and end, in turn for each request of an ExecuteGroup.
    times: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkerHooks:
    """What the owner of a worker does with what the worker cannot settle itself (handed down by the owner)."""

    # The channel closed (the process ended or is ending); called once.
    exited: Callable[[PythonWorkerProcess], None]
    # The model's InferenceRequest.exec() or async_exec().
    bls_request: Callable[[PythonWorkerProcess, BlsRequest], None]
    # The model asks the server something (custom metrics, cancellation, trace context, the repository API).
    call: Callable[[PythonWorkerProcess, Call], None]
    # The model's custom-metric operations (pb_utils.MetricFamily), for the Server's registry.
    metrics: Callable[[Any], None]


def log_model_record(message: Log) -> None:
    level = _LEVELS.get(message.level, logging.INFO)
    if model_log.isEnabledFor(level):
        model_log.handle(
            model_log.makeRecord(model_log.name, level, message.filename, message.lineno, message.message, (), None)
        )


def sanitize_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters marshal can carry: other values as their text."""
    return {str(k): v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in parameters.items()}


def wire_requests(
    requests: list[InferenceRequest], inputs: Sequence[tuple[TensorMeta, ...]], sanitize: bool = False
) -> list[WireRequest]:
    """The requests as an Execute carries them, their inputs already in the input arena (`inputs`, one group per
    request); `sanitize` sends the parameters' values that marshal cannot carry as their text."""
    wire: list[WireRequest] = []
    for request, metas in zip(requests, inputs, strict=True):  # a loop, not a comprehension: one frame less
        outputs = request.outputs
        wire.append(
            (
                request.id,
                request.correlation_id,
                request.flags,
                request.timeout_us,
                sanitize_parameters(request.parameters) if sanitize else request.parameters,
                None if outputs is None else tuple(output.name for output in outputs),
                metas,
            )
        )
    return wire


def ignore_response(response: InferenceResponse) -> None:
    """The respond callback of a request that was already answered (its timeout expired)."""


class PythonWorkerProcess:
    """One worker process of an instance and everything tied to it; a restart makes a new one."""

    def __init__(
        self, label: str, decoupled: bool, process: WorkerProcess, inputs: Arena, outputs: Arena, hooks: WorkerHooks
    ) -> None:
        loop = asyncio.get_running_loop()
        self.label = label
        self.decoupled = decoupled
        self.process = process
        self.pid = process.pid
        self.inputs = inputs
        self.outputs = outputs
        self.writer = InputArenaWriter(inputs, outputs)
        self.hooks = hooks
        self.transport: asyncio.Transport | None = None
        self.alive = True
        self.seq = 0
        self.pending: dict[int, asyncio.Future[BatchOutcome]] = {}
        self.ready: asyncio.Future[Ready] = loop.create_future()
        self.done: asyncio.Future[ErrorInfo | None] = loop.create_future()
        self.gone: asyncio.Future[int] = loop.create_future()
        self.probes: dict[int, asyncio.Future[bool]] = {}
        self.next_probe = 0
        self.has_is_ready = False
        self.runs_groups = False  # its model may take requests as ExecuteGroup (see Ready.runs_groups)
        # The model's calls into the server that run as tasks (BLS, repository calls): cancelled when it is gone.
        self.calls: set[asyncio.Task[None]] = set()
        # The requests of each batch in flight, and (decoupled models) every request still owed its final response.
        self.batches: dict[int, list[InferenceRequest]] = {}
        self.streams: dict[tuple[int, int], InferenceRequest] = {}
        self.bls_calls: dict[int, InferenceRequest] = {}  # the model's decoupled BLS calls in flight, by call id
        self.bls_replies = 0  # the number of the last BLS response sent (see BlsResponse.reply_no)

    # -- sending -----------------------------------------------------------------------------------
    def send(self, message: Message) -> None:
        if self.transport is not None and self.alive:
            self.transport.write(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Send a message already framed (by one of protocol's frame builders)."""
        if self.transport is not None and self.alive:
            self.transport.write(frame)

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run one of the model's calls into the server as a task that ends with this worker."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    def submit(
        self, requests: list[InferenceRequest], group: bool = False, poll_ns: int = 0
    ) -> tuple[int, asyncio.Future[BatchOutcome]]:
        """Write the batch's tensors into the input arena and send one Execute message for all of it (ExecuteGroup
        when `group`: one execute() per request); the worker polls for its next message for up to `poll_ns` after
        answering."""
        writer = self.writer
        described, first, end = writer.write([request.inputs for request in requests])
        self.seq += 1
        seq = self.seq
        size = self.inputs.size
        build = execute_group_frame if group else execute_frame
        try:
            frame = build(seq, size, wire_requests(requests, described), poll_ns)
        except ValueError:  # a parameter value marshal cannot carry: send its text
            frame = build(seq, size, wire_requests(requests, described, sanitize=True), poll_ns)
        future: asyncio.Future[BatchOutcome] = asyncio.get_running_loop().create_future()
        self.pending[seq] = future
        writer.hold_batch(seq, (first, end))
        self.batches[seq] = requests
        if self.decoupled:
            for index, request in enumerate(requests):
                self.streams[(seq, index)] = request
        self.transport.write(frame)  # type: ignore[union-attr]
        return seq, future

    async def model_ready(self, timeout: float) -> bool:
        """What the model's is_ready() answers; False when it has not answered within `timeout` seconds."""
        self.next_probe += 1
        probe_id = self.next_probe
        probe: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.probes[probe_id] = probe
        self.send(IsReady(probe_id))
        try:
            return await asyncio.wait_for(probe, timeout)
        except TimeoutError:
            self.probes.pop(probe_id, None)
            return False

    def send_bls_response(
        self,
        call_id: int,
        error: ErrorInfo | None,
        parameters: dict[str, Any] | None,
        outputs: list[OutputTensor] | None,
        final: bool,
    ) -> None:
        """One response to a model's BlsRequest: its tensors into the input arena, then a BlsResponse with their
        metadata (kept in use until the worker says it took them)."""
        if not self.alive:
            return
        self.bls_replies += 1
        metas: tuple[TensorMeta, ...] = ()
        if outputs:
            described, start, end = self.writer.write([outputs], data_shapes=True)
            metas = described[0]
            self.writer.hold_reply(self.bls_replies, (start, end))
        self.send_frame(
            bls_response_frame(call_id, self.inputs.size, error, parameters, metas, final, self.bls_replies)
        )

    # -- receiving -----------------------------------------------------------------------------------
    def on_message(self, message: Message) -> None:
        if isinstance(message, Result):
            self._on_result(message)
        elif isinstance(message, Response):
            self._on_response(message)
        elif isinstance(message, BlsRequest):
            self.hooks.bls_request(self, message)
        elif isinstance(message, Log):
            log_model_record(message)
        elif isinstance(message, Metrics):
            self.hooks.metrics(message.ops)
        elif isinstance(message, Call):
            self.hooks.call(self, message)
        elif isinstance(message, Ready):
            if not self.ready.done():
                self.ready.set_result(message)
        elif isinstance(message, Done):
            if not self.done.done():
                self.done.set_result(message.error)
        elif isinstance(message, ReadyState):
            probe = self.probes.pop(message.call_id, None)
            if probe is not None and not probe.done():
                probe.set_result(bool(message.ready))

    def consumed(self, oseq: int) -> None:
        """Tell the worker (through the input arena's control word) that it may reuse space up to `oseq`."""
        CONSUMED.pack_into(self.inputs.mm, 0, oseq)

    def copy_out(self, out_size: int, metas: Any) -> list[tuple[str, str, Any, Any]]:
        """Copy tensors out of the output arena: the worker reuses that space once it is consumed."""
        outputs = self.outputs
        if out_size > outputs.size:
            outputs.ensure(out_size)
        mm = outputs.mm
        return [
            (name, datatype, shape, read_array(mm, datatype, shape, offset, nbytes, copy=True))
            for name, datatype, shape, offset, nbytes in metas
        ]

    def _decode(self, out_size: int, metas: tuple[TensorMeta, ...]) -> list[OutputTensor]:
        """A response's tensors, copied out of the output arena (as `copy_out`, without its intermediate tuples:
        this runs for every response)."""
        outputs = self.outputs
        if out_size > outputs.size:
            outputs.ensure(out_size)
        mm = outputs.mm
        tensors = []
        for name, datatype, shape, offset, nbytes in metas:
            array = read_array(mm, datatype, shape, offset, nbytes, copy=True)
            tensors.append(OutputTensor(name, datatype, shape, array))
        return tensors

    def _on_result(self, message: Result) -> None:
        seq, oseq, out_size, batch_error, responses, times, ops = message
        try:
            if ops:
                self.hooks.metrics(ops)
            future = self.pending.pop(seq, None)
            self.writer.release_batch(seq)
            requests = self.batches.pop(seq, None)
            if future is None or future.done() or requests is None:
                return  # abandoned: every request of the batch timed out
            if batch_error is not None:
                error = error_from_wire(batch_error)
                if self.decoupled:
                    self.end_streams(seq, len(requests), error)
                future.set_result(BatchOutcome(error, None, times))
            elif responses is not None and len(responses) != len(requests):
                error = NereidError.internal(
                    f"{self.label}: the worker answered {len(responses)} responses for {len(requests)} requests"
                )
                future.set_result(BatchOutcome(error, None, times))
            elif self.decoupled:
                if responses is not None:  # an iterative_sequence model tells which requests it rescheduled
                    self._rescheduled(seq, requests, responses)
                future.set_result(BatchOutcome(None, None, times))
            elif responses is None:
                error = NereidError.internal(f"{self.label}: the worker answered the batch without its responses")
                future.set_result(BatchOutcome(error, None, times))
            else:
                answered = self._responses(requests, out_size, responses)
                # A NamedTuple made without its Python-level __new__, as protocol.decode makes messages: once a batch.
                future.set_result(_new_tuple(BatchOutcome, (None, answered, times)))
        finally:
            CONSUMED.pack_into(self.inputs.mm, 0, oseq)  # (self.consumed, inline on the hot path)

    def _responses(
        self, requests: list[InferenceRequest], out_size: int, answers: list[WireResponse]
    ) -> list[InferenceResponse]:
        """Each request's response from what the worker answered for it: an error, or outputs and parameters."""
        responses = []
        for request, (error, parameters, metas) in zip(requests, answers):
            name, version, rid = request.model_name, request.model_version, request.id
            if error is not None:
                if error[0] == RESCHEDULED_CODE:  # runs again; the sequence batcher never sends this response
                    request.rescheduled = True
                    responses.append(InferenceResponse(name, version, rid))
                else:
                    responses.append(InferenceResponse(name, version, rid, error=error_from_wire(error)))
                continue
            try:
                tensors = self._decode(out_size, metas)
            except (ValueError, KeyError) as exc:
                text = f"{self.label}: the model's outputs could not be read: {exc}"
                responses.append(InferenceResponse(name, version, rid, error=NereidError.internal(text)))
                continue
            if parameters:
                responses.append(InferenceResponse(name, version, rid, tensors, parameters))
            else:
                responses.append(InferenceResponse(name, version, rid, tensors))
        return responses

    def _rescheduled(self, seq: int, requests: list[InferenceRequest], answers: list[WireResponse]) -> None:
        """Mark the requests of a decoupled batch that the model released to run again."""
        for index, (request, (error, _, _)) in enumerate(zip(requests, answers)):
            if error is not None and error[0] == RESCHEDULED_CODE:
                request.rescheduled = True
                self.streams.pop((seq, index), None)  # its next execution streams under a new key

    def _on_response(self, message: Response) -> None:
        """One response of a decoupled model: straight to its request."""
        seq, index, oseq, out_size, error, parameters, metas, flags = message
        try:
            final = bool(flags & RESPONSE_COMPLETE_FINAL)
            request = self.streams.pop((seq, index), None) if final else self.streams.get((seq, index))
            if request is None or request.respond is ignore_response:
                return
            name, version, rid = request.model_name, request.model_version, request.id
            if metas is None:
                response = InferenceResponse(name, version, rid, final=True, complete_only=True)
            elif error is not None:
                response = InferenceResponse(
                    name, version, rid, parameters=parameters or {}, error=error_from_wire(error), final=final
                )
            else:
                try:
                    tensors = self._decode(out_size, metas)
                except (ValueError, KeyError) as exc:
                    message_text = f"{self.label}: the model's outputs could not be read: {exc}"
                    response = InferenceResponse(name, version, rid, error=NereidError.internal(message_text), final=final)
                else:
                    response = InferenceResponse(name, version, rid, tensors, parameters or {}, final=final)
            request.respond(response)
            if final:
                request.respond = ignore_response
        finally:
            self.consumed(oseq)

    def end_streams(self, seq: int, count: int, error: NereidError) -> None:
        """A decoupled batch failed: each of its requests still streaming gets the error as its final response."""
        for index in range(count):
            request = self.streams.pop((seq, index), None)
            if request is not None and request.respond is not ignore_response:
                request.respond(
                    InferenceResponse(request.model_name, request.model_version, request.id, error=error, final=True)
                )
                request.respond = ignore_response

    def request_of(self, seq: int, index: int) -> InferenceRequest | None:
        """A request in flight (or still streaming), by its batch and place in it."""
        request = self.streams.get((seq, index))
        if request is None:
            batch = self.batches.get(seq)
            request = batch[index] if batch is not None and index < len(batch) else None
        return request

    # -- the end ---------------------------------------------------------------------------------------
    def on_lost(self) -> None:
        """The channel closed: the owner learns it once."""
        if self.alive:
            self.alive = False
            self.hooks.exited(self)

    def fail(self, error: NereidError) -> None:
        for task in list(self.calls):
            task.cancel()  # the model that made them is gone
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()
        self.batches.clear()
        streams = list(self.streams.values())
        self.streams.clear()
        for request in streams:
            if request.respond is not ignore_response:
                request.respond(
                    InferenceResponse(request.model_name, request.model_version, request.id, error=error, final=True)
                )
                request.respond = ignore_response
        waiters: tuple[asyncio.Future[Any], ...] = (self.ready, self.done)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()  # retrieved: nobody may be waiting any more
        for probe in self.probes.values():
            if not probe.done():
                probe.set_result(False)
        self.probes.clear()

    def release(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.inputs.close()
        self.outputs.close()
