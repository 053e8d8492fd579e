"""The model's side of one Python-backend instance, inside its worker: loads the model, serves Execute and IsReady
messages (a plain execute() on the main thread, an `async def execute` on an event loop with a reader thread),
writes the responses' tensors into the output arena and sends each batch's Result.

A model whose execute() is a plain function is served by the main thread, which also reads the channel (and keeps
reading it while the model waits for a BLS call). A model with `async def execute` runs on an asyncio event loop in
the main thread while a reader thread reads the channel: the coroutines of one instance wait at the same time (a
decoupled model's next batch starts while the previous one is still waiting, as Triton 24.04+ does), and
`await request.async_exec()` calls are answered as they complete. Runs in the worker process: it must not import
the server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nereid.backends.python import pb_utils
from nereid.backends.python.arena import Arena
from nereid.backends.python.arena_writer import copy_into, tensor_bytes
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.late_responses import LateResponses, answered_later
from nereid.backends.python.protocol import (
    CONSUMED,
    CONTROL_BYTES,
    INTERNAL_CODE,
    INVALID_ARG_CODE,
    REPLIES_TAKEN,
    RESCHEDULED_CODE,
    Done,
    ErrorInfo,
    Execute,
    ExecuteGroup,
    IsReady,
    Message,
    ReadyState,
    Shutdown,
    TensorMeta,
    WireResponse,
    response_frame,
    result_frame,
)
from nereid.backends.python.worker_runtime import Runtime

__all__ = ["ModelWorker", "format_exception", "exit_now", "import_model", "model_class"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
_RESCHEDULED: WireResponse = ((RESCHEDULED_CODE, ""), None, ())
_NOT_RESCHEDULED: WireResponse = (None, None, ())
_NOT_ITERATIVE = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle "
    "such a flag."
)


def format_exception(exc: BaseException) -> str:
    """A model's exception in Triton's words (pybind11's): `ValueError: message`, then the model's frames under
    `At:`, innermost first, one a line (the worker's own frames left out)."""
    text = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_HERE)]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text



def exit_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)



def import_model(model_file: str, version_dir: str) -> ModuleType:
    if version_dir not in sys.path:
        sys.path.insert(0, version_dir)
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{model_file}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def model_class(module: ModuleType, model_file: str) -> Any:
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise AttributeError(f"'{model_file}' defines no class TritonPythonModel")
    return cls



class ModelWorker:
    """The model's side of one Python-backend instance: runs execute() on the batches the server sends."""

    def __init__(self, channel: BlockingChannel, runtime: Runtime, inputs: Arena, outputs: Arena) -> None:
        self.channel = channel
        self.runtime = runtime
        self.inputs = inputs
        self.outputs = outputs
        self.model: Any = None
        self.execute_fn: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.model_outputs: tuple[str, ...] = ()
        self.all_outputs: frozenset[str] | None = None
        self.label = ""
        self.instance_name = ""
        self.decoupled = False
        self.iterative = False
        self.async_execute = False
        self.main_thread = threading.get_ident()
        self.reader: threading.Thread | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.running = 0  # batches of an async, not decoupled, model whose coroutines run now
        # Growing the input arena's mapping happens in the main thread (a batch) and in the reading thread (a BLS
        # reply): one at a time.
        self.in_lock = threading.Lock()
        # The output arena: `out_lock` keeps allocation, writing and sending in one order for every thread;
        # `unacked` holds (oseq, end) of the messages whose tensors the server may not have read yet.
        self.out_lock = threading.Lock()
        self.oseq = 0
        self.unacked: deque[tuple[int, int]] = deque()
        outputs.head = CONTROL_BYTES
        # Polling for the next request (an Execute's poll_ns): when the last answer went out, and the average wait
        # from an answer to the next request.
        self.answered_ns = 0
        self.wait_ns = 0.0

    # -- lifecycle ----------------------------------------------------------------------------------
    def initialize(self, args: dict[str, str], model_file: str, version_dir: str) -> None:
        config = json.loads(args["model_config"])
        self.model_outputs = tuple(o["name"] for o in config.get("output", []))
        self.all_outputs = frozenset(self.model_outputs) if self.model_outputs else None
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.iterative = bool((config.get("sequence_batching") or {}).get("iterative_sequence", False))
        self.instance_name = args["model_instance_name"]
        self.label = f"[model '{args['model_name']}' version {args['model_version']}] instance '{self.instance_name}'"
        module = import_model(model_file, version_dir)
        self.model = model_class(module, model_file)()
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            self._run(initialize(args))
        self.execute_fn = getattr(self.model, "execute", None)
        if self.execute_fn is None:
            raise AttributeError(f"'{model_file}': TritonPythonModel has no execute() method")
        self.async_execute = inspect.iscoroutinefunction(self.execute_fn)

    def _run(self, result: Any) -> Any:
        """Await what an `async def` hook returned, on the worker's own event loop."""
        if inspect.isawaitable(result):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            return self.loop.run_until_complete(result)
        return result

    def finalize(self) -> ErrorInfo | None:
        finalize = getattr(self.model, "finalize", None)
        error = None
        if finalize is not None:
            try:
                self._run(finalize())
            except Exception as exc:
                error = (INTERNAL_CODE, f"{self.label}: finalize() raised {format_exception(exc)}")
        self.runtime.flush_ops()
        return error

    def is_ready(self) -> bool:
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True
        try:
            return bool(self._run(check()))
        except Exception:
            return False

    # -- the hot path -------------------------------------------------------------------------------
    def execute(self, message: Execute) -> None:
        seq, in_size, wire_requests, _ = message
        requests = self._requests(seq, in_size, wire_requests)
        t1 = time.monotonic_ns()
        runtime = self.runtime
        outer = runtime.in_execute  # True when this batch runs nested, while another waits for a BLS reply
        runtime.in_execute = True
        try:
            result, batch_error = self._call_execute(requests)
        finally:
            runtime.in_execute = outer
        if (result is None or type(result) is list and None in result) and batch_error is None and not self.decoupled:
            waiting = answered_later(requests, result)
            if waiting:
                # Requests whose senders answer after execute() returned: this thread waits for their final flags
                # before it sends the batch's Result and reads the next message (a message that comes meanwhile waits
                # in the channel; a thread of the model that calls the server reads its own reply). So waiting here is
                # what a longer execute() would be: batches stay in order, the batch's input tensors stay valid for
                # the threads that still read them, and the statistics count the wait as the batch's compute time
                # (which ends at the Result, as the request's completion does).
                answered = threading.Event()
                LateResponses(waiting, answered.set, self.label)
                answered.wait()
        self._send_result(seq, requests, result, batch_error, t1, time.monotonic_ns())

    def execute_group(self, message: ExecuteGroup) -> None:
        """One execute() per request, in order; one Result for all. Each response is encoded after the last
        execute() returns: a BLS call made by a later execute() writes into the output arena too."""
        seq, in_size, wire_requests, _ = message
        requests = self._requests(seq, in_size, wire_requests)
        runtime = self.runtime
        outer = runtime.in_execute
        runtime.in_execute = True
        outcomes: list[tuple[Any, ErrorInfo | None]] = []
        times: list[int] = []
        try:
            for request in requests:
                t1 = time.monotonic_ns()
                outcomes.append(self._call_execute([request]))
                times += (t1, time.monotonic_ns())
        finally:
            runtime.in_execute = outer
        with self.out_lock:
            self.reclaim()
            encoded: list[WireResponse] = []
            for request, (result, error) in zip(requests, outcomes, strict=True):
                if error is None:
                    one, error = self._encode(result, [request])
                encoded.append((error, None, ()) if error is not None or one is None else one[0])
            self._send_locked(seq, None, encoded, tuple(times))

    def _call_execute(self, requests: list[pb_utils.InferenceRequest]) -> tuple[Any, ErrorInfo | None]:
        """The model's execute() on `requests`: what it returned, or the error it raised."""
        try:
            result = self.execute_fn(requests)
            if inspect.isawaitable(result):
                result = self._run(result)
        except Exception as exc:
            return None, (INTERNAL_CODE, self._execute_failed(format_exception(exc)))
        return result, None

    def _requests(self, seq: int, in_size: int, wire_requests: Any) -> list[pb_utils.InferenceRequest]:
        buffer = self.input_buffer(in_size)
        model_outputs = self.model_outputs
        received = pb_utils.InferenceRequest._received
        requests = [received(wire, buffer, model_outputs, seq, index) for index, wire in enumerate(wire_requests)]
        if self.decoupled:
            # A decoupled batch is handed back when execute() returns, and the server reuses its space of the input
            # arena then; the model may go on reading the inputs (a thread that answers later, with the arrays
            # as_numpy() gave), as Triton lets it until the request is released: they are copies of their own.
            for request in requests:
                request._tensors = [
                    t if t._dtype == "BYTES" else pb_utils.Tensor._wrap(t._name, t._array.copy(), t._dtype)
                    for t in request.inputs()
                ]
        return requests

    def _send_result(
        self,
        seq: int,
        requests: list[pb_utils.InferenceRequest],
        result: Any,
        batch_error: ErrorInfo | None,
        t1: int,
        t2: int,
    ) -> None:
        """t1 and t2 bound execute() on the monotonic clock, which the server shares: it splits its own wall time
        of the batch at them."""
        encoded: list[Any] | None = None
        if batch_error is not None and not self.decoupled and any(r._sent is not None for r in requests):
            # execute() raised after some requests sent their response: those keep it (Triton sent it already).
            result, batch_error = [pb_utils.InferenceResponse(error=pb_utils.TritonError(batch_error[1], batch_error[0]))] * len(requests), None
        with self.out_lock:
            self.reclaim()
            if batch_error is None:
                encoded, batch_error = self._encode(result, requests)
            if batch_error is not None and self.decoupled:
                self._log_failure(batch_error[1])
            self._send_locked(seq, batch_error, encoded, (t1, t2))

    def _send_locked(
        self, seq: int, batch_error: ErrorInfo | None, encoded: list[Any] | None, times: tuple[int, ...]
    ) -> None:
        """Send a Result whose outputs are in the output arena (call with out_lock held)."""
        self.oseq += 1
        self.unacked.append((self.oseq, self.outputs.head))
        self.channel.send_frame(
            result_frame(seq, self.oseq, self.outputs.size, batch_error, encoded, times, self.runtime.take_ops())
        )

    def input_buffer(self, size: int) -> Any:
        """The input arena's mapping, remapped first when the server grew the arena to `size` (a batch's inputs and a
        BLS response's outputs arrive in any thread, so one at a time)."""
        inputs = self.inputs
        if size > inputs.size:
            with self.in_lock:
                inputs.ensure(size)
        return inputs.mm

    def took_reply(self, reply_no: int) -> None:
        """Tell the server (through the output arena's control word) that it may reuse the input arena's space of
        BLS responses up to `reply_no`."""
        REPLIES_TAKEN.pack_into(self.outputs.mm, 0, reply_no)

    def send_with_outputs(self, tensors: list[Any], frame: Callable[[int, int, tuple[TensorMeta, ...]], bytes]) -> None:
        """Copy `tensors` into the output arena and send the message that `frame(oseq, arena size, their metadata)`
        builds: allocating, writing and sending in one order for every thread."""
        with self.out_lock:
            self.reclaim()
            metas = self.write_outputs(tensors, None)
            self.oseq += 1
            self.unacked.append((self.oseq, self.outputs.head))
            self.channel.send_frame(frame(self.oseq, self.outputs.size, metas))

    def reclaim(self) -> None:
        """Rewind the output arena past everything the server has consumed (call with out_lock held)."""
        (consumed,) = CONSUMED.unpack_from(self.inputs.mm, 0)
        unacked = self.unacked
        while unacked and unacked[0][0] <= consumed:
            unacked.popleft()
        self.outputs.head = unacked[-1][1] if unacked else CONTROL_BYTES

    def write_outputs(self, tensors: list[Any], wanted: frozenset[str] | None) -> tuple[TensorMeta, ...]:
        """Copy a response's tensors into the output arena (call with out_lock held); their metadata."""
        out = self.outputs
        metas: list[TensorMeta] = []
        for tensor in tensors:
            name = tensor._name
            if wanted is not None and name not in wanted:
                continue
            array = tensor._array
            dtype = tensor._dtype
            data, nbytes = tensor_bytes(dtype, array)
            offset = out.alloc(nbytes)
            copy_into(out.mm, offset, data, nbytes)
            metas.append((name, dtype, array.shape, offset, nbytes))
        return tuple(metas)

    def _wanted(self, request: pb_utils.InferenceRequest) -> frozenset[str] | None:
        """The outputs to send: those the client asked for, else every output of the config (None: whatever came)."""
        if request._requested:
            return frozenset(request._requested)
        return self.all_outputs

    def _encode(
        self, result: Any, requests: list[pb_utils.InferenceRequest]
    ) -> tuple[list[WireResponse] | None, ErrorInfo | None]:
        count = len(requests)
        if self.decoupled:
            if result is not None:
                return None, (INTERNAL_CODE, self._not_none())
            if self.iterative:
                # Which requests the model released with RESCHEDULE (before execute() returned, as Triton requires).
                return [_RESCHEDULED if r._release_flags == _RESCHEDULE else _NOT_RESCHEDULED for r in requests], None
            return None, None
        if any(r._sent is not None for r in requests):
            # A response sent through a request's sender is its response (Triton sends it then; a response execute()
            # returns for it comes after its one response, and is dropped); the others are the returned ones.
            returned = result if isinstance(result, (list, tuple)) and len(result) == count else None
            result = [r._sent if r._sent is not None else returned[i] if returned else None for i, r in enumerate(requests)]
        if result is None:
            return None, (
                INTERNAL_CODE,
                f"{self.label}: execute() returned None; it must return a list of {count} InferenceResponse objects, "
                f"one per request (or send each request's response through its response sender)",
            )
        if not isinstance(result, (list, tuple)):
            try:
                result = list(result)
            except TypeError:
                return None, (
                    INTERNAL_CODE,
                    f"{self.label}: execute() returned a {type(result).__name__}; it must return a list of {count} "
                    f"InferenceResponse objects, one per request",
                )
        if len(result) != count:
            return None, (
                INTERNAL_CODE,
                f"{self.label}: execute() returned {len(result)} responses for {count} requests; it must return "
                f"exactly one InferenceResponse per request",
            )
        encoded: list[WireResponse] = []
        response_type = pb_utils.InferenceResponse
        for index, (request, response) in enumerate(zip(requests, result, strict=True)):
            if type(response) is not response_type and not isinstance(response, response_type):
                if response is None and request._release_flags == _RESCHEDULE:
                    encoded.append(_RESCHEDULED if self.iterative else ((INVALID_ARG_CODE, _NOT_ITERATIVE), None, ()))
                    continue
                encoded.append(
                    self._failed(
                        f"execute() returned a {type(response).__name__} for request {index}; expected a "
                        f"pb_utils.InferenceResponse"
                    )
                )
                continue
            if response._error is not None:
                encoded.append(((int(response._error._code), response._error._message), response._parameters, ()))
                continue
            if self.iterative and request._release_flags == _RESCHEDULE:
                encoded.append(
                    self._failed(
                        f"Expected a None object in the execute function return list for reschduled request, found "
                        f"type '{type(response)}'."
                    )
                )
                continue
            try:
                metas = self.write_outputs(response._tensors, self._wanted(request))
            except Exception as exc:
                encoded.append(self._failed(f"cannot send the outputs of request {index}: {format_exception(exc)}"))
                continue
            encoded.append((None, response._parameters, metas))
        return encoded, None

    def _not_none(self) -> str:
        """Triton's words for a decoupled model's execute() that returned something."""
        return self._execute_failed(
            f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must return None."
        )

    def _log_failure(self, message: str) -> None:
        """A decoupled batch's failure goes to the server log as Triton's stub writes it: the requests may have had
        their final responses already, and nobody else would hear of it."""
        frame = inspect.currentframe()
        self.runtime.log(int(pb_utils.LogLevel.ERROR), message, "model_worker.py", frame.f_lineno if frame else 0)

    def _execute_failed(self, text: str) -> str:
        """Triton 2.51's words for a batch its execute() failed, naming the instance (later releases say "for model
        instance"; docs/compatibility.md)."""
        return f"Failed to process the request(s) for model '{self.instance_name}', message: {text}"

    def _failed(self, text: str) -> WireResponse:
        """The entry of a request whose response the model got wrong: an INTERNAL error naming the instance."""
        return ((INTERNAL_CODE, f"{self.label}: {text}"), None, ())

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        """InferenceResponseSender.send: one RESPONSE message now (decoupled), or the request's single response."""
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if not self.decoupled:
            # Triton's checks and words, in its order: one response, then (or with it) the final flag.
            if response is not None and request._sent is not None:
                raise pb_utils.TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and final and request._sent is None:
                raise pb_utils.TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                )
        if request._final:
            raise pb_utils.TritonModelException("Unable to send response. Response sender has been closed.")
        if response is None and not final:
            raise pb_utils.TritonModelException(
                "send() without a response needs flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        if response is not None and not isinstance(response, pb_utils.InferenceResponse):
            raise TypeError(f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}")
        if not self.decoupled:
            pending = request._pending  # set while the batch waits for this request's final flag
            if pending is None and (not self.runtime.in_execute or threading.get_ident() != self.main_thread):
                raise pb_utils.TritonModelException(
                    "a model that is not decoupled sends its one response through its sender during execute() from "
                    "the thread that runs execute(), or from any thread after execute() returned None for its request "
                    "(until it sends the final flag)"
                )
            if response is not None:
                request._sent = response  # the first response sent is the request's, whatever execute() returns
            if final:
                request._final = True
                if pending is not None:
                    pending.finished(request)
            return
        wanted = self._wanted(request)
        with self.out_lock:
            self.reclaim()
            error = parameters = None
            metas: tuple[TensorMeta, ...] | None = None
            if response is not None:
                parameters = response._parameters
                if response._error is not None:
                    error = (int(response._error._code), response._error._message)
                    metas = ()
                else:
                    metas = self.write_outputs(response._tensors, wanted)
            if final:
                request._final = True
            self.oseq += 1
            self.unacked.append((self.oseq, self.outputs.head))
            self.channel.send_frame(
                response_frame(request._seq, request._index, self.oseq, self.outputs.size, error, parameters, metas, flags)
            )

    # -- BLS ---------------------------------------------------------------------------------------------
    def service_while_waiting(self) -> Any:
        """What a blocking BLS wait in this thread does with batches that arrive meanwhile: the main thread of a plain
        execute() runs them at once, nested (the server may hand this instance its next batch while it executes one,
        and that batch may be the request the model waits for: a model calling itself must not deadlock)."""
        if self.reader is None and threading.get_ident() == self.main_thread:
            return self._service
        return None

    def _service(self, message: Message) -> None:
        if isinstance(message, Execute):
            self.execute(message)
        elif isinstance(message, ExecuteGroup):
            self.execute_group(message)
        elif isinstance(message, IsReady):
            self.channel.send(ReadyState(message.call_id, self.is_ready()))

    # -- the loop -------------------------------------------------------------------------------------
    def serve(self) -> None:
        if self.async_execute:
            self.serve_async()
            return
        channel = self.channel
        while True:
            message = channel.recv()
            if message is None:
                os._exit(0)  # the server closed the channel (or died): nothing left to do
            if isinstance(message, Execute):
                received_ns = time.monotonic_ns()
                self.execute(message)
                if message.poll_ns:
                    self.poll_for_next(message.poll_ns, received_ns)
            elif isinstance(message, ExecuteGroup):
                received_ns = time.monotonic_ns()
                self.execute_group(message)
                if message.poll_ns:
                    self.poll_for_next(message.poll_ns, received_ns)
            elif isinstance(message, IsReady):
                channel.send(ReadyState(message.call_id, self.is_ready()))
            elif isinstance(message, Shutdown):
                error = self.finalize()
                channel.send(Done(error))
                exit_now(0)

    def poll_for_next(self, budget_ns: int, received_ns: int) -> None:
        """The server asked for a poll after this answer (one request in flight): poll for the next request, unless
        requests have lately come later than the budget after an answer (a client that pauses between them), when
        polling would only burn the CPU. A long wait counts as twice the budget, so a pause is soon forgotten."""
        if self.answered_ns:
            waited = min(received_ns - self.answered_ns, 2 * budget_ns)
            self.wait_ns = 0.8 * self.wait_ns + 0.2 * waited
        self.answered_ns = time.monotonic_ns()
        if self.wait_ns < budget_ns:
            self.channel.poll_next(budget_ns)

    # -- async def execute ---------------------------------------------------------------------------------
    def serve_async(self) -> None:
        """Run the model's coroutines on an event loop in this thread; a reader thread reads the channel."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        channel = self.channel

        def forward(message: Message | None) -> None:
            try:
                loop.call_soon_threadsafe(self._on_message, message)
            except RuntimeError:
                os._exit(0)  # the loop is gone: the worker is ending

        channel.forward_to(forward)
        self.reader = threading.Thread(target=channel.read_forever, name="nereid-channel-reader", daemon=True)
        self.reader.start()
        loop.run_forever()

    def _on_message(self, message: Message | None) -> None:
        if message is None:
            os._exit(0)  # the server closed the channel (or died)
        if isinstance(message, Execute):
            self._execute_async(message)
        elif isinstance(message, IsReady):
            self._spawn(self._answer_ready(message.call_id))
        elif isinstance(message, Shutdown):
            self._spawn(self._shutdown_async())

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _execute_async(self, message: Execute) -> None:
        seq, in_size, wire_requests, _ = message
        requests = self._requests(seq, in_size, wire_requests)
        t1 = time.monotonic_ns()
        runtime = self.runtime
        try:
            if not self.decoupled:
                self.running += 1
                runtime.in_execute = True
            coroutine = self.execute_fn(requests)
        except Exception as exc:
            if not self.decoupled:
                self.running -= 1
                runtime.in_execute = self.running > 0
            error = (INTERNAL_CODE, self._execute_failed(format_exception(exc)))
            self._send_result(seq, requests, None, error, t1, time.monotonic_ns())
            return
        if self.decoupled:
            self._spawn(self._finish_decoupled(requests, coroutine))
            self._send_result(seq, requests, None, None, t1, time.monotonic_ns())
        else:
            self._spawn(self._finish(seq, requests, coroutine, t1))

    async def _finish(self, seq: int, requests: list[pb_utils.InferenceRequest], coroutine: Any, t1: int) -> None:
        error: ErrorInfo | None = None
        result: Any = None
        try:
            result = await coroutine if inspect.isawaitable(coroutine) else coroutine
        except Exception as exc:
            error = (INTERNAL_CODE, self._execute_failed(format_exception(exc)))
        finally:
            self.running -= 1
            self.runtime.in_execute = self.running > 0
        if (result is None or type(result) is list and None in result) and error is None:
            waiting = answered_later(requests, result)
            if waiting:
                # As execute() does (above), but waiting on the event loop: the model's own tasks that answer run on
                # it meanwhile, and so may the instance's other batches.
                loop = asyncio.get_running_loop()
                answered: asyncio.Future[None] = loop.create_future()

                def resolve() -> None:
                    if not answered.done():
                        answered.set_result(None)

                LateResponses(waiting, lambda: loop.call_soon_threadsafe(resolve), self.label)
                await answered
        self._send_result(seq, requests, result, error, t1, time.monotonic_ns())

    async def _finish_decoupled(self, requests: list[pb_utils.InferenceRequest], coroutine: Any) -> None:
        """Wait for a decoupled batch's coroutine; requests it left without a final response get its error."""
        try:
            result = await coroutine if inspect.isawaitable(coroutine) else coroutine
            if result is None:
                return
            message = self._not_none()
        except Exception as exc:
            message = self._execute_failed(format_exception(exc))
        self._log_failure(message)
        for request in requests:
            if not request._final:
                try:
                    self.send_response(request, pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), _FINAL)
                except Exception:
                    pass

    async def _answer_ready(self, probe: int) -> None:
        check = getattr(self.model, "is_ready", None)
        ready = True
        if check is not None:
            try:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                ready = bool(result)
            except Exception:
                ready = False
        self.channel.send(ReadyState(probe, ready))

    async def _shutdown_async(self) -> None:
        others = [task for task in self.tasks if task is not asyncio.current_task()]
        if others:
            await asyncio.wait(others)  # batches still running: the server's unload waits for them, as Triton does
        error = None
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                result = finalize()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                error = (INTERNAL_CODE, f"{self.label}: finalize() raised {format_exception(exc)}")
        self.runtime.flush_ops()
        self.channel.send(Done(error))
        exit_now(0)
