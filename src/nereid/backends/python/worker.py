"""The Python-backend worker: one process per model instance, running a Triton `model.py` unmodified.

Started by the server as `python -m nereid.backends.python.worker --socket-fd N ...` with one end of a socket pair
and two shared-memory arenas (inputs written by the server, outputs written here). It installs `pb_utils` as
`triton_python_backend_utils`, then serves INIT, EXECUTE, IS_READY and SHUTDOWN messages until the server closes the
channel. It dies with the server: PR_SET_PDEATHSIG, end-of-file on the socket, and a parent-pid watchdog.

A model whose execute() is a plain function is served by the main thread, which also reads the channel (and keeps
reading it while the model waits for a BLS call). A model with `async def execute` runs on an asyncio event loop in
the main thread while a reader thread reads the channel: the coroutines of one instance wait at the same time (a
decoupled model's next batch starts while the previous one is still waiting, as Triton 24.04+ does), and
`await request.async_exec()` calls are answered as they complete.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from types import ModuleType
from typing import Any

import numpy as np

from nereid.backends.python import pb_utils
from nereid.backends.python.arena import Arena
from nereid.backends.python.protocol import (
    AUTO_COMPLETE,
    CALL,
    CALL_BLS,
    CALL_CANCELLED,
    CONSUMED,
    CONTROL_BYTES,
    DONE,
    EXECUTE,
    INIT,
    IS_READY,
    LOG,
    METRICS,
    READY,
    READY_STATE,
    REPLIES_TAKEN,
    RESCHEDULED_CODE,
    RESPONSE,
    RESULT,
    SHUTDOWN,
    BlockingChannel,
    CallError,
)

__all__ = ["main", "Runtime", "format_exception"]

_PR_SET_PDEATHSIG = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = 1  # TritonError.INTERNAL
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_INVALID_ARG = 3  # TritonError.INVALID_ARG
_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
_RESCHEDULED = ((RESCHEDULED_CODE, ""), None, ())
_NOT_RESCHEDULED = (None, None, ())
_NOT_ITERATIVE = (
    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle "
    "such a flag."
)


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the server exits, however it exits (even SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog below and end-of-file on the socket still apply
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="nereid-parent-watchdog", daemon=True).start()


def format_exception(exc: BaseException) -> str:
    """`ValueError: message` and the model's frames (the worker's own frames left out), innermost last."""
    lines = [f"{type(exc).__name__}: {exc}"]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_HERE)]
    if frames:
        lines.append("")
        lines.append("Traceback (most recent call last):")
        lines.extend(f"  {f.filename}({f.lineno}): {f.name}" for f in frames)
    return "\n".join(lines)


class Runtime:
    """What pb_utils talks to: the channel to the server for logs, custom metrics and calls."""

    def __init__(self, channel: BlockingChannel, version_dir: str) -> None:
        self.channel = channel
        self.version_dir = version_dir
        self.in_execute = False
        self.ops: list[tuple[Any, ...]] = []
        self.worker: ModelWorker | None = None
        self._main = threading.get_ident()

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        self.channel.send((LOG, level, message, filename, lineno))

    def metric_op(self, op: tuple[Any, ...]) -> None:
        self.ops.append(op)
        # Inside execute the operations ride on the batch's RESULT; anywhere else they go at once.
        if not self.in_execute or threading.get_ident() != self._main:
            self.flush_ops()

    def take_ops(self) -> tuple[tuple[Any, ...], ...]:
        ops = self.ops
        if not ops:
            return ()
        self.ops = []
        return tuple(ops)

    def flush_ops(self) -> None:
        ops = self.take_ops()
        if ops:
            self.channel.send((METRICS, ops))

    def call(self, kind: str, payload: Any) -> Any:
        self.flush_ops()
        return self.channel.call(kind, payload)

    def repository_call(self, kind: str, payload: Any, action: str) -> Any:
        """load_model, unload_model and is_model_ready: errors raise as Triton's stub words them."""
        if self.worker is None:
            raise pb_utils.TritonModelException(f"cannot {action} a model while auto_complete_config runs")
        try:
            return self.call(kind, payload)
        except CallError as exc:
            raise pb_utils.TritonModelException(
                f"Failed to {action} model: Failed to process the request for model '{self.worker.instance_name}', "
                f"message: {exc.message}"
            ) from None

    # -- BLS ----------------------------------------------------------------------------------------------
    def _bls_worker(self) -> ModelWorker:
        if self.worker is None:
            raise pb_utils.TritonModelException("BLS requests are not available while auto_complete_config runs")
        return self.worker

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        """InferenceRequest.exec: the response (an iterator over the responses when `decoupled`), blocking."""
        worker = self._bls_worker()
        call = _BlsCall(worker)
        worker.send_bls(request, decoupled, call)
        if decoupled:
            return _ResponseIterator(call)
        self.channel.wait(call.finished, worker.service_while_waiting())
        return call.responses[0]

    def bls_async(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
        """InferenceRequest.async_exec: sends the request now; the future gives what exec() would have returned."""
        loop = asyncio.get_running_loop()
        worker = self._bls_worker()
        future: asyncio.Future[Any] = loop.create_future()
        call = _BlsCall(worker)

        def settle() -> None:
            if not future.done():
                future.set_result(_ResponseIterator(call) if decoupled else call.responses[0])

        if worker.reader is not None:
            # The reader thread (or any thread reading) wakes this loop once the last response is in.
            def wake() -> None:
                if call.done:
                    try:
                        loop.call_soon_threadsafe(settle)
                    except RuntimeError:
                        pass  # the loop is closed: nobody waits any more

            call.wake = wake
            worker.send_bls(request, decoupled, call)
        else:
            # No reader thread (a plain execute() running its own event loop): a helper thread waits, reading.
            worker.send_bls(request, decoupled, call)

            def waited(waiting: asyncio.Future[Any]) -> None:
                error = waiting.exception()
                if error is None:
                    settle()
                elif not future.done():
                    future.set_exception(error)

            loop.run_in_executor(None, self.channel.wait, call.finished).add_done_callback(waited)
        return future

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        if self.worker is None:
            raise pb_utils.TritonModelException("response senders work only for requests the model received")
        self.worker.send_response(request, response, flags)

    def is_cancelled(self, request: pb_utils.InferenceRequest) -> bool:
        if not request._seq:
            return False  # a request the model built itself (BLS)
        return bool(self.call(CALL_CANCELLED, (request._seq, request._index)))


class _BlsCall:
    """One BLS request in flight: its responses as they arrive, copied out of the input arena by the reading thread."""

    __slots__ = ("worker", "call_id", "responses", "done", "wake")

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self.call_id = 0
        self.responses: deque[pb_utils.InferenceResponse] = deque()
        self.done = False
        self.wake: Any = None

    def finished(self) -> bool:
        return self.done

    def has_news(self) -> bool:
        return self.done or bool(self.responses)

    def on_reply(self, message: tuple[Any, ...] | None) -> None:
        """A REPLY to this call (None: the channel closed), in whichever thread read it."""
        final = True
        if message is None:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError("the server closed the channel"))
        else:
            _, _, error, value = message
            if error is not None:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error[1], error[0]))
            else:
                try:
                    response, final = self.worker.take_reply(value)
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


class _ResponseIterator:
    """What exec(decoupled=True) returns: the responses of the call in order, ending after the final one."""

    __slots__ = ("_call",)

    def __init__(self, call: _BlsCall) -> None:
        self._call = call

    def __iter__(self) -> _ResponseIterator:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        call = self._call
        if not call.responses:
            if call.done:
                raise StopIteration
            call.worker.channel.wait(call.has_news, call.worker.service_while_waiting())
            if not call.responses:
                raise StopIteration
        return call.responses.popleft()


def _import_model(model_file: str, version_dir: str) -> ModuleType:
    if version_dir not in sys.path:
        sys.path.insert(0, version_dir)
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import '{model_file}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _model_class(module: ModuleType, model_file: str) -> Any:
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

    # -- lifecycle ----------------------------------------------------------------------------------
    def initialize(self, args: dict[str, str], model_file: str, version_dir: str) -> None:
        config = json.loads(args["model_config"])
        self.model_outputs = tuple(o["name"] for o in config.get("output", []))
        self.all_outputs = frozenset(self.model_outputs) if self.model_outputs else None
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.iterative = bool((config.get("sequence_batching") or {}).get("iterative_sequence", False))
        self.instance_name = args["model_instance_name"]
        self.label = f"[model '{args['model_name']}' version {args['model_version']}] instance '{self.instance_name}'"
        module = _import_model(model_file, version_dir)
        self.model = _model_class(module, model_file)()
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

    def finalize(self) -> tuple[int, str] | None:
        finalize = getattr(self.model, "finalize", None)
        error = None
        if finalize is not None:
            try:
                self._run(finalize())
            except Exception as exc:
                error = (_INTERNAL, f"{self.label}: finalize() raised {format_exception(exc)}")
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
    def execute(self, message: tuple[Any, ...]) -> None:
        _, seq, in_size, wire_requests = message
        requests = self._requests(seq, in_size, wire_requests)
        t1 = time.monotonic_ns()
        runtime = self.runtime
        outer = runtime.in_execute  # True when this batch runs nested, while another waits for a BLS reply
        runtime.in_execute = True
        batch_error: tuple[int, str] | None = None
        result: Any = None
        try:
            result = self.execute_fn(requests)
            if inspect.isawaitable(result):
                result = self._run(result)
        except Exception as exc:
            batch_error = (_INTERNAL, f"{self.label}: execute() raised {format_exception(exc)}")
        finally:
            runtime.in_execute = outer
        self._send_result(seq, requests, result, batch_error, t1, time.monotonic_ns())

    def _requests(self, seq: int, in_size: int, wire_requests: Any) -> list[pb_utils.InferenceRequest]:
        inputs = self.inputs
        if in_size > inputs.size:
            with self.in_lock:
                inputs.ensure(in_size)
        buffer = inputs.mm
        model_outputs = self.model_outputs
        received = pb_utils.InferenceRequest._received
        return [received(wire, buffer, model_outputs, seq, index) for index, wire in enumerate(wire_requests)]

    def _send_result(
        self,
        seq: int,
        requests: list[pb_utils.InferenceRequest],
        result: Any,
        batch_error: tuple[int, str] | None,
        t1: int,
        t2: int,
    ) -> None:
        """t1 and t2 bound execute() on the monotonic clock, which the server shares: it splits its own wall time
        of the batch at them."""
        encoded: list[Any] | None = None
        with self.out_lock:
            self._reclaim()
            if batch_error is None:
                encoded, batch_error = self._encode(result, requests)
            self.oseq += 1
            self.unacked.append((self.oseq, self.outputs.head))
            self.channel.send(
                (
                    RESULT,
                    seq,
                    self.oseq,
                    self.outputs.size,
                    batch_error,
                    encoded,
                    (t1, t2),
                    self.runtime.take_ops(),
                )
            )

    def _reclaim(self) -> None:
        """Rewind the output arena past everything the server has consumed (call with out_lock held)."""
        (consumed,) = CONSUMED.unpack_from(self.inputs.mm, 0)
        unacked = self.unacked
        while unacked and unacked[0][0] <= consumed:
            unacked.popleft()
        self.outputs.head = unacked[-1][1] if unacked else CONTROL_BYTES

    def _write_outputs(self, tensors: list[Any], wanted: frozenset[str] | None) -> tuple[Any, ...]:
        """Copy a response's tensors into the output arena (call with out_lock held); their metadata."""
        out = self.outputs
        metas = []
        for tensor in tensors:
            name = tensor._name
            if wanted is not None and name not in wanted:
                continue
            array = tensor._array
            dtype = tensor._dtype
            if dtype == "BYTES":
                data: Any = pb_utils.serialize_byte_tensor(array)
                nbytes = len(data)
            else:
                data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
                nbytes = data.nbytes
            offset = out.alloc(nbytes)
            if nbytes:
                out.mm[offset : offset + nbytes] = data
            metas.append((name, dtype, array.shape, offset, nbytes))
        return tuple(metas)

    def _wanted(self, request: pb_utils.InferenceRequest) -> frozenset[str] | None:
        """The outputs to send: those the client asked for, else every output of the config (None: whatever came)."""
        if request._requested:
            return frozenset(request._requested)
        return self.all_outputs

    def _encode(
        self, result: Any, requests: list[pb_utils.InferenceRequest]
    ) -> tuple[list[Any] | None, tuple[int, str] | None]:
        count = len(requests)
        if self.decoupled:
            if result is not None:
                return None, (_INTERNAL, f"{self.label}: a decoupled model's execute() must return None")
            if self.iterative:
                # Which requests the model released with RESCHEDULE (before execute() returned, as Triton requires).
                return [_RESCHEDULED if r._release_flags == _RESCHEDULE else _NOT_RESCHEDULED for r in requests], None
            return None, None
        if result is None and all(r._sent is not None for r in requests):
            result = [r._sent for r in requests]  # each sent its one response through its sender
        if result is None:
            return None, (
                _INTERNAL,
                f"{self.label}: execute() returned None; it must return a list of {count} InferenceResponse objects, "
                f"one per request (or send each request's response through its response sender)",
            )
        if not isinstance(result, (list, tuple)):
            try:
                result = list(result)
            except TypeError:
                return None, (
                    _INTERNAL,
                    f"{self.label}: execute() returned a {type(result).__name__}; it must return a list of {count} "
                    f"InferenceResponse objects, one per request",
                )
        if len(result) != count:
            return None, (
                _INTERNAL,
                f"{self.label}: execute() returned {len(result)} responses for {count} requests; it must return "
                f"exactly one InferenceResponse per request",
            )
        encoded: list[Any] = []
        response_type = pb_utils.InferenceResponse
        for index, (request, response) in enumerate(zip(requests, result, strict=True)):
            if type(response) is not response_type and not isinstance(response, response_type):
                if response is None and request._release_flags == _RESCHEDULE:
                    encoded.append(_RESCHEDULED if self.iterative else ((_INVALID_ARG, _NOT_ITERATIVE), None, ()))
                    continue
                error = (
                    _INTERNAL,
                    f"{self.label}: execute() returned a {type(response).__name__} for request {index}; expected a "
                    f"pb_utils.InferenceResponse",
                )
                encoded.append((error, None, ()))
                continue
            if response._error is not None:
                encoded.append(((int(response._error._code), response._error._message), response._parameters, ()))
                continue
            if self.iterative and request._release_flags == _RESCHEDULE:
                error = (
                    _INTERNAL,
                    f"{self.label}: Expected a None object in the execute function return list for reschduled "
                    f"request, found type '{type(response)}'.",
                )
                encoded.append((error, None, ()))
                continue
            try:
                metas = self._write_outputs(response._tensors, self._wanted(request))
            except Exception as exc:
                error = (_INTERNAL, f"{self.label}: cannot send the outputs of request {index}: {format_exception(exc)}")
                encoded.append((error, None, ()))
                continue
            encoded.append((None, response._parameters, metas))
        return encoded, None

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        """InferenceResponseSender.send: one RESPONSE message now (decoupled), or the request's single response."""
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if request._final:
            raise pb_utils.TritonModelException(
                f"request '{request._id}' has already been sent its final response (flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)"
            )
        if response is None and not final:
            raise pb_utils.TritonModelException(
                "send() without a response needs flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        if response is not None and not isinstance(response, pb_utils.InferenceResponse):
            raise TypeError(f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}")
        if not self.decoupled:
            if not final or response is None or not self.runtime.in_execute or threading.get_ident() != self.main_thread:
                raise pb_utils.TritonModelException(
                    "a model that is not decoupled sends exactly one response per request, during execute(), with "
                    "flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL (and returns None)"
                )
            request._final = True
            request._sent = response
            return
        wanted = self._wanted(request)
        with self.out_lock:
            self._reclaim()
            error = parameters = None
            metas: tuple[Any, ...] | None = None
            if response is not None:
                parameters = response._parameters
                if response._error is not None:
                    error = (int(response._error._code), response._error._message)
                    metas = ()
                else:
                    metas = self._write_outputs(response._tensors, wanted)
            if final:
                request._final = True
            self.oseq += 1
            self.unacked.append((self.oseq, self.outputs.head))
            self.channel.send(
                (RESPONSE, request._seq, request._index, self.oseq, self.outputs.size, error, parameters, metas, flags)
            )

    # -- BLS ---------------------------------------------------------------------------------------------
    def service_while_waiting(self) -> Any:
        """What a blocking BLS wait in this thread does with batches that arrive meanwhile: the main thread of a plain
        execute() runs them at once, nested (the server may hand this instance its next batch while it executes one,
        and that batch may be the request the model waits for: a model calling itself must not deadlock)."""
        if self.reader is None and threading.get_ident() == self.main_thread:
            return self._service
        return None

    def _service(self, message: tuple[Any, ...]) -> None:
        if message[0] == EXECUTE:
            self.execute(message)
        elif message[0] == IS_READY:
            self.channel.send((READY_STATE, message[1], self.is_ready()))

    def send_bls(self, request: pb_utils.InferenceRequest, decoupled: bool, call: _BlsCall) -> None:
        """Write the request's input tensors into the output arena and send it to the server as a CALL."""
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
            raise pb_utils.TritonModelException(
                f"BLS request to model '{model_name}': correlation_id must be an int or a str"
            )
        channel = self.channel
        call_id = channel.next_call_id()
        call.call_id = call_id
        channel.expect(call_id, call.on_reply)
        try:
            with self.out_lock:
                self._reclaim()
                metas = self._write_outputs(tensors, None)
                self.oseq += 1
                self.unacked.append((self.oseq, self.outputs.head))
                payload = (
                    self.oseq,
                    self.outputs.size,
                    model_name,
                    version_text,
                    str(request._id),
                    correlation_id,
                    int(request._flags),
                    int(request._timeout),
                    parameters,
                    requested,
                    metas,
                    decoupled,
                )
                channel.send((CALL, call_id, CALL_BLS, payload))
        except BaseException:
            channel.forget(call_id)
            raise

    def take_reply(self, value: tuple[Any, ...]) -> tuple[pb_utils.InferenceResponse, bool]:
        """One response of a BLS call: its tensors copied out of the input arena (which the server then reuses)."""
        in_size, error, parameters, metas, final, reply_no = value
        try:
            if error is not None:
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(error[1], error[0])), final
            inputs = self.inputs
            if in_size > inputs.size:
                with self.in_lock:
                    inputs.ensure(in_size)
            buffer = inputs.mm
            tensors = []
            for name, dtype, shape, offset, nbytes in metas:
                array = pb_utils.read_array(buffer, dtype, shape, offset, nbytes, copy=True)
                tensors.append(pb_utils.Tensor._wrap(name, array, dtype))
            return pb_utils.InferenceResponse(tensors, parameters=parameters), final
        finally:
            REPLIES_TAKEN.pack_into(self.outputs.mm, 0, reply_no)

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
            kind = message[0]
            if kind == EXECUTE:
                self.execute(message)
            elif kind == IS_READY:
                channel.send((READY_STATE, message[1], self.is_ready()))
            elif kind == SHUTDOWN:
                error = self.finalize()
                channel.send((DONE, error))
                _exit_now(0)


    # -- async def execute ---------------------------------------------------------------------------------
    def serve_async(self) -> None:
        """Run the model's coroutines on an event loop in this thread; a reader thread reads the channel."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        channel = self.channel

        def forward(message: tuple[Any, ...] | None) -> None:
            try:
                loop.call_soon_threadsafe(self._on_message, message)
            except RuntimeError:
                os._exit(0)  # the loop is gone: the worker is ending

        channel.forward_to(forward)
        self.reader = threading.Thread(target=channel.read_forever, name="nereid-channel-reader", daemon=True)
        self.reader.start()
        loop.run_forever()

    def _on_message(self, message: tuple[Any, ...] | None) -> None:
        if message is None:
            os._exit(0)  # the server closed the channel (or died)
        kind = message[0]
        if kind == EXECUTE:
            self._execute_async(message)
        elif kind == IS_READY:
            self._spawn(self._answer_ready(message[1]))
        elif kind == SHUTDOWN:
            self._spawn(self._shutdown_async())

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _execute_async(self, message: tuple[Any, ...]) -> None:
        _, seq, in_size, wire_requests = message
        requests = self._requests(seq, in_size, wire_requests)
        if self.decoupled:
            # The batch is handed back at once (the next one may start): its inputs must outlive the input arena's
            # space, which the server reuses as soon as it has the RESULT.
            for request in requests:
                request._tensors = [
                    t if t._dtype == "BYTES" else pb_utils.Tensor._wrap(t._name, t._array.copy(), t._dtype)
                    for t in request.inputs()
                ]
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
            error = (_INTERNAL, f"{self.label}: execute() raised {format_exception(exc)}")
            self._send_result(seq, requests, None, error, t1, time.monotonic_ns())
            return
        if self.decoupled:
            self._spawn(self._finish_decoupled(requests, coroutine))
            self._send_result(seq, requests, None, None, t1, time.monotonic_ns())
        else:
            self._spawn(self._finish(seq, requests, coroutine, t1))

    async def _finish(self, seq: int, requests: list[pb_utils.InferenceRequest], coroutine: Any, t1: int) -> None:
        error: tuple[int, str] | None = None
        result: Any = None
        try:
            result = await coroutine if inspect.isawaitable(coroutine) else coroutine
        except Exception as exc:
            error = (_INTERNAL, f"{self.label}: execute() raised {format_exception(exc)}")
        finally:
            self.running -= 1
            self.runtime.in_execute = self.running > 0
        self._send_result(seq, requests, result, error, t1, time.monotonic_ns())

    async def _finish_decoupled(self, requests: list[pb_utils.InferenceRequest], coroutine: Any) -> None:
        """Wait for a decoupled batch's coroutine; requests it left without a final response get its error."""
        try:
            result = await coroutine if inspect.isawaitable(coroutine) else coroutine
            if result is None:
                return
            message = f"{self.label}: a decoupled model's execute() must return None"
        except Exception as exc:
            message = f"{self.label}: execute() raised {format_exception(exc)}"
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
        self.channel.send((READY_STATE, probe, ready))

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
                error = (_INTERNAL, f"{self.label}: finalize() raised {format_exception(exc)}")
        self.runtime.flush_ops()
        self.channel.send((DONE, error))
        _exit_now(0)


def _exit_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _auto_complete(channel: BlockingChannel, message: tuple[Any, ...]) -> None:
    _, config_json, model_file, version_dir = message
    try:
        cls = _model_class(_import_model(model_file, version_dir), model_file)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            channel.send((READY, None, config_json))
            return
        config = pb_utils.ModelConfig(config_json)
        completed = hook(config)
        if completed is None:
            completed = config
        channel.send((READY, None, json.dumps(completed.as_dict())))
    except Exception as exc:
        channel.send((READY, (_INTERNAL, format_exception(exc)), None))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="nereid-python-worker")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--in-fd", type=int, default=-1)
    parser.add_argument("--out-fd", type=int, default=-1)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    # The server decides when a worker stops: Ctrl-C or a SIGTERM to the process group must not cut a batch short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.argv = [""]
    sys.modules["triton_python_backend_utils"] = pb_utils
    channel = BlockingChannel(socket.socket(fileno=args.socket_fd))
    first = channel.recv()
    if first is None:
        _exit_now(0)
        return
    if first[0] == AUTO_COMPLETE:
        pb_utils._bind(Runtime(channel, first[3]))
        _auto_complete(channel, first)
        _exit_now(0)
        return
    if first[0] != INIT:
        _exit_now(2)
        return
    _, init_args, model_file, version_dir = first
    runtime = Runtime(channel, version_dir)
    pb_utils._bind(runtime)
    worker = ModelWorker(channel, runtime, Arena(args.in_fd), Arena(args.out_fd))
    runtime.worker = worker
    try:
        worker.initialize(init_args, model_file, version_dir)
    except Exception as exc:
        runtime.flush_ops()
        channel.send((READY, (_INTERNAL, format_exception(exc)), None))
        _exit_now(0)
        return
    runtime.flush_ops()
    channel.send((READY, None, (os.getpid(), callable(getattr(worker.model, "is_ready", None)))))
    worker.serve()


if __name__ == "__main__":
    main()
