"""gRPC over Nereid's own HTTP/2 connection: length-prefixed protobuf messages, status in trailers.

grpc.aio spends most of a small call's time in its native glue and caps out at a few thousand calls per second
on two cores. Here a unary call is one task on the event loop: parse, run the service method, and write
headers, message and trailers at once. The service methods are the same `InferenceService` coroutines, given
a small context whose `abort` ends the call with a status.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2 as pb

from nereid.core.errors import NereidError
from nereid.core.request_memory import GRPC_DECODE_FACTOR
from nereid.core.settings import GrpcTls
from nereid.core.tracing import FrontendTrace
from nereid.frontends.grpc.deadline import DEADLINE_EXCEEDED, DEADLINE_MESSAGE, parse_grpc_timeout
from nereid.frontends.grpc.header_blocks import encode_headers
from nereid.frontends.grpc.http2 import DATA, HEADERS, Http2Connection, Stream
from nereid.frontends.grpc.methods import (
    Abort,
    CallContext,
    HealthService,
    Method,
    configure_methods,
    forwarded_parameters,
    method_table,
    response_encoding,
    with_arguments,
    with_parameters,
)
from nereid.frontends.grpc.rollouts import rollout_methods
from nereid.frontends.grpc.service import InferenceService, abort, status_code
from nereid.server import Server

__all__ = ["GrpcServer", "start_grpc_server"]

log = logging.getLogger("nereid.grpc")
# Triton's stream option: with this metadata set to "true", the first error ends the stream with its gRPC status
# instead of going out as a message (ModelStreamInfer's `grpc_error`).
_GRPC_ERROR_HEADER = "triton_grpc_error"

_OK, _UNKNOWN, _INTERNAL, _UNIMPLEMENTED, _NOT_FOUND, _UNAVAILABLE = 0, 2, 13, 12, 5, 14
_RESOURCE_EXHAUSTED = 8
_RESPONSE_HEADERS = encode_headers(
    [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding", b"identity,deflate,gzip")]
)
# Response headers of calls whose messages we compress (--grpc-infer-response-compression-level), by encoding.
_ENCODED_RESPONSE_HEADERS = {
    name: encode_headers(
        [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-encoding", name.encode()),
            (b"grpc-accept-encoding", b"identity,deflate,gzip"),
        ]
    )
    for name in ("gzip", "deflate")
}
_TRAILERS_OK = encode_headers([(b"grpc-status", b"0")])
_MAX_STATUS_MESSAGE = 8192


_CONTEXT = CallContext()


class TracedContext(CallContext):
    """The context of a call that arrived while tracing was on: a unary call's FrontendTrace (its read stamps),
    or a stream's read stamps of the message it just yielded."""

    __slots__ = ("trace", "waited")

    def __init__(self, trace: FrontendTrace | None = None) -> None:
        self.trace = trace
        self.waited: tuple[int, int] | None = None


def _status_block(code: int, message: str, with_response_headers: bool) -> bytes:
    """Trailers, or a trailers-only response when nothing was sent yet."""
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")] if with_response_headers else []
    fields = head + [(b"grpc-status", str(code).encode())]
    if message:
        fields.append((b"grpc-message", _percent_encode(message[:_MAX_STATUS_MESSAGE])))
    return encode_headers(fields)


def _percent_encode(text: str) -> bytes:
    """grpc-message is percent-encoded UTF-8: everything outside printable ASCII, and '%' itself."""
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())


def _message(payload: bytes) -> bytes:
    return len(payload).to_bytes(5, "big") + payload  # flag byte 0 (not compressed), 4-byte length


def _compressed_message(payload: bytes, encoding: str) -> bytes:
    """Flag byte 1 and the compressed payload; like gRPC core, the payload as it is when compressing does not
    make it smaller (the response's grpc-encoding header stays: the flag is per message)."""
    packed = zlib.compress(payload, wbits=31 if encoding == "gzip" else 15)
    if len(packed) >= len(payload):
        return _message(payload)
    return b"\x01" + len(packed).to_bytes(4, "big") + packed


class _Call:
    """Per-stream gRPC state: the method, bytes of a message still arriving, and the running task."""

    __slots__ = (
        "method", "encoding", "chunks", "buffer", "messages", "task", "started", "headers_sent", "compression", "trace",
        "received", "refused", "admitted", "born", "deadline", "reserved", "head_reserved",
    )  # fmt: skip

    def __init__(self, method: Method, encoding: str) -> None:
        self.method = method
        self.received = 0  # bytes of a unary request so far
        self.refused = False  # ended with RESOURCE_EXHAUSTED: whatever else arrives is dropped
        self.admitted = False  # holds a place under --max-inflight-requests until the call ends
        # Bytes held under --request-memory-limit: a unary request's until the call ends; a stream's for each
        # message from its length prefix until the service has parsed it. head_reserved: the message still arriving
        # at the front of a stream's buffer has its bytes reserved.
        self.reserved = 0
        self.head_reserved = False
        self.born = time.monotonic()  # for the server's default deadline (--default-request-timeout-secs)
        self.deadline: asyncio.TimerHandle | None = None  # the client's grpc-timeout, while the call runs
        self.encoding = encoding
        self.compression = ""  # the response's grpc-encoding; "" sends messages as they are
        self.chunks: list[bytes] = []  # a unary request's DATA
        self.buffer = bytearray()  # a streaming request's bytes of a message still arriving
        self.messages: asyncio.Queue[Any] | None = asyncio.Queue() if method.streaming else None
        self.task: asyncio.Task[None] | None = None
        self.started: Any = None  # the core request of a call started without a task
        self.headers_sent = False
        self.trace: FrontendTrace | None = None  # a unary call's frontend stamps, taken only while tracing is on


_END_OF_REQUESTS = object()


class GrpcConnection(Http2Connection):
    def __init__(self, server: GrpcServer) -> None:
        super().__init__(server.options, server.limits)
        self.server = server
        # The server's Tracer: while its `enabled` is on, calls carry frontend stamps (one check per call when off).
        self.tracing = self.tracer = server.tracer
        self.memory = server.request_memory  # --request-memory-limit, shared with the other ports
        self.max_receive = server.limits.grpc_max_receive_message_size
        self.max_send = server.limits.grpc_max_send_message_size

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        if len(server.connections) >= server.limits.grpc_max_connections:
            server.connections_refused += 1
            self.lingering = True  # over --grpc-max-connections: closed before anything is read
            transport.close()
            return
        super().connection_made(transport)
        server.connections.add(self)

    def on_connection_lost(self) -> None:
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()

    def on_stream_reset(self, stream: Stream) -> None:
        self._cancel(stream)

    def on_connection_failure(self, message: str) -> None:
        for stream in list(self.streams.values()):
            self._cancel(stream)
            self._finish_call(stream, _UNAVAILABLE, message)

    def _cancel(self, stream: Stream) -> None:
        call: _Call | None = stream.call
        if call is None:
            return
        if call.admitted:
            self._leave(call, self.server.inflight)
        if call.reserved:
            self._free(call, call.reserved)
        # The bytes themselves go now, not when the collector finds the connection's reference cycles (rarely: the
        # server collects young objects only every 50,000 allocations).
        call.chunks.clear()
        call.buffer.clear()
        if call.messages is not None:
            while not call.messages.empty():
                call.messages.get_nowait()
        if call.deadline is not None:
            call.deadline.cancel()
            call.deadline = None
        # A cancelled request leaves the queue and is never executed.
        if call.task is not None:
            call.task.cancel()
        if call.started is not None:
            call.started.cancelled = True

    # -- requests ---------------------------------------------------------------------------------------------
    def on_request_headers(self, stream: Stream, headers: list[tuple[str, str]], end_stream: bool) -> None:
        path = encoding = timeout = grpc_error = ""
        for name, value in headers:
            if name == ":path":
                path = value
            elif name == "grpc-encoding":
                encoding = value
            elif name == "grpc-timeout":
                timeout = value
            elif name == _GRPC_ERROR_HEADER:
                grpc_error = value
        method = self.server.methods.get(path)
        if method is None:  # unknown, or shaped by flags (restricted, forwarding headers, compressing)
            self._on_configured_request(stream, path, encoding, timeout, headers, end_stream)
            return
        if grpc_error == "true" and method.streaming:
            method = with_arguments(method, grpc_error=True)
        self._start_call(stream, method, encoding, timeout, end_stream)

    def _on_configured_request(
        self, stream: Stream, path: str, encoding: str, timeout: str, headers: list[tuple[str, str]], end_stream: bool
    ) -> None:
        """A call to a method that tritonserver's flags apply to: kept off the path of the plain calls."""
        configured = self.server.configured.get(path)
        if configured is None:
            self.send(stream, (HEADERS, _status_block(_UNIMPLEMENTED, f"Method not found: {path}", True), True))
            return
        if configured.header and configured.required not in headers:
            message = f"This protocol is restricted, expecting header '{configured.header}'"
            self.send(stream, (HEADERS, _status_block(_UNAVAILABLE, message, True), True))
            return
        method = configured.method
        if configured.forward is not None:
            method = with_parameters(method, forwarded_parameters(configured.forward, headers))
        if configured.trace_context:
            context = next((v for k, v in headers if k == "traceparent"), "")
            if context:
                method = with_arguments(method, trace_context=context)
        compression = response_encoding(configured.compression, headers) if configured.compression != "none" else ""
        if method.streaming and (_GRPC_ERROR_HEADER, "true") in headers:
            method = with_arguments(method, grpc_error=True)
        self._start_call(stream, method, encoding, timeout, end_stream, compression)

    def _start_call(
        self, stream: Stream, method: Method, encoding: str, timeout: str, end_stream: bool, compression: str = ""
    ) -> None:
        """A call whose method is known: traced, admitted under --max-inflight-requests, its grpc-timeout armed, a
        streaming call's task started, and a request that came whole with its headers read at once."""
        call = stream.call = _Call(method, encoding)
        if self.tracing.enabled:
            call.trace = FrontendTrace((("GRPC_WAITREAD_START", time.monotonic_ns()),))
        if method.limited and not self._admit(stream, call):
            return
        if timeout:
            self._arm_deadline(stream, call, timeout)
        if compression:
            call.compression = compression
        if method.streaming:
            call.task = self.loop.create_task(self._run_streaming(stream, call))
        if end_stream:
            self.on_request_data(stream, b"", True)

    def _arm_deadline(self, stream: Stream, call: _Call, timeout: str) -> None:
        """The client's grpc-timeout: when it passes, the call (unary or a whole stream) ends with
        DEADLINE_EXCEEDED and its requests are cancelled, queued ones leaving their queue, as in tritonserver."""
        seconds = parse_grpc_timeout(timeout)
        if seconds is not None:
            call.deadline = self.loop.call_later(seconds, self._deadline_passed, stream, call)

    def _deadline_passed(self, stream: Stream, call: _Call) -> None:
        call.deadline = None
        if stream.call is call and stream.id in self.streams:
            self._cancel(stream)
            self._finish_call(stream, DEADLINE_EXCEEDED, DEADLINE_MESSAGE)

    def _admit(self, stream: Stream, call: _Call) -> bool:
        """A place under --max-inflight-requests, or UNAVAILABLE at once."""
        limit = self.server.inflight
        if limit.try_acquire():
            call.admitted = True
            return True
        call.refused = True  # the request's DATA, still to come, is dropped
        self.send(stream, (HEADERS, _status_block(_UNAVAILABLE, limit.error().message, True), True))
        return False

    @staticmethod
    def _leave(call: _Call | None, limit: Any) -> None:
        if call is not None and call.admitted:
            call.admitted = False
            limit.release()

    def _free(self, call: _Call, size: int) -> None:
        """Give back `size` of the bytes the call reserved (never more than it still holds: a message parsed after
        its call ended gave its bytes back with the call)."""
        size = min(size, call.reserved)
        call.reserved -= size
        self.memory.release(size)

    def _refuse_memory(self, stream: Stream, call: _Call, size: int) -> None:
        """No room under --request-memory-limit for a message of `size` reserved bytes: RESOURCE_EXHAUSTED in a
        trailers-only response before the message is buffered; the rest of it is dropped as it arrives (the
        connection's window is still topped up, so the other streams flow on)."""
        call.refused = True
        call.chunks.clear()
        call.buffer.clear()
        self._cancel(stream)
        error = self.memory.error(size)
        self._finish_call(stream, status_code(error), error.message)

    def on_request_data(self, stream: Stream, data: bytes, end_stream: bool) -> None:
        call: _Call | None = stream.call
        if call is None or call.refused:
            return
        if call.messages is None:  # unary: the request is complete when the client half-closes
            if data:
                if not call.chunks and len(data) >= 5:
                    # The declared length is checked before anything is buffered (gRPC's max receive size), and the
                    # message's bytes are reserved whole (--request-memory-limit), so an admitted call can finish.
                    declared = int.from_bytes(data[1:5], "big")
                    if declared > self.max_receive:
                        self._refuse_message(stream, call, declared)
                        return
                    need = (declared + 5) * GRPC_DECODE_FACTOR
                    memory = self.memory  # memory.try_reserve(need), inline: this runs for every call
                    held = memory.held + need
                    if held > (memory.limit if need <= memory.small_size else memory.large_limit):
                        memory.refused += 1
                        self._refuse_memory(stream, call, need)
                        return
                    memory.held = held
                    call.reserved = need
                call.received += len(data)
                if call.received > self.max_receive + 5:
                    self._refuse_message(stream, call, call.received - 5)
                    return
                if call.received * GRPC_DECODE_FACTOR > call.reserved:
                    # More than the prefix declared, or a prefix split across frames: reserved as it arrives.
                    need = call.received * GRPC_DECODE_FACTOR - call.reserved
                    if not self.memory.try_reserve(need):
                        self._refuse_memory(stream, call, need)
                        return
                    call.reserved += need
                call.chunks.append(data)
            if end_stream:
                self._start_unary(stream, call)
            return
        buffer = call.buffer
        buffer += data  # a bytearray: a big message arriving in many frames is not copied again per frame
        pos = 0
        while len(buffer) - pos >= 5:
            declared = int.from_bytes(buffer[pos + 1 : pos + 5], "big")
            if declared > self.max_receive:
                buffer.clear()
                self._refuse_message(stream, call, declared)
                return
            if not call.head_reserved:  # each message's bytes, from its prefix until the service parsed it
                need = (declared + 5) * GRPC_DECODE_FACTOR
                if not self.memory.try_reserve(need):
                    self._refuse_memory(stream, call, need)
                    return
                call.reserved += need
                call.head_reserved = True
            end = pos + 5 + declared
            if end > len(buffer):
                break
            call.head_reserved = False
            call.messages.put_nowait((buffer[pos], bytes(buffer[pos + 5 : end])))
            pos = end
        del buffer[:pos]
        if end_stream:
            call.messages.put_nowait(_END_OF_REQUESTS)

    def _refuse_message(self, stream: Stream, call: _Call, size: int) -> None:
        """A request message over --grpc-max-receive-message-size: RESOURCE_EXHAUSTED, as gRPC says it, and
        the rest of the message is dropped as it arrives."""
        call.refused = True
        call.chunks.clear()
        self._cancel(stream)
        self._finish_call(stream, _RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {self.max_receive})")

    def _start_unary(self, stream: Stream, call: _Call) -> None:
        body = call.chunks[0] if len(call.chunks) == 1 else b"".join(call.chunks)
        call.chunks.clear()  # the frames are in `body` now: not held twice while the request runs
        if len(body) < 5 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
            self._finish_call(stream, _INTERNAL, "a unary method needs exactly one whole request message")
            return
        if call.trace is not None:  # traced: the coroutine path, which hands the stamps to the service
            call.trace.stamps.append(("GRPC_WAITREAD_END", time.monotonic_ns()))
            call.task = self.loop.create_task(self._run_traced_unary(stream, call, body[0], body[5:]))
            return
        if call.method.start is not None and self._start_direct(stream, call, body[0], body[5:]):
            return
        call.task = self.loop.create_task(self._run_unary(stream, call, body[0], body[5:]))

    def _start_direct(self, stream: Stream, call: _Call, compressed: int, payload: bytes) -> bool:
        """Run a unary call through its method's task-free path; False when it wants the coroutine instead."""
        assert call.method.start is not None
        try:
            payload = self._inflate(call, compressed, payload)
            request = self._parse(call, 0, payload)
            # The payload too: a repeated request header is decoded once (core/decode_plan.py).
            call.started = call.method.start(
                request, lambda result: self._finish_direct(stream, result), payload=payload
            )
        except Exception as exc:
            self._fail(stream, exc)
            return True
        return call.started is not None

    def _finish_direct(self, stream: Stream, result: Any) -> None:
        if stream.id not in self.streams:
            return  # the client reset the stream or went away
        try:
            if isinstance(result, NereidError):
                raise result
            payload = result.SerializeToString()
        except Exception as exc:
            self._fail(stream, exc)
            return
        self._reply(stream, payload)

    def _parse(self, call: _Call, compressed: int, payload: bytes) -> Any:
        payload = self._inflate(call, compressed, payload)
        try:
            return call.method.parse(payload)
        except Exception as exc:  # a malformed protobuf
            raise Abort(_INTERNAL, f"failed to parse request message: {exc}") from None

    def _inflate(self, call: _Call, compressed: int, payload: bytes) -> bytes:
        if compressed:
            if call.encoding not in ("gzip", "deflate"):
                raise Abort(_UNIMPLEMENTED, f"message compressed with unsupported encoding '{call.encoding}'")
            # Decompressed no further than the limit: a small compressed message cannot become a huge one.
            inflater = zlib.decompressobj(31 if call.encoding == "gzip" else 15)
            payload = inflater.decompress(payload, self.max_receive + 1)
            if len(payload) > self.max_receive:
                raise Abort(_RESOURCE_EXHAUSTED, f"Received message larger than max ({len(payload)}+ vs. {self.max_receive})")
            # The inflated message counts too (a small compressed one can become a large one), held with the call's.
            need = len(payload) * GRPC_DECODE_FACTOR
            if not self.memory.try_reserve(need):
                error = self.memory.error(need)
                raise Abort(status_code(error), error.message)
            call.reserved += need
        return payload

    async def _run_unary(self, stream: Stream, call: _Call, compressed: int, payload: bytes) -> None:
        # A cancelled task (the client reset the stream) just ends: there is no one left to answer.
        try:
            request = self._parse(call, compressed, payload)
            response = await call.method.handler(request, _CONTEXT)
            payload = response.SerializeToString()
        except Exception as exc:
            self._fail(stream, exc)
            return
        self._reply(stream, payload)

    async def _run_traced_unary(self, stream: Stream, call: _Call, compressed: int, payload: bytes) -> None:
        """_run_unary for a call that arrived while tracing was on: the send is stamped on the request's trace
        (when the server sampled it), which is then released to be written."""
        held = call.trace
        assert held is not None
        try:
            request = self._parse(call, compressed, payload)
            response = await call.method.handler(request, TracedContext(held))
            payload = response.SerializeToString()
        except Exception as exc:
            self._stamped(held, functools.partial(self._fail, stream, exc))
            return
        self._stamped(held, functools.partial(self._reply, stream, payload))

    def _stamped(self, held: FrontendTrace, send: Callable[[], None]) -> None:
        trace = held.trace
        if trace is None:
            send()
            return
        trace.stamp("GRPC_SEND_START")
        send()
        trace.stamp("GRPC_SEND_END")
        self.tracer.release(trace)

    async def _run_streaming(self, stream: Stream, call: _Call) -> None:
        try:
            context = TracedContext() if call.trace is not None else _CONTEXT
            responses = call.method.handler(self._requests(call, context), context)
            async for response in responses:
                payload = response.SerializeToString()
                if len(payload) > self.max_send and self._too_large_to_send(stream, payload):
                    return
                self._send_message(stream, call, payload)
                await self.flushed(stream)
        except Exception as exc:
            self._fail(stream, exc)
            return
        self._finish_call(stream, _OK, "")

    def _too_large_to_send(self, stream: Stream, payload: bytes) -> bool:
        if len(payload) <= self.max_send:
            return False
        self._finish_call(stream, _RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(payload)} vs. {self.max_send})")
        return True

    def _reply(self, stream: Stream, payload: bytes) -> None:
        """A unary call's whole answer, in one write when the windows allow."""
        if len(payload) > self.max_send and self._too_large_to_send(stream, payload):
            return
        call = stream.call
        if call.admitted:
            self._leave(call, self.server.inflight)
        if call.reserved:
            self.memory.held -= call.reserved  # memory.release, inline: this runs for every call
            call.reserved = 0
        if call.deadline is not None:
            call.deadline.cancel()
            call.deadline = None
        compression = call.compression
        if compression:
            head, body = _ENCODED_RESPONSE_HEADERS[compression], _compressed_message(payload, compression)
        else:
            head, body = _RESPONSE_HEADERS, _message(payload)
        self.send(stream, (HEADERS, head, False), (DATA, body, False), (HEADERS, _TRAILERS_OK, True))

    def _fail(self, stream: Stream, exc: Exception) -> None:
        """End a call with the status an exception stands for: its own, the NereidError's, or UNKNOWN for a bug."""
        if isinstance(exc, Abort):
            self._finish_call(stream, exc.code, exc.message)
        elif isinstance(exc, NereidError):
            self._finish_call(stream, status_code(exc), exc.message)
        else:
            log.error("gRPC call failed", exc_info=exc)
            self._finish_call(stream, _UNKNOWN, f"Unexpected error: {exc}")

    async def _requests(self, call: _Call, context: CallContext) -> AsyncIterator[Any]:
        assert call.messages is not None
        traced = context if isinstance(context, TracedContext) else None
        while True:
            start = time.monotonic_ns() if traced is not None else 0
            item = await call.messages.get()
            if item is _END_OF_REQUESTS:
                return
            if traced is not None:  # read by the service as soon as it has this message
                traced.waited = (start, time.monotonic_ns())
            held = call.reserved
            request = self._parse(call, *item)
            # Parsed: the message's bytes can go, and those it inflated into.
            self._free(call, (len(item[1]) + 5) * GRPC_DECODE_FACTOR + call.reserved - held)
            yield request

    def _send_message(self, stream: Stream, call: _Call, payload: bytes) -> None:
        body = _compressed_message(payload, call.compression) if call.compression else _message(payload)
        if call.headers_sent:
            self.send(stream, (DATA, body, False))
        else:
            call.headers_sent = True
            head = _ENCODED_RESPONSE_HEADERS[call.compression] if call.compression else _RESPONSE_HEADERS
            self.send(stream, (HEADERS, head, False), (DATA, body, False))

    def _finish_call(self, stream: Stream, code: int, message: str) -> None:
        call: _Call | None = stream.call
        if call is not None:
            if call.admitted:
                self._leave(call, self.server.inflight)
            if call.reserved:
                self._free(call, call.reserved)
            if call.deadline is not None:
                call.deadline.cancel()
                call.deadline = None
        headers_sent = call is not None and call.headers_sent
        if code == _OK:
            block = _TRAILERS_OK if headers_sent else _status_block(_OK, "", True)
        else:
            block = _status_block(code, message, not headers_sent)
        self.send(stream, (HEADERS, block, True))


class GrpcServer:
    def __init__(self, server: Server) -> None:
        settings = server.settings
        methods = {
            **method_table(InferenceService(server), pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], pb),
            **method_table(HealthService(), health_pb2.DESCRIPTOR.services_by_name["Health"], health_pb2),
            **rollout_methods(server, abort),
        }
        # Methods that flags apply to leave the plain table, so a plain call pays nothing for the flags.
        self.configured = configure_methods(methods, settings)
        self.methods = {path: method for path, method in methods.items() if path not in self.configured}
        self.options = settings.grpc_options
        self.limits = settings.limits
        self.inflight = server.inflight  # --max-inflight-requests, shared with the HTTP port
        self.request_memory = server.request_memory  # --request-memory-limit, shared with the HTTP ports
        self.reuse_port = settings.reuse_grpc_port
        self.tracer = server.tracer
        self.connections: set[GrpcConnection] = set()
        self.connections_refused = 0  # new connections closed at --grpc-max-connections
        self.listener: asyncio.Server | None = None
        self.sweeper: asyncio.TimerHandle | None = None

    def _sweep(self) -> None:
        """End unary calls older than the server's default deadline (streams end when their client ends them)."""
        deadline = self.limits.default_request_timeout_secs
        now = time.monotonic()
        message = f"Request timeout expired: over the server's default of {deadline:g} s"
        for connection in list(self.connections):
            if not connection.streams:
                continue  # idle connections cost the sweep one test each
            for stream in list(connection.streams.values()):
                call: _Call | None = stream.call
                if call is not None and not call.method.streaming and now - call.born > deadline:
                    connection._cancel(stream)
                    connection._finish_call(stream, _UNAVAILABLE, message)
        self.sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    async def start(self, address: str, port: int, tls: GrpcTls | None = None) -> None:
        loop = asyncio.get_running_loop()
        if self.limits.default_request_timeout_secs > 0:
            self.sweeper = loop.call_later(1.0, self._sweep)
        self.listener = await loop.create_server(
            lambda: GrpcConnection(self),
            address,
            port,
            backlog=4096,
            reuse_address=True,
            reuse_port=self.reuse_port or None,  # --reuse-grpc-port: several servers share the port
            ssl=_ssl_context(tls),
        )

    async def stop(self, grace: float) -> None:
        """GOAWAY to every client, let running calls finish for up to `grace` seconds, then close."""
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.listener is not None:
            self.listener.close()
        for connection in list(self.connections):
            connection.go_away()
        deadline = asyncio.get_running_loop().time() + grace
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.close()


def _ssl_context(tls: GrpcTls | None) -> ssl.SSLContext | None:
    """TLS as Triton's --grpc-use-ssl(-mutual) sets it up; ALPN offers h2, which gRPC clients require."""
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.server_cert, tls.server_key)
    if tls.mutual:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls.root_cert)
    context.set_alpn_protocols(["h2"])
    return context


async def start_grpc_server(server: Server, address: str, port: int, tls: GrpcTls | None = None) -> GrpcServer:
    grpc_server = GrpcServer(server)
    await grpc_server.start(address, port, tls)
    return grpc_server
