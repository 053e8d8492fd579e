"""The worker's side of business-logic scripting: InferenceRequest.exec() and async_exec() send a BlsRequest
(inputs through the output arena) and collect its BlsResponses (outputs copied out of the input arena).

Whichever thread reads the channel hands each response to its call; the caller blocks, iterates or awaits. Runs in
the worker process: it must not import the server.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from nereid.backends.python import pb_runtime, pb_utils
from nereid.backends.python.arena import read_array
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.pb_requests import InferenceTrace
from nereid.backends.python.protocol import (
    CALL_CANCEL_BLS,
    INTERNAL_CODE,
    BlsResponse,
    CallReply,
    Message,
    TensorMeta,
    bls_request_frame,
)

__all__ = ["BlsCall", "BlsHost", "ResponseIterator", "exec_blocking", "exec_async"]

_NO_TRACE = InferenceTrace()


class BlsHost(Protocol):
    """What a BLS call needs of the model worker that makes it (`model_worker.ModelWorker`)."""

    @property
    def channel(self) -> BlockingChannel: ...

    @property
    def reader(self) -> threading.Thread | None:
        """The thread that reads the channel for an `async def execute` model; None when callers read it."""
        ...

    def service_while_waiting(self) -> Callable[[Message], None] | None: ...

    def send_with_outputs(self, tensors: list[Any], frame: Callable[[int, int, tuple[TensorMeta, ...]], bytes]) -> None:
        ...

    def input_buffer(self, size: int) -> Any: ...

    def took_reply(self, reply_no: int) -> None: ...


class BlsCall:
    """One BLS request in flight: its responses as they arrive, copied out of the input arena by the reading thread."""

    __slots__ = ("worker", "call_id", "responses", "done", "wake")

    def __init__(self, worker: BlsHost) -> None:
        self.worker = worker
        self.call_id = 0
        self.responses: deque[pb_utils.InferenceResponse] = deque()
        self.done = False
        self.wake: Any = None

    def finished(self) -> bool:
        return self.done

    def has_news(self) -> bool:
        return self.done or bool(self.responses)

    def on_reply(self, message: BlsResponse | CallReply | None) -> None:
        """An answer to this call (None: the channel closed), in whichever thread read it."""
        final = True
        if message is None:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError("the server closed the channel"))
        elif isinstance(message, CallReply):  # the server refused the call itself
            error = message.error or (INTERNAL_CODE, "the server answered the BLS request without a response")
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error[1], error[0]))
        else:
            try:
                response, final = take_response(self.worker, message)
            except Exception as exc:  # a malformed reply must not kill the reading thread
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"cannot read the BLS response: {type(exc).__name__}: {exc}")
                )
        self.responses.append(response)
        if final:
            self.done = True
            self.worker.channel.forget(self.call_id)
        if self.wake is not None:
            self.wake()
        else:
            self.worker.channel.notify()


class ResponseIterator:
    """What exec(decoupled=True) returns: the responses of the call in order, ending after the final one."""

    __slots__ = ("_call",)

    def __init__(self, call: BlsCall) -> None:
        self._call = call

    def __iter__(self) -> ResponseIterator:
        return self

    def cancel(self) -> None:
        """Ask the server to cancel the call (the called model sees request.is_cancelled()); the responses it still
        sends, a CANCELLED error among them when it honours the cancellation, arrive as before. Once the call has
        ended there is nothing to cancel."""
        call = self._call
        if not call.done:
            pb_runtime.call(CALL_CANCEL_BLS, (call.call_id,), "ResponseIterator.cancel")

    def __next__(self) -> pb_utils.InferenceResponse:
        call = self._call
        if not call.responses:
            if call.done:
                raise StopIteration
            call.worker.channel.wait(call.has_news, call.worker.service_while_waiting())
            if not call.responses:
                raise StopIteration
        return call.responses.popleft()


def exec_blocking(worker: BlsHost, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
    """InferenceRequest.exec: the response (an iterator over the responses when `decoupled`), blocking."""
    call = BlsCall(worker)
    send_request(worker, request, decoupled, call)
    if decoupled:
        return ResponseIterator(call)
    worker.channel.wait(call.finished, worker.service_while_waiting())
    return call.responses[0]


def exec_async(worker: BlsHost, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
    """InferenceRequest.async_exec: sends the request now; the future gives what exec() would have returned: the
    response, or for `decoupled` the iterator as soon as the first response is in (the caller may cancel() the
    rest, as Triton's releases with cancel() let it)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    call = BlsCall(worker)

    def settle() -> None:
        if not future.done():
            future.set_result(ResponseIterator(call) if decoupled else call.responses[0])

    if worker.reader is not None:
        # The reader thread (or any thread reading) wakes this loop once the last response is in.
        def wake() -> None:
            if call.done or (decoupled and call.responses):
                try:
                    loop.call_soon_threadsafe(settle)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits any more

        call.wake = wake
        send_request(worker, request, decoupled, call)
    else:
        # No reader thread (a plain execute() running its own event loop): a helper thread waits, reading.
        send_request(worker, request, decoupled, call)

        def waited(waiting: asyncio.Future[Any]) -> None:
            error = waiting.exception()
            if error is None:
                settle()
            elif not future.done():
                future.set_exception(error)

        ready = call.has_news if decoupled else call.finished
        loop.run_in_executor(None, worker.channel.wait, ready).add_done_callback(waited)
    return future


def send_request(worker: BlsHost, request: pb_utils.InferenceRequest, decoupled: bool, call: BlsCall) -> None:
    """Write the request's input tensors into the output arena and send it to the server as a BlsRequest."""
    model_name = request._model_name
    if not isinstance(model_name, str) or not model_name:
        raise pb_utils.TritonModelException("a BLS InferenceRequest needs a model_name")
    tensors = request.inputs()
    for tensor in tensors:
        if not isinstance(tensor, pb_utils.Tensor):
            raise pb_utils.TritonModelException(
                f"BLS request to model '{model_name}': inputs must be pb_utils.Tensor objects, got "
                f"{type(tensor).__name__}"
            )
    requested = request._requested
    for name in requested:
        if not isinstance(name, str):
            raise pb_utils.TritonModelException(
                f"BLS request to model '{model_name}': requested_output_names must be strings, got {name!r}"
            )
    parameters = request._parameters
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, bool)):
            raise pb_utils.TritonModelException(
                f"BLS request to model '{model_name}': parameter '{key}' must have a str key and a bool, int or "
                f"str value"
            )
    version = request._model_version
    try:
        version_text = "" if version is None or version == "" or int(version) < 0 else str(int(version))
    except (TypeError, ValueError):
        raise pb_utils.TritonModelException(
            f"BLS request to model '{model_name}': model_version must be an integer, got {version!r}"
        ) from None
    correlation_id = request._correlation_id
    if not isinstance(correlation_id, (int, str)):
        raise pb_utils.TritonModelException(f"BLS request to model '{model_name}': correlation_id must be an int or a str")
    request_id = str(request._id)
    flags = int(request._flags)
    timeout_us = int(request._timeout)
    trace_of = getattr(request, "_trace", _NO_TRACE)._of

    def frame(oseq: int, out_arena_size: int, metas: tuple[TensorMeta, ...]) -> bytes:
        return bls_request_frame(
            call_id,
            oseq,
            out_arena_size,
            model_name,
            version_text,
            request_id,
            correlation_id,
            flags,
            timeout_us,
            parameters,
            requested,
            metas,
            decoupled,
            trace_of,
        )

    channel = worker.channel
    call_id = channel.next_call_id()
    call.call_id = call_id
    channel.expect(call_id, call.on_reply)
    try:
        worker.send_with_outputs(tensors, frame)
    except BaseException:
        channel.forget(call_id)
        raise


def take_response(worker: BlsHost, message: BlsResponse) -> tuple[pb_utils.InferenceResponse, bool]:
    """One response of a BLS call: its tensors copied out of the input arena (which the server then reuses)."""
    try:
        if message.error is not None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message.error[1], message.error[0])), message.final
        buffer = worker.input_buffer(message.in_arena_size)
        tensors = []
        for name, dtype, shape, offset, nbytes in message.outputs:
            array = read_array(buffer, dtype, shape, offset, nbytes, copy=True)
            tensors.append(pb_utils.Tensor._wrap(name, array, dtype))
        return pb_utils.InferenceResponse(tensors, parameters=message.parameters), message.final
    finally:
        worker.took_reply(message.reply_no)
