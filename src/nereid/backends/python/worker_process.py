"""The server's side of one running Python-backend worker: its channel and arenas, and what is in flight on them.

It sends batches (one Execute each, the tensors through the input arena) and turns the worker's messages into
batch results, decoupled responses, log records and metric updates; a model's calls into the server go to
`model_calls` and `bls_bridge`. Starting, restarting and stopping the process is `process`'s job, not this one's.
This runs on the server's event loop: per message, a few tuple builds and one shared-memory copy per tensor.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from nereid.backends.python.arena import Arena, read_array
from nereid.backends.python.arena_writer import InputArenaWriter
from nereid.backends.python.bls_bridge import BlsBridge
from nereid.backends.python.custom_metrics import REGISTRY
from nereid.backends.python.error_codes import STATUS_OF_CODE
from nereid.backends.python.model_calls import ModelCalls
from nereid.backends.python.protocol import (
    CONSUMED,
    BlsRequest,
    Call,
    Done,
    Log,
    Message,
    Metrics,
    Ready,
    ReadyState,
    Response,
    Result,
    TensorMeta,
    WireRequest,
    encode,
    execute_each_frame,
    execute_frame,
)
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

if TYPE_CHECKING:
    from nereid.backends.python.instance import PythonInstance
    from nereid.backends.python.worker_launch import WorkerProcess

__all__ = [
    "PythonWorkerProcess",
    "BatchOutcome",
    "ignore_response",
    "log_model_record",
    "sanitize_parameters",
]

log = logging.getLogger("nereid.python")
# Records of model.py's pb_utils.Logger calls, with the model file and line as their origin.
model_log = logging.getLogger("nereid.python.model")

_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL

# What a batch's future resolves to: (batch error, [(error, parameters, outputs) per request] | None, the
# worker's stamps around execute(): (t1, t2), or two per request of an ExecuteEach).
BatchOutcome = tuple[Any, Any, Any]


def log_model_record(message: Log) -> None:
    level = _LEVELS.get(message.level, logging.INFO)
    if model_log.isEnabledFor(level):
        model_log.handle(
            model_log.makeRecord(model_log.name, level, message.filename, message.lineno, message.message, (), None)
        )


def sanitize_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters marshal can carry: other values as their text."""
    return {str(k): v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in parameters.items()}


def ignore_response(response: InferenceResponse) -> None:
    """The respond callback of a request that was already answered (its timeout expired)."""


class PythonWorkerProcess:
    """One worker process of an instance and everything tied to it; a restart makes a new one."""

    def __init__(self, owner: PythonInstance, process: WorkerProcess, inputs: Arena, outputs: Arena) -> None:
        loop = asyncio.get_running_loop()
        self.owner = owner
        self.label = owner.label
        self.process = process
        self.pid = process.pid
        self.inputs = inputs
        self.outputs = outputs
        self.writer = InputArenaWriter(inputs, outputs)
        self.transport: asyncio.Transport | None = None
        self.alive = True
        self.seq = 0
        self.pending: dict[int, asyncio.Future[BatchOutcome]] = {}
        self.ready: asyncio.Future[Ready] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()
        self.gone: asyncio.Future[int] = loop.create_future()
        self.probes: dict[int, asyncio.Future[bool]] = {}
        self.next_probe = 0
        self.has_is_ready = False
        self.runs_each = False  # its model may take requests as ExecuteEach (see Ready.runs_each)
        self.decoupled = owner.decoupled
        # The model's calls into the server that run as tasks (BLS, repository calls): cancelled when it is gone.
        self.calls: set[asyncio.Task[None]] = set()
        # The requests of each batch in flight, and (decoupled models) every request still owed its final response.
        self.batches: dict[int, list[InferenceRequest]] = {}
        self.streams: dict[tuple[int, int], InferenceRequest] = {}
        self.bls = BlsBridge(self)
        self.model_calls = ModelCalls(self)

    # -- sending -----------------------------------------------------------------------------------
    def send(self, message: Message) -> None:
        if self.transport is not None and self.alive:
            self.transport.write(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Send a message already framed (by one of protocol's frame builders)."""
        if self.transport is not None and self.alive:
            self.transport.write(frame)

    def start_task(self, coroutine: Any) -> None:
        """Run one of the model's calls into the server as a task that ends with this worker."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    def submit(
        self, requests: list[InferenceRequest], each: bool = False, poll_ns: int = 0
    ) -> tuple[int, asyncio.Future[BatchOutcome]]:
        """Write the batch's tensors into the input arena and send one Execute message for all of it (ExecuteEach
        when `each`: one execute() per request); the worker polls for its next message for up to `poll_ns` after
        answering."""
        writer = self.writer
        described, first, end = writer.write([request.inputs for request in requests])
        wire: list[WireRequest] = []
        for request, metas in zip(requests, described, strict=True):
            outputs = request.outputs
            wire.append(
                (
                    request.id,
                    request.correlation_id,
                    request.flags,
                    request.timeout_us,
                    request.parameters,
                    None if outputs is None else tuple(o.name for o in outputs),
                    metas,
                )
            )
        self.seq += 1
        seq = self.seq
        size = self.inputs.size
        build = execute_each_frame if each else execute_frame
        try:
            frame = build(seq, size, wire, poll_ns)
        except ValueError:  # a parameter value marshal cannot carry: send its text
            wire = [w[:4] + (sanitize_parameters(w[4]),) + w[5:] for w in wire]
            frame = build(seq, size, wire, poll_ns)
        future: asyncio.Future[BatchOutcome] = asyncio.get_running_loop().create_future()
        self.pending[seq] = future
        writer.hold_batch(seq, (first, end))
        self.batches[seq] = requests
        if self.decoupled:
            for index, request in enumerate(requests):
                self.streams[(seq, index)] = request
        self.transport.write(frame)  # type: ignore[union-attr]
        return seq, future

    # -- receiving -----------------------------------------------------------------------------------
    def on_message(self, message: Message) -> None:
        if isinstance(message, Result):
            self._on_result(message)
        elif isinstance(message, Response):
            self._on_response(message)
        elif isinstance(message, BlsRequest):
            self.bls.on_request(message)
        elif isinstance(message, Log):
            log_model_record(message)
        elif isinstance(message, Metrics):
            REGISTRY.apply(message.ops)
        elif isinstance(message, Call):
            self.model_calls.on_call(message)
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
        """A response's tensors."""
        return [OutputTensor(name, datatype, shape, array) for name, datatype, shape, array in self.copy_out(out_size, metas)]

    def _on_result(self, message: Result) -> None:
        seq, oseq, out_size, batch_error, responses, times, ops = message
        try:
            if ops:
                REGISTRY.apply(ops)
            future = self.pending.pop(seq, None)
            self.writer.release_batch(seq)
            self.batches.pop(seq, None)
            if future is None or future.done():
                return  # abandoned: every request of the batch timed out
            if batch_error is not None or responses is None:
                future.set_result((batch_error, None, times))
                return
            decoded: list[tuple[Any, Any, Any]] = []
            for error, parameters, metas in responses:
                if error is not None:
                    decoded.append((error, parameters, None))
                    continue
                try:
                    decoded.append((None, parameters, self._decode(out_size, metas)))
                except (ValueError, KeyError) as exc:
                    decoded.append(((1, f"{self.label}: the model's outputs could not be read: {exc}"), None, None))
            future.set_result((None, decoded, times))
        finally:
            self.consumed(oseq)

    def _on_response(self, message: Response) -> None:
        """One response of a decoupled model: straight to its request."""
        seq, index, oseq, out_size, error, parameters, metas, flags = message
        try:
            final = bool(flags & _FINAL)
            request = self.streams.pop((seq, index), None) if final else self.streams.get((seq, index))
            if request is None or request.respond is ignore_response:
                return
            name, version, rid = request.model_name, request.model_version, request.id
            if metas is None:
                response = InferenceResponse(name, version, rid, final=True, complete_only=True)
            elif error is not None:
                status = STATUS_OF_CODE[error[0]]
                response = InferenceResponse(
                    name, version, rid, parameters=parameters or {}, error=NereidError(status, error[1]), final=final
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
        if self.alive:
            self.alive = False
            asyncio.get_running_loop().create_task(self.owner.supervisor.worker_exited(self))

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
        for waiter in (self.ready, self.done):
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
