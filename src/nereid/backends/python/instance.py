"""The server side of one Python-backend instance: its worker process, channel and arenas, restarts and timeouts.

This runs on the same event loop as the HTTP and gRPC frontends, so the per-request work here is kept to a few
tuple builds and one shared-memory copy per tensor: a batch goes out as one EXECUTE message and comes back as one
RESULT message, and the bytes of its tensors never pass through the socket. A model's BLS calls (CALL_BLS) run as
tasks on that loop through the in-process Server; their tensors cross through the same arenas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import marshal
import os
import signal
import socket
import subprocess
import time
from functools import partial
from typing import Any

import numpy as np

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.python.arena import Arena
from nereid.backends.python.custom_metrics import REGISTRY
from nereid.backends.python.pb_utils import read_array
from nereid.backends.python.protocol import (
    AUTO_COMPLETE,
    CALL,
    CALL_BLS,
    CALL_CANCELLED,
    CALL_FAMILY,
    CALL_LOAD,
    CALL_METRIC_VALUE,
    CALL_MODEL_READY,
    CALL_UNLOAD,
    CONSUMED,
    CONTROL_BYTES,
    DONE,
    ERROR_CODES,
    EXECUTE,
    FRAME,
    INIT,
    IS_READY,
    LOG,
    METRICS,
    READY,
    READY_STATE,
    REPLIES_TAKEN,
    REPLY,
    RESCHEDULED_CODE,
    RESPONSE,
    RESULT,
    SHUTDOWN,
    BlockingChannel,
    encode,
)
from nereid.backends.python.worker_launch import LaunchedWorker, SpareWorkers, launch_worker, worker_command, worker_env
from nereid.config.model_config import config_to_json_dict
from nereid.core.dtypes import serialize_bytes
from nereid.core.errors import NereidError, Status
from nereid.core.hot_loop import HOT_WAIT_NS
from nereid.core.server_handle import ServerHandle
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, OutputTensor, RequestedOutput

__all__ = ["PythonInstance", "run_auto_complete"]

log = logging.getLogger("nereid.python")
# Records of model.py's pb_utils.Logger calls, with the model file and line as their origin.
model_log = logging.getLogger("nereid.python.model")

_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_STATUS_OF_CODE = tuple(Status[name] for name in ERROR_CODES)
_CODE_OF_STATUS = {status: code for code, status in enumerate(_STATUS_OF_CODE)}
_FINALIZE_TIMEOUT_S = 30.0
_EXIT_TIMEOUT_S = 5.0
_AUTO_COMPLETE_TIMEOUT_S = 120.0
# How long the model-ready endpoint waits for a model's own is_ready() before it calls the model not ready.
_IS_READY_TIMEOUT_S = 5.0
_INTERNAL_CODE = 1
# Triton's words for a BLS request to a decoupled model without exec(decoupled=True) (its stray quote included).
_DECOUPLED_BLS = (
    "Model {model} is using the decoupled. The current BLS request call doesn't support models using the decoupled "
    "transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
    "models.'"
)
# Spare workers, started ahead of need, for every Python model of this server (sized by the backend).
SPARES = SpareWorkers()


def _spawn_process(socket_fd: int) -> subprocess.Popen[bytes]:
    """A short-lived worker without arenas (auto-complete)."""
    return subprocess.Popen(worker_command(socket_fd), pass_fds=(socket_fd,), stdin=subprocess.DEVNULL, env=worker_env())


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _log_model_record(message: tuple[Any, ...]) -> None:
    _, level, text, filename, lineno = message
    level = _LEVELS.get(level, logging.INFO)
    if model_log.isEnabledFor(level):
        model_log.handle(model_log.makeRecord(model_log.name, level, filename, lineno, text, (), None))


def _sanitize(parameters: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in parameters.items()}


def _ignore(response: InferenceResponse) -> None:
    """The respond callback of a request that was already answered (its timeout expired)."""


async def _wait_exit(process: subprocess.Popen[bytes], timeout: float) -> int:
    """The exit status of a worker that is exiting; killed if it is still there after `timeout` seconds."""
    code = process.poll()
    if code is not None:
        return code
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        exited = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(exited, timeout)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    else:
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), timeout)
        except TimeoutError:
            pass
    code = process.poll()
    if code is None:
        process.kill()
        code = await asyncio.to_thread(process.wait)
    return code


class _Link(asyncio.Protocol):
    """Cuts the bytes from a worker's socket into messages for its _PythonWorkerProcess."""

    def __init__(self, worker: _PythonWorkerProcess) -> None:
        self.worker = worker
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        if self.pending:
            data = self.pending + data
        offset = 0
        total = len(data)
        on_message = self.worker.on_message
        while total - offset >= 4:
            (size,) = FRAME.unpack_from(data, offset)
            end = offset + 4 + size
            if end > total:
                break
            message = marshal.loads(data[offset + 4 : end])
            offset = end
            try:
                on_message(message)
            except Exception:
                log.exception("%s: failed to handle a message from its worker", self.worker.owner.label)
        self.pending = data[offset:] if offset < total else b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.on_lost()


class _PythonWorkerProcess:
    """One worker process of an instance and everything tied to it; a restart makes a new one."""

    def __init__(self, owner: PythonInstance, process: subprocess.Popen[bytes], inputs: Arena, outputs: Arena) -> None:
        loop = asyncio.get_running_loop()
        self.owner = owner
        self.process = process
        self.pid = process.pid
        self.inputs = inputs
        self.outputs = outputs
        self.transport: asyncio.Transport | None = None
        self.alive = True
        self.seq = 0
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ready: asyncio.Future[Any] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()
        self.gone: asyncio.Future[int] = loop.create_future()
        self.probes: dict[int, asyncio.Future[bool]] = {}
        self.next_probe = 0
        self.has_is_ready = False
        self.decoupled = owner.decoupled
        # BLS: the calls in flight, and the number of the last reply whose tensors went into the input arena.
        self.calls: set[asyncio.Task[None]] = set()
        self.reply_no = 0
        # The input arena's regions in use: a batch in flight (by seq) or a BLS reply not yet taken (by -reply_no).
        self.live: dict[int, tuple[int, int]] = {}
        self.replies: list[int] = []
        # The requests of each batch in flight, and (decoupled models) every request still owed its final response.
        self.batches: dict[int, list[InferenceRequest]] = {}
        self.streams: dict[tuple[int, int], InferenceRequest] = {}

    # -- sending -----------------------------------------------------------------------------------
    def send(self, message: tuple[Any, ...]) -> None:
        if self.transport is not None and self.alive:
            self.transport.write(encode(message))

    def _reserve(self, nbytes: int) -> int:
        """Where `nbytes` of the input arena are free: its start when nothing there is still in use, or before the
        oldest region in use when they fit, else after the last one (growing the arena). Batches in flight and BLS
        replies the worker has not taken are in use: with batches pipelined, some batch always is, so the arena is
        reused around them instead of growing without end."""
        live = self.live
        if self.replies:
            taken = REPLIES_TAKEN.unpack_from(self.outputs.mm, 0)[0]
            for reply in [r for r in self.replies if r <= taken]:
                del live[-reply]
                self.replies.remove(reply)
        start = CONTROL_BYTES
        if live:
            regions = live.values()
            if CONTROL_BYTES + nbytes > min(r[0] for r in regions):
                start = (max(r[1] for r in regions) + 63) & ~63
        arena = self.inputs
        if start + nbytes > arena.size:
            arena.grow(start + nbytes)
        return start

    def submit(self, requests: list[InferenceRequest]) -> tuple[int, asyncio.Future[Any]]:
        """Write the batch's tensors into the input arena and send one EXECUTE message for all of it."""
        payloads = []
        total = 0
        for request in requests:
            for tensor in request.inputs:
                data: Any = tensor.data
                if tensor.datatype == "BYTES":
                    data = serialize_bytes(data)
                    nbytes = len(data)
                else:
                    nbytes = data.nbytes
                payloads.append((data, nbytes))
                total += (nbytes + 63) & ~63
        first = head = self._reserve(total)
        arena = self.inputs
        mm = arena.mm
        size = arena.size
        wire = []
        position = 0
        for request in requests:
            metas = []
            for tensor in request.inputs:
                data, nbytes = payloads[position]
                position += 1
                end = head + nbytes
                if nbytes:
                    try:
                        mm[head:end] = data
                    except (BufferError, TypeError, ValueError):
                        mm[head:end] = np.ascontiguousarray(data).tobytes()
                metas.append((tensor.name, tensor.datatype, tensor.shape, head, nbytes))
                head = (end + 63) & ~63
            outputs = request.outputs
            wire.append(
                (
                    request.id,
                    request.correlation_id,
                    request.flags,
                    request.timeout_us,
                    request.parameters,
                    None if outputs is None else tuple(o.name for o in outputs),
                    tuple(metas),
                )
            )
        self.seq += 1
        seq = self.seq
        try:
            frame = encode((EXECUTE, seq, size, wire))
        except ValueError:  # a parameter value marshal cannot carry: send its text
            wire = [w[:4] + (_sanitize(w[4]),) + w[5:] for w in wire]
            frame = encode((EXECUTE, seq, size, wire))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[seq] = future
        self.live[seq] = (first, head)
        self.batches[seq] = requests
        if self.decoupled:
            for index, request in enumerate(requests):
                self.streams[(seq, index)] = request
        self.transport.write(frame)  # type: ignore[union-attr]
        return seq, future

    # -- receiving -----------------------------------------------------------------------------------
    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == RESULT:
            self._on_result(message)
        elif kind == RESPONSE:
            self._on_response(message)
        elif kind == LOG:
            _log_model_record(message)
        elif kind == METRICS:
            REGISTRY.apply(message[1])
        elif kind == CALL:
            self._on_call(message)
        elif kind == READY:
            if not self.ready.done():
                self.ready.set_result(message)
        elif kind == DONE:
            if not self.done.done():
                self.done.set_result(message[1])
        elif kind == READY_STATE:
            probe = self.probes.pop(message[1], None)
            if probe is not None and not probe.done():
                probe.set_result(bool(message[2]))

    def _consumed(self, oseq: int) -> None:
        """Tell the worker (through the input arena's control word) that it may reuse space up to `oseq`."""
        CONSUMED.pack_into(self.inputs.mm, 0, oseq)

    def _copy_out(self, out_size: int, metas: Any) -> list[tuple[str, str, Any, np.ndarray]]:
        """Copy tensors out of the output arena: the worker reuses that space once it is consumed."""
        outputs = self.outputs
        if out_size > outputs.size:
            outputs.ensure(out_size)
        mm = outputs.mm
        return [
            (name, datatype, shape, read_array(mm, datatype, shape, offset, nbytes, copy=True))
            for name, datatype, shape, offset, nbytes in metas
        ]

    def _decode(self, out_size: int, metas: Any) -> list[OutputTensor]:
        """A response's tensors."""
        return [OutputTensor(name, datatype, shape, array) for name, datatype, shape, array in self._copy_out(out_size, metas)]

    def _on_result(self, message: tuple[Any, ...]) -> None:
        _, seq, oseq, out_size, batch_error, responses, times, ops = message
        try:
            if ops:
                REGISTRY.apply(ops)
            future = self.pending.pop(seq, None)
            self.live.pop(seq, None)
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
                    decoded.append(((1, f"{self.owner.label}: the model's outputs could not be read: {exc}"), None, None))
            future.set_result((None, decoded, times))
        finally:
            self._consumed(oseq)

    def _on_response(self, message: tuple[Any, ...]) -> None:
        """One response of a decoupled model: straight to its request."""
        _, seq, index, oseq, out_size, error, parameters, metas, flags = message
        try:
            final = bool(flags & 1)  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
            request = self.streams.pop((seq, index), None) if final else self.streams.get((seq, index))
            if request is None or request.respond is _ignore:
                return
            name, version, rid = request.model_name, request.model_version, request.id
            if metas is None:
                response = InferenceResponse(name, version, rid, final=True, complete_only=True)
            elif error is not None:
                status = _STATUS_OF_CODE[error[0]]
                response = InferenceResponse(
                    name, version, rid, parameters=parameters or {}, error=NereidError(status, error[1]), final=final
                )
            else:
                try:
                    tensors = self._decode(out_size, metas)
                except (ValueError, KeyError) as exc:
                    message_text = f"{self.owner.label}: the model's outputs could not be read: {exc}"
                    response = InferenceResponse(name, version, rid, error=NereidError.internal(message_text), final=final)
                else:
                    response = InferenceResponse(name, version, rid, tensors, parameters or {}, final=final)
            request.respond(response)
            if final:
                request.respond = _ignore
        finally:
            self._consumed(oseq)

    def end_streams(self, seq: int, count: int, error: NereidError) -> None:
        """A decoupled batch failed: each of its requests still streaming gets the error as its final response."""
        for index in range(count):
            request = self.streams.pop((seq, index), None)
            if request is not None and request.respond is not _ignore:
                request.respond(
                    InferenceResponse(request.model_name, request.model_version, request.id, error=error, final=True)
                )
                request.respond = _ignore

    def _on_call(self, message: tuple[Any, ...]) -> None:
        _, call_id, kind, payload = message
        value: Any = None
        reply: tuple[Any, ...]
        try:
            if kind == CALL_FAMILY:
                name, description, metric_kind = payload
                REGISTRY.create_family(self.owner.metrics_owner, name, description, metric_kind)
            elif kind == CALL_METRIC_VALUE:
                value = REGISTRY.value(*payload)
            elif kind == CALL_CANCELLED:
                seq, index = payload
                request = self.streams.get((seq, index))
                if request is None:
                    batch = self.batches.get(seq)
                    request = batch[index] if batch is not None and index < len(batch) else None
                value = bool(request is not None and request.cancelled)
            elif kind == CALL_BLS:
                self._on_bls(call_id, payload)
                return
            elif kind in (CALL_LOAD, CALL_UNLOAD, CALL_MODEL_READY):
                self._start(self._repository_call(call_id, kind, payload))
                return
            else:
                raise NereidError.unsupported(f"unknown call '{kind}'")
            reply = (REPLY, call_id, None, value)
        except NereidError as exc:
            reply = (REPLY, call_id, (_CODE_OF_STATUS[exc.status], exc.message), None)
        self.send(reply)

    # -- BLS -----------------------------------------------------------------------------------------
    def _start(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    def _on_bls(self, call_id: int, payload: tuple[Any, ...]) -> None:
        """A model's InferenceRequest.exec(): copy its inputs out of the output arena, then run it as a task."""
        (oseq, out_size, model, version, request_id, correlation_id, flags, timeout_us, parameters, requested, metas,
         decoupled) = payload
        try:
            inputs = self._bls_inputs(out_size, metas)
        except (ValueError, KeyError, TypeError) as exc:
            self._bls_reply(call_id, None, True, f"the inputs of the BLS request could not be read: {exc}")
            return
        finally:
            self._consumed(oseq)
        request = InferenceRequest(
            model,
            version,
            inputs,
            id=request_id,
            outputs=[RequestedOutput(name) for name in requested] if requested else None,
            parameters=dict(parameters) if parameters else {},
            timeout_us=timeout_us if timeout_us > 0 else 0,
            correlation_id=correlation_id,
            flags=flags,
        )
        if request.timeout_us or not self._submit_bls(call_id, request):
            self._start(self._run_bls(call_id, request, decoupled))

    def _submit_bls(self, call_id: int, request: InferenceRequest) -> bool:
        """The common BLS call (an ordinary model, no timeout) without a task: the scheduler's response callback
        writes the reply, so the call costs no loop iterations of its own. False: it needs the task (_run_bls)."""
        server = self.owner.context.server
        if server is None:
            return False
        model = request.model_name
        try:
            if server.model(model, request.model_version).decoupled:
                return False
        except NereidError:
            return False  # _run_bls answers with Triton's words for a model that is not ready
        try:
            return bool(server.submit(request, partial(self._bls_reply, call_id, final=True)))
        except NereidError as exc:
            error = f"Model {model} - Error when running inference: {exc.message}"
        except Exception as exc:  # a server bug must answer the model, never leave it waiting
            log.exception("%s: BLS request to model '%s' failed", self.owner.label, model)
            error = f"Model {model} - Error when running inference: {type(exc).__name__}: {exc}"
        self._bls_reply(call_id, None, True, error)
        return True

    def _bls_inputs(self, out_size: int, metas: Any) -> list[InputTensor]:
        """A BLS request's tensors."""
        return [
            InputTensor(name, datatype, tuple(shape), array) for name, datatype, shape, array in self._copy_out(out_size, metas)
        ]

    async def _run_bls(self, call_id: int, request: InferenceRequest, decoupled: bool) -> None:
        """Run one BLS request through the server; every outcome, errors included, is a response to the model."""
        server = self.owner.context.server
        model = request.model_name
        state = {"final": False}
        timeout = request.timeout_us / 1e6 if request.timeout_us else None
        error: str | None = None
        try:
            if timeout is None:
                await self._bls_responses(server, call_id, request, decoupled, state)
            else:
                async with asyncio.timeout(timeout):
                    await self._bls_responses(server, call_id, request, decoupled, state)
        except TimeoutError:
            request.cancelled = True
            error = f"Request timeout expired: model '{model}' did not answer within {request.timeout_us} us"
        except NereidError as exc:
            error = f"Model {model} - Error when running inference: {exc.message}"
        except asyncio.CancelledError:
            request.cancelled = True
            raise
        except Exception as exc:  # a server bug must answer the model, never leave it waiting
            log.exception("%s: BLS request to model '%s' failed", self.owner.label, model)
            error = f"Model {model} - Error when running inference: {type(exc).__name__}: {exc}"
        if error is not None and not state["final"]:
            self._bls_reply(call_id, None, True, error)

    async def _bls_responses(
        self, server: ServerHandle | None, call_id: int, request: InferenceRequest, decoupled: bool, state: dict[str, bool]
    ) -> None:
        model = request.model_name
        if server is None:
            raise NereidError.unavailable("BLS requests need the in-process server, which this instance was not given")
        try:
            decoupled_model = (await server.wait_model(model, request.model_version)).decoupled
        except NereidError:
            raise NereidError.unavailable(
                f"Failed for execute the inference request. Model '{model}' is not ready."
            ) from None
        if decoupled_model:
            if not decoupled:
                raise NereidError.unsupported(_DECOUPLED_BLS.format(model=model))
            async for response in server.infer_stream(request):
                final = bool(response.final)
                self._bls_reply(call_id, response, final)
                if final:
                    state["final"] = True
                    return
            return
        response = await server.infer(request, raise_error=False)
        self._bls_reply(call_id, response, True)
        state["final"] = True

    def _bls_reply(self, call_id: int, response: InferenceResponse | None, final: bool = True, error: str | None = None) -> None:
        """One response of a BLS call: its tensors into the input arena, then a REPLY with their metadata."""
        if not self.alive:
            return
        arena = self.inputs
        metas = []
        parameters = None
        self.reply_no += 1
        if response is not None:
            if response.error is not None:
                error = response.error.message
            elif response.parameters:
                # What the called model put in its response reaches the caller's response.parameters(); only the
                # values a response parameter may hold, so the marshal-encoded REPLY never meets anything else.
                parameters = {k: v for k, v in response.parameters.items() if isinstance(v, (bool, int, float, str))}
            if response.error is None and response.outputs:
                payloads = []
                total = 0
                for output in response.outputs:
                    data: Any = output.data
                    if output.datatype == "BYTES":
                        data = serialize_bytes(data)
                        nbytes = len(data)
                    else:
                        if not data.flags.c_contiguous:
                            data = np.ascontiguousarray(data)
                        nbytes = data.nbytes
                    payloads.append((data, nbytes))
                    total += (nbytes + 63) & ~63
                offset = start = self._reserve(total)
                mm = arena.mm
                for output, (data, nbytes) in zip(response.outputs, payloads, strict=True):
                    if nbytes:
                        try:
                            mm[offset : offset + nbytes] = data
                        except (BufferError, TypeError, ValueError):
                            mm[offset : offset + nbytes] = np.ascontiguousarray(data).tobytes()
                    metas.append((output.name, output.datatype, tuple(int(d) for d in output.data.shape), offset, nbytes))
                    offset = (offset + nbytes + 63) & ~63
                self.live[-self.reply_no] = (start, offset)
                self.replies.append(self.reply_no)
        # Triton's BLS responses carry their errors as INTERNAL, whatever the code of the model that failed.
        value = (arena.size, None if error is None else (_INTERNAL_CODE, error), parameters, tuple(metas), final, self.reply_no)
        self.send((REPLY, call_id, None, value))

    async def _repository_call(self, call_id: int, kind: str, payload: tuple[Any, ...]) -> None:
        """pb_utils.load_model, unload_model and is_model_ready, through the server's repository API."""
        server = self.owner.context.server
        value: Any = None
        reply: tuple[Any, ...]
        try:
            if server is None:
                raise NereidError.unavailable("the model-repository API needs the in-process server")
            if kind == CALL_LOAD:
                name, config, files = payload
                parameters: dict[str, Any] = dict(files)
                if config:
                    parameters["config"] = config
                await server.load_model(name, parameters)
            elif kind == CALL_UNLOAD:
                name, unload_dependents = payload
                await server.unload_model(name, {"unload_dependents": unload_dependents})
            else:
                name, version = payload
                try:
                    value = bool(server.model_ready(name, version))
                except NereidError:
                    value = False
            reply = (REPLY, call_id, None, value)
        except NereidError as exc:
            reply = (REPLY, call_id, (_CODE_OF_STATUS[exc.status], exc.message), None)
        except Exception as exc:
            log.exception("%s: a model-repository call failed", self.owner.label)
            reply = (REPLY, call_id, (_INTERNAL_CODE, f"{type(exc).__name__}: {exc}"), None)
        self.send(reply)

    def on_lost(self) -> None:
        if self.alive:
            self.alive = False
            asyncio.get_running_loop().create_task(self.owner._worker_exited(self))

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
            if request.respond is not _ignore:
                request.respond(
                    InferenceResponse(request.model_name, request.model_version, request.id, error=error, final=True)
                )
                request.respond = _ignore
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


class PythonInstance:
    """One instance of a Python model: a worker process that the instance restarts when it dies."""

    # The scheduler may hand over the next batch while this one executes: the worker runs them one after
    # the other, and the round trip through the server no longer leaves it idle between batches.
    pipelined_batches = 2

    def __init__(self, context: ModelContext, spec: InstanceSpec) -> None:
        self.name = spec.name
        self.context = context
        self.spec = spec
        self.label = f"[model '{context.name}' version {context.version}] instance '{spec.name}'"
        self.metrics_owner = f"{context.name}/{context.version}/{spec.name}/{id(self)}"
        self.decoupled = bool(context.config.model_transaction_policy.decoupled)
        self.model_file = context.model_file("model.py")
        self.args = {
            "model_config": json.dumps(config_to_json_dict(context.config), separators=(",", ":")),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(context.model_path),
            "model_version": str(context.version),
            "model_name": context.name,
        }
        self._worker: _PythonWorkerProcess | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._round_trip_ns = 0.0  # the worker's recent answer time, submit to result (an average)
        self._worker_free_ns = 0  # when the worker's execute() of the batch before returned (its own stamp)
        self._restart_error = ""
        self._closing = False

    @property
    def pid(self) -> int | None:
        """The process id of the current worker (None while it restarts)."""
        worker = self._worker
        return worker.pid if worker is not None and worker.alive else None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.model_file.exists():
            raise NereidError.unavailable(f"{self.label}: unable to find '{self.model_file}'")
        self._worker = await self._spawn()

    async def _spawn(self) -> _PythonWorkerProcess:
        loop = asyncio.get_running_loop()
        launched = SPARES.take()
        if launched is None:
            try:
                launched = launch_worker(self.name)
            except OSError as exc:
                raise NereidError.unavailable(f"{self.label}: cannot start a Python backend worker: {exc}") from None
        try:
            return await self._initialize(loop, launched)
        finally:
            SPARES.refill_soon()  # after this model is up: a new spare's imports do not slow its start

    async def _initialize(self, loop: asyncio.AbstractEventLoop, launched: LaunchedWorker) -> _PythonWorkerProcess:
        process, parent_sock, in_fd, out_fd = launched.process, launched.channel, launched.in_fd, launched.out_fd
        worker = _PythonWorkerProcess(self, process, Arena(in_fd), Arena(out_fd))
        try:
            transport, _ = await loop.create_unix_connection(lambda: _Link(worker), sock=parent_sock)
            worker.transport = transport  # type: ignore[assignment]
            worker.send((INIT, self.args, str(self.model_file), str(self.context.version_path)))
            _, error, value = await worker.ready
        except BaseException:
            await self._discard(worker)
            raise
        if error is not None:
            await self._discard(worker)
            raise NereidError.unavailable(f"{self.label} failed to initialize: {error[1]}")
        worker.has_is_ready = isinstance(value, tuple) and bool(value[1])
        return worker

    async def _discard(self, worker: _PythonWorkerProcess) -> None:
        """End a worker for good: kill it, fail whatever it still had, free its channel and arenas."""
        worker.alive = False
        if worker.process.poll() is None:
            worker.process.kill()
        code = await _wait_exit(worker.process, _EXIT_TIMEOUT_S)
        worker.fail(NereidError.unavailable(f"{self.label} was unloaded while this request was still executing"))
        worker.release()
        if not worker.gone.done():
            worker.gone.set_result(code)

    async def _worker_exited(self, worker: _PythonWorkerProcess) -> None:
        """The channel to a worker closed: collect its exit status, fail what it had, restart it."""
        code = await _wait_exit(worker.process, _EXIT_TIMEOUT_S)
        how = _describe_exit(code)
        unexpected = not self._closing and worker.done.done() is False
        error = NereidError.internal(
            f"{self.label}: the Python backend worker (pid {worker.pid}) {how}"
            + ("; the instance is restarting" if unexpected else "")
        )
        worker.fail(error)
        worker.release()
        if not worker.gone.done():
            worker.gone.set_result(code)
        if worker is not self._worker or self._closing:
            return
        log.error("%s: the Python backend worker (pid %d) %s; restarting it", self.label, worker.pid, how)
        self._worker = None
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        try:
            self._worker = await self._spawn()
            self._restart_error = ""
            log.info("%s: the Python backend worker restarted (pid %d)", self.label, self._worker.pid)
        except NereidError as exc:
            self._restart_error = exc.message
            log.error("%s: cannot restart the Python backend worker: %s", self.label, exc.message)
        except Exception as exc:
            self._restart_error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: cannot restart the Python backend worker", self.label)

    async def _revive(self) -> _PythonWorkerProcess:
        if self._closing:
            raise NereidError.unavailable(f"{self.label} is unloading")
        task = self._restart_task
        if task is None or task.done():
            task = self._restart_task = asyncio.get_running_loop().create_task(self._restart())
        await asyncio.shield(task)
        worker = self._worker
        if worker is None or not worker.alive:
            raise NereidError.unavailable(f"{self.label}: its worker could not be restarted: {self._restart_error}")
        return worker

    def _recycle(self, worker: _PythonWorkerProcess, reason: str) -> None:
        """Replace a worker that holds a batch nobody waits for any more: the next batch goes to a new one."""
        if worker is not self._worker:
            return
        log.warning("%s: %s; replacing its worker (pid %d)", self.label, reason, worker.pid)
        self._worker = None
        worker.process.kill()
        if not self._closing and (self._restart_task is None or self._restart_task.done()):
            self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def close(self) -> None:
        self._closing = True
        task = self._restart_task
        if task is not None and not task.done():
            await asyncio.shield(task)
        worker = self._worker
        self._worker = None
        if worker is not None:
            if worker.alive and worker.pending:
                # A batch outlived the drain (a hung execute): the worker cannot read SHUTDOWN until it returns.
                log.warning("%s: execute() still running at unload; ending the worker without finalize()", self.label)
                worker.process.kill()
            elif worker.alive:
                worker.send((SHUTDOWN,))
                try:
                    error = await asyncio.wait_for(asyncio.shield(worker.done), _FINALIZE_TIMEOUT_S)
                    if error is not None:
                        log.error("%s", error[1])
                except (TimeoutError, NereidError):
                    pass
                if worker.process.poll() is None and not worker.gone.done():
                    try:
                        await asyncio.wait_for(asyncio.shield(worker.gone), _EXIT_TIMEOUT_S)
                    except TimeoutError:
                        worker.process.kill()
            if worker.alive or not worker.gone.done():
                await self._discard(worker)
        REGISTRY.release(self.metrics_owner)

    async def ready(self) -> bool:
        """Whether the worker is up and the model's optional is_ready() says yes (within _IS_READY_TIMEOUT_S; a model
        without is_ready() costs no message)."""
        worker = self._worker
        if worker is None or not worker.alive:
            return False
        if not worker.has_is_ready:
            return True
        worker.next_probe += 1
        probe_id = worker.next_probe
        probe: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        worker.probes[probe_id] = probe
        worker.send((IS_READY, probe_id))
        try:
            return await asyncio.wait_for(probe, _IS_READY_TIMEOUT_S)
        except TimeoutError:
            worker.probes.pop(probe_id, None)
            return False

    # -- execution -----------------------------------------------------------------------------------------
    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        worker = self._worker
        if worker is None or not worker.alive:
            worker = await self._revive()
        t0 = time.monotonic_ns()
        seq, future = worker.submit(requests)
        server = self.context.server
        # A lone request whose worker usually answers within the budget keeps the loop polling meanwhile.
        hot = server.hot_loop if server is not None and server.alone and self._round_trip_ns < HOT_WAIT_NS else None
        if hot is not None:
            hot.hold(HOT_WAIT_NS)
        timeouts = False
        if not self.decoupled:  # a decoupled model may stream for as long as it likes
            for request in requests:
                if request.timeout_us:
                    timeouts = True
                    break
        if timeouts:
            batch_error, decoded, times = await self._await_with_timeouts(worker, future, requests)
        else:
            batch_error, decoded, times = await future
        if hot is not None:
            hot.release()
        self._round_trip_ns = 0.8 * self._round_trip_ns + 0.2 * (time.monotonic_ns() - t0)
        # The worker's execute() ran from t1 to t2 (same clock): before it is input, after it output. The
        # worker may start while submit() is still returning here, so nothing is measured on both sides.
        t1, t2 = times
        # A batch submitted while the one before still ran waited in the worker until that one ended: queue time.
        waited = max(0, min(t1, self._worker_free_ns) - t0)
        self._worker_free_ns = t2
        if batch_error is not None:
            error = NereidError(_STATUS_OF_CODE[batch_error[0]], batch_error[1])
            if self.decoupled:
                worker.end_streams(seq, len(requests), error)
            raise error
        if self.decoupled:
            if decoded is not None:  # an iterative_sequence model tells which requests it rescheduled
                for index, (request, (error, _, _)) in enumerate(zip(requests, decoded, strict=True)):
                    if error is not None and error[0] == RESCHEDULED_CODE:
                        request.rescheduled = True
                        worker.streams.pop((seq, index), None)  # its next execution streams under a new key
            return [], ExecutionTimes(t1 - t0 - waited, t2 - t1, time.monotonic_ns() - t2, waited)  # responses went out as they came
        responses = []
        for request, (error, parameters, tensors) in zip(requests, decoded, strict=True):
            if error is not None:
                if isinstance(error, NereidError):
                    responses.append(
                        InferenceResponse(request.model_name, request.model_version, request.id, error=error)
                    )
                    continue
                if error[0] == RESCHEDULED_CODE:  # runs again; the sequence batcher never sends this response
                    request.rescheduled = True
                    responses.append(InferenceResponse(request.model_name, request.model_version, request.id))
                    continue
                responses.append(
                    InferenceResponse(
                        request.model_name,
                        request.model_version,
                        request.id,
                        error=NereidError(_STATUS_OF_CODE[error[0]], error[1]),
                    )
                )
            elif parameters:
                responses.append(
                    InferenceResponse(request.model_name, request.model_version, request.id, tensors, parameters)
                )
            else:
                responses.append(InferenceResponse(request.model_name, request.model_version, request.id, tensors))
        return responses, ExecutionTimes(t1 - t0 - waited, t2 - t1, time.monotonic_ns() - t2, waited)

    async def _await_with_timeouts(
        self, worker: _PythonWorkerProcess, future: asyncio.Future[Any], requests: list[InferenceRequest]
    ) -> tuple[Any, Any, Any]:
        """Wait for the batch, answering each request whose timeout expires first with a timeout error."""
        deadlines = {
            index: request.arrival_ns + request.timeout_us * 1000
            for index, request in enumerate(requests)
            if request.timeout_us
        }
        expired: dict[int, NereidError] = {}
        while True:
            now = time.monotonic_ns()
            for index, deadline in list(deadlines.items()):
                if deadline <= now:
                    del deadlines[index]
                    request = requests[index]
                    error = NereidError.unavailable(
                        f"Request timeout expired: {self.label} did not answer within {request.timeout_us} us"
                    )
                    expired[index] = error
                    request.respond(
                        InferenceResponse(request.model_name, request.model_version, request.id, error=error)
                    )
                    request.respond = _ignore
            if len(expired) == len(requests):
                future.cancel()
                self._recycle(worker, "execute() did not finish before the timeouts of all its requests expired")
                return None, [(expired[i], None, None) for i in range(len(requests))], (0, 0, 0)
            if not deadlines:
                result = await future
                break
            wait_s = (min(deadlines.values()) - now) / 1e9
            done, _ = await asyncio.wait([future], timeout=wait_s)
            if done:
                result = future.result()
                break
        batch_error, decoded, times = result
        if expired:
            if batch_error is not None:
                decoded = [(batch_error, None, None)] * len(requests)
                batch_error = None
            decoded = [(expired[i], None, None) if i in expired else entry for i, entry in enumerate(decoded)]
        return batch_error, decoded, times


def run_auto_complete(context: ModelContext, config_json: str) -> str:
    """Run the model's auto_complete_config in a short-lived worker; returns the completed config as JSON."""
    model_file = context.model_file("model.py")
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = _spawn_process(child_sock.fileno())
    finally:
        child_sock.close()
    parent_sock.settimeout(_AUTO_COMPLETE_TIMEOUT_S)
    channel = BlockingChannel(parent_sock)
    prefix = f"model '{context.name}': auto_complete_config"
    try:
        channel.send((AUTO_COMPLETE, config_json, str(model_file), str(context.version_path)))
        while True:
            try:
                message = channel.recv()
            except TimeoutError:
                raise NereidError.unavailable(f"{prefix} did not finish in {_AUTO_COMPLETE_TIMEOUT_S:.0f}s") from None
            if message is None:
                code = process.wait(_EXIT_TIMEOUT_S)
                raise NereidError.unavailable(f"{prefix}: the Python backend worker {_describe_exit(code)}")
            if message[0] == LOG:
                _log_model_record(message)
            elif message[0] == CALL:
                channel.send((REPLY, message[1], (5, "not available while the configuration is auto-completed"), None))
            elif message[0] == READY:
                break
        _, error, value = message
        if error is not None:
            raise NereidError.invalid(f"{prefix} failed: {error[1]}")
        return str(value)
    finally:
        channel.close()
        try:
            process.wait(_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
