"""The Python-backend worker: one process per model instance, running a Triton `model.py` unmodified.

Started by the server as `python -m nereid.backends.python.worker --socket-fd N ...` with one end of a socket pair
and two shared-memory arenas (inputs written by the server, outputs written here). It installs `pb_utils` as
`triton_python_backend_utils`, then serves INIT, EXECUTE, IS_READY and SHUTDOWN messages until the server closes the
channel. It dies with the server: PR_SET_PDEATHSIG, end-of-file on the socket, and a parent-pid watchdog.
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
    CALL_CANCELLED,
    CONSUMED,
    DONE,
    EXECUTE,
    INIT,
    IS_READY,
    LOG,
    METRICS,
    READY,
    READY_STATE,
    RESPONSE,
    RESULT,
    SHUTDOWN,
    BlockingChannel,
)

__all__ = ["main", "Runtime", "format_exception"]

_PR_SET_PDEATHSIG = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = 1  # TritonError.INTERNAL


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
        self.worker: Worker | None = None
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

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        if self.worker is None:
            raise pb_utils.TritonModelException("response senders work only for requests the model received")
        self.worker.send_response(request, response, flags)

    def is_cancelled(self, request: pb_utils.InferenceRequest) -> bool:
        if not request._seq:
            return False  # a request the model built itself (BLS)
        return bool(self.call(CALL_CANCELLED, (request._seq, request._index)))


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


class Worker:
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
        self.decoupled = False
        self.main_thread = threading.get_ident()
        # The output arena: `out_lock` keeps allocation, writing and sending in one order for every thread;
        # `unacked` holds (oseq, end) of the messages whose tensors the server may not have read yet.
        self.out_lock = threading.Lock()
        self.oseq = 0
        self.unacked: deque[tuple[int, int]] = deque()

    # -- lifecycle ----------------------------------------------------------------------------------
    def initialize(self, args: dict[str, str], model_file: str, version_dir: str) -> None:
        config = json.loads(args["model_config"])
        self.model_outputs = tuple(o["name"] for o in config.get("output", []))
        self.all_outputs = frozenset(self.model_outputs) if self.model_outputs else None
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.label = f"[model '{args['model_name']}' version {args['model_version']}] instance '{args['model_instance_name']}'"
        module = _import_model(model_file, version_dir)
        self.model = _model_class(module, model_file)()
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            self._run(initialize(args))
        self.execute_fn = getattr(self.model, "execute", None)
        if self.execute_fn is None:
            raise AttributeError(f"'{model_file}': TritonPythonModel has no execute() method")

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
        t0 = time.monotonic_ns()
        _, seq, in_size, wire_requests = message
        inputs = self.inputs
        if in_size > inputs.size:
            inputs.ensure(in_size)
        buffer = inputs.mm
        model_outputs = self.model_outputs
        received = pb_utils.InferenceRequest._received
        requests = [received(wire, buffer, model_outputs, seq, index) for index, wire in enumerate(wire_requests)]
        t1 = time.monotonic_ns()
        runtime = self.runtime
        runtime.in_execute = True
        batch_error: tuple[int, str] | None = None
        encoded: list[Any] | None = None
        result: Any = None
        try:
            result = self.execute_fn(requests)
            if inspect.isawaitable(result):
                result = self._run(result)
        except Exception as exc:
            batch_error = (_INTERNAL, f"{self.label}: execute() raised {format_exception(exc)}")
        finally:
            runtime.in_execute = False
        t2 = time.monotonic_ns()
        with self.out_lock:
            self._reclaim()
            if batch_error is None:
                encoded, batch_error = self._encode(result, requests)
            self.oseq += 1
            self.unacked.append((self.oseq, self.outputs.head))
            t3 = time.monotonic_ns()
            self.channel.send(
                (
                    RESULT,
                    seq,
                    self.oseq,
                    self.outputs.size,
                    batch_error,
                    encoded,
                    (t1 - t0, t2 - t1, t3 - t2),
                    runtime.take_ops(),
                )
            )

    def _reclaim(self) -> None:
        """Rewind the output arena past everything the server has consumed (call with out_lock held)."""
        (consumed,) = CONSUMED.unpack_from(self.inputs.mm, 0)
        unacked = self.unacked
        while unacked and unacked[0][0] <= consumed:
            unacked.popleft()
        self.outputs.head = unacked[-1][1] if unacked else 0

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

    # -- the loop -------------------------------------------------------------------------------------
    def serve(self) -> None:
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
    worker = Worker(channel, runtime, Arena(args.in_fd), Arena(args.out_fd))
    runtime.worker = worker
    try:
        worker.initialize(init_args, model_file, version_dir)
    except Exception as exc:
        runtime.flush_ops()
        channel.send((READY, (_INTERNAL, format_exception(exc)), None))
        _exit_now(0)
        return
    runtime.flush_ops()
    channel.send((READY, None, os.getpid()))
    worker.serve()


if __name__ == "__main__":
    main()
