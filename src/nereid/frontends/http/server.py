"""A lean HTTP/1.1 server for the inference port: httptools parsing on an asyncio Protocol, calling the ASGI
app with one task per request and one write per response. It does what uvicorn does for this app with
less per-request work, and it tells the app when a client disconnects without a watcher task.

It also holds the port against hostile clients (see docs/security.md): bodies over --http-max-input-size are
refused before they are read, header blocks and pipelined queues are bounded, a client that stops reading
pauses its producer, and slow or idle connections time out. Each limit is a counter on a path the data
already takes; one sweep a second checks the timeouts of all connections."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

import httptools

from nereid.core.admission import InflightLimit
from nereid.core.errors import NereidError, http_status
from nereid.core.request_memory import JSON_DECODE_FACTOR, RequestMemoryBudget, body_reservation
from nereid.core.settings import TransportLimits
from nereid.frontends.http.app_switches import DirectInferApp, HeaderCaseApp, TracingApp
from nereid.frontends.http.asgi_exchange import Exchange
from nereid.frontends.http.body import body_too_large
from nereid.frontends.http.direct_call import DirectCall
from nereid.frontends.http.flow_control import FlowControl
from nereid.frontends.http.parsed_request import ParsedRequest, RawHeaders
from nereid.frontends.http.reply import error_response

__all__ = ["HttpServer", "DISCONNECT_KEY", "RECEIVED_KEY", "REQUEST_MEMORY_KEY"]

log = logging.getLogger("nereid.http")

# The scope key holding a future that completes when the client's connection is lost.
DISCONNECT_KEY = "nereid.disconnected"
# The scope key holding (first byte, whole request) monotonic ns, present only while the app's `tracing` flag is on.
RECEIVED_KEY = "nereid.received"
# The scope key holding the connection, whose `reserve_decoded(size)` adds what the app decodes a body into (a
# Content-Encoding body inflated) to the request's bytes under --request-memory-limit: an error, or None when it fits.
REQUEST_MEMORY_KEY = "nereid.request_memory"

_SWEEP_SECS = 1.0  # how often the timeouts of each connection are checked
_SWEEP_SLICES = 10  # ... in this many slices, so thousands of connections never stall the loop at once
_PIPELINE_SLICE = 4096  # bytes fed to the parser at a time while requests are queued on a connection
# Requests that count against --max-inflight-requests: inference, generate and the OpenAI-compatible API.
_LIMITED_PATHS = ("/infer", "/generate", "/generate_stream", "/completions", "/embeddings")
# Streams are held to the server's default deadline only until their first response: a long generation is not
# cut short, but one that never starts does not wait forever.
_STREAMING_PATHS = ("/generate_stream", "/completions")
_LINGER_SECS = 2.0  # how long a refused client's bytes are dropped before its connection is closed
# Bodies up to this size reserve three times their length under --request-memory-limit whatever they hold (JSON or
# binary tensors): reading Inference-Header-Content-Length for them would cost every request more than it saves.
_SMALL_BODY = 64 * 1024
# Triton's kMaxChunkedChunks: a chunked body of more chunks is refused (with the size-0 chunk that ends it, one more
# chunk header than this is allowed).
MAX_CHUNKS = 65536


# What a lost connection's parser and response callback become (see connection_lost): they reach nothing.
_CLOSED_PARSER = httptools.HttpRequestParser(object())


def _after_closed(keep_alive: bool) -> None:
    pass


class _Refusal(Exception):
    """A request the transport answers itself (status and text) and then closes the connection."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _Connection(asyncio.Protocol):
    # Slots: a connection is made per accept, thousands may be open, and their fields are read on every request.
    __slots__ = (
        "app", "server", "loop", "transport", "parser", "url", "headers", "body_parts", "waiting", "busy", "lost",
        "max_body", "max_header_size", "max_waiting", "in_headers", "idle", "since", "last_read", "header_bytes",
        "began", "body_size", "body_left", "reading_paused", "eof", "flow", "current",
        "started_at", "task", "exchange", "lingering", "refusing", "held", "evictable", "tracing",
        "receive_start", "direct", "direct_call", "on_response", "memory", "arriving", "body_factor", "chunks",
    )

    def __init__(self, app: Any, server: HttpServer) -> None:
        self.app = app
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_parts: list[bytes] = []
        # Pipelined requests, in order; a refusal waits its turn among them.
        self.waiting: collections.deque[ParsedRequest | _Refusal] = collections.deque()
        self.busy = False
        self.lost: asyncio.Future[None] = self.loop.create_future()
        # The app's tracing switch (an object with `enabled`): receive times are taken only while it is on.
        self.tracing = server.tracing
        self.receive_start = 0
        self.direct = server.direct_infer  # the app's task-free /infer, or None
        self.direct_call: DirectCall | None = None  # the /infer answered through it, until its response is done
        self.on_response = self.after_response  # what each direct call reports to: bound once, not per request
        limits = server.limits
        self.max_body = server.max_input_size
        self.max_header_size = limits.http_max_header_size
        self.max_waiting = limits.http_max_pipelined_requests
        # Where the connection stands, for the timeout sweep: reading headers (since `since`), idle between
        # requests (since `since`), or neither (a body arriving or a request running).
        self.in_headers = True
        self.idle = False
        self.since = self.loop.time()
        self.last_read = self.since
        self.header_bytes = 0  # bytes of the header block being read, counted per read, past its first
        self.began = False  # a message began during this read: its bytes are not all the header block's
        self.body_size = 0
        self.body_left = 0
        self.chunks = 0
        self.reading_paused = False
        self.eof = False  # the client half-closed: answer what it sent, then close
        self.flow = FlowControl(self.loop)  # the write side's back-pressure, shared with the responses
        # The running request, for the server's default deadline (--default-request-timeout-secs).
        self.current: ParsedRequest | None = None
        self.started_at = 0.0
        self.task: asyncio.Task[None] | None = None
        self.exchange: Exchange | None = None
        self.lingering = False
        self.refusing = False
        self.held: bytes | None = None  # the rest of a read, while the pipelined queue is full
        # --request-memory-limit: bytes reserved for the message arriving (handed to its request when complete),
        # and, for a body of undeclared length, what each byte of it reserves as it arrives (0: declared up front).
        self.memory = server.request_memory
        self.arriving = 0
        self.body_factor = 0
        self.evictable = False  # in the server's idle_connections: no request running, queued or arriving

    # -- transport events ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        if len(server.connections) >= server.limits.http_max_connections and not server.make_room():
            self.refusing = True  # over --http-max-connections with none idle: closed before anything is read
            transport.close()
            return
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=server.limits.http_write_buffer_size)  # type: ignore[union-attr]
        server.connections.add(self)
        self.evictable = True
        server.idle_connections[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.evictable:
            self.evictable = False
            self.server.idle_connections.pop(self, None)
        if not self.lost.done():
            self.lost.set_result(None)
        # What the lost client reserved: the body it was sending, and requests queued that will not run. A running
        # request gives its bytes back when it ends (an abandoned direct call ends here: it leaves its queue).
        self._release_arriving()
        self.body_parts = []
        for request in self.waiting:
            if isinstance(request, ParsedRequest):
                self._release(request)
        call = self.direct_call
        if call is not None:
            self.direct_call = None
            if self.current is not None:
                self._release(self.current)
            call.abandon()
        self.waiting.clear()
        self.transport = None
        # The parser (the target of its callbacks) and on_response (a bound method) point back at this connection.
        # Dropping both lets reference counting free it now, not the cyclic collector, which the server runs rarely
        # (serve.py): a client that opens a connection per request would otherwise leave a few kB behind each.
        self.parser = _CLOSED_PARSER
        self.on_response = _after_closed
        self.flow.resume_writing()

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def eof_received(self) -> bool | None:
        # A client that closes its side is taken as gone, as uvicorn takes it: the connection closes and its lost
        # future cancels what it still has queued or running, so a client that gave up costs no compute. (A
        # half-close cannot be told from a close until a write fails, and cancelling is what protects the server.)
        self.eof = True
        return None

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if self.lingering or self.refusing:
            return  # after a refusal: what the client still sends is dropped until it reads our answer
        size = len(data)
        if size <= _PIPELINE_SLICE:
            self._feed(data)
            return
        # Fed in slices (a body of known length in one), so that one read of many small pipelined requests
        # stops at the queue bound too; the rest of the read waits here, the socket paused, until it drains.
        pos = 0
        while pos < size:
            step = self.body_left if self.body_left > _PIPELINE_SLICE else _PIPELINE_SLICE
            self._feed(data if pos == 0 and step >= size else data[pos : pos + step])
            pos += step
            if self.transport is None or self.lingering or self.refusing:
                return
            if self.reading_paused and pos < size:
                self.held = data[pos:]
                return

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            refusal = exc.__context__ if isinstance(exc.__context__, _Refusal) else None
            if refusal is None:
                refusal = _Refusal(400, "Bad Request")
            # The refusal's traceback holds the parser's frames, and so this connection: kept, it would make a
            # cycle that only the cyclic collector frees.
            refusal.__traceback__ = None
            self._refuse(refusal)
            return
        if self.in_headers:
            # A header block that never ends is counted per read (httptools buffers it whole otherwise); the
            # read in which it began is not, as part of it may be an earlier request's.
            if self.began:
                self.began = False
            else:
                self.header_bytes += len(data)
                if self.header_bytes > self.max_header_size:
                    self._refuse(_Refusal(431, self._header_size_text()))

    def _header_size_text(self) -> str:
        return f"request headers exceed the maximum allowed size of {self.max_header_size} bytes"

    def _release(self, request: ParsedRequest) -> None:
        if request.reserved:
            self.memory.release(request.reserved)
            request.reserved = 0
        # The body goes with its reservation (tensors still in use keep it through their own references): a finished
        # request stays referenced by its connection, which only the cyclic collector frees once closed.
        request.body = b""

    def _release_arriving(self) -> None:
        if self.arriving:
            self.memory.release(self.arriving)
            self.arriving = 0

    def _refuse(self, refusal: _Refusal) -> None:
        """Answer `refusal` after the requests already queued, and read nothing more from this client."""
        self._release_arriving()  # the body it was reserved for will not be read
        self.in_headers = False
        self.refusing = True
        self.held = None
        if self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        if self.busy:
            self.waiting.append(refusal)
        else:
            self._write_refusal(refusal)
            self._linger()

    def _linger(self) -> None:
        """Close after a refusal the way a well-kept server does: end our side, then drop what the client still
        sends for a moment, so that closing with unread bytes (a TCP reset) does not destroy our answer."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.lingering = True
        self.since = self.loop.time()
        if transport.can_write_eof():
            transport.write_eof()
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- parser callbacks ---------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body_parts = []
        if self.tracing is not None and self.tracing.enabled:
            self.receive_start = time.monotonic_ns()
        self._begin()

    def _begin(self) -> None:
        self.in_headers = True
        self.began = True
        self.idle = False
        self.since = self.loop.time()
        self.header_bytes = 0
        self.body_size = 0
        self.body_left = 0  # bytes of a declared body still to come: fed to the parser in one piece
        self.chunks = 0

    def on_chunk_header(self) -> None:
        self.chunks += 1
        if self.chunks > MAX_CHUNKS + 1:  # the last one counted is the size-0 chunk that ends the body
            raise _Refusal(400, f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. Send fewer or larger HTTP chunks.")

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.max_header_size:
            raise _Refusal(414, f"request URL exceeds the maximum allowed size of {self.max_header_size} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.in_headers = False
        if self.evictable:  # a request is coming: this connection is no longer the first to close for a new one
            self.evictable = False
            self.server.idle_connections.pop(self, None)
        headers = self.headers
        if len(headers) > self.server.limits.http_max_header_count:
            raise _Refusal(431, f"request has {len(headers)} headers, more than the {self.server.limits.http_max_header_count} allowed")
        size = len(self.url)
        declared = expect_continue = False
        for name, value in headers:
            size += len(name) + len(value)
            if name == b"content-length":
                # Refused before the body is read, and before a 100 Continue invites it.
                if value.isdigit():
                    declared = True
                    self.body_left = int(value)
                    if self.body_left > self.max_body:  # a 400, as tritonserver answers once it has read it all
                        raise _Refusal(400, body_too_large(self.body_left, self.max_body, self._json_header()))
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        if size > self.max_header_size:
            raise _Refusal(431, self._header_size_text())
        # The body's bytes under --request-memory-limit, before any is read (and before a 100 Continue invites it):
        # a declared body at once, what it decodes into included (JSON's numbers become arrays; binary tensors are
        # views on the body); a chunked one as it arrives (on_body). Refused with 503, and the connection closed,
        # when they do not fit. A small body is counted as JSON whatever it holds: its headers are not read twice.
        length = self.body_left
        if declared and length <= _SMALL_BODY:
            self.body_factor = 0
            if length:
                # memory.try_reserve(need), inline: this runs for every request with a body.
                need = JSON_DECODE_FACTOR * length
                memory = self.memory
                held = memory.held + need
                if held > (memory.limit if need <= memory.small_size else memory.large_limit):
                    memory.refused += 1
                    self._refuse_memory(need)
                memory.held = held
                self.arriving = need
        else:
            self._reserve_large(declared, length)
        if expect_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _json_header(self) -> int:
        """Inference-Header-Content-Length as a number, -1 where it is missing or not one."""
        for name, value in self.headers:
            if name == b"inference-header-content-length" and value.isdigit():
                return int(value)
        return -1

    def _reserve_large(self, declared: bool, length: int) -> None:
        """A large declared body reserves what body_reservation says, its JSON part as Inference-Header-Content-Length
        gives it; a body of undeclared length reserves its bytes as they arrive (on_body), and its JSON header's
        decoded share at once."""
        json_header = -1
        for name, value in self.headers:
            if name == b"inference-header-content-length" and value.isdigit():
                json_header = int(value)
        if declared:
            self.body_factor = 0
            need = body_reservation(length, json_header)
        else:
            self.body_factor = JSON_DECODE_FACTOR if json_header < 0 else 1
            need = (JSON_DECODE_FACTOR - 1) * json_header if json_header > 0 else 0
        if need:
            if not self.memory.try_reserve(need):
                self._refuse_memory(need)
            self.arriving = need

    def _refuse_memory(self, need: int) -> None:
        error = self.memory.error(need)
        raise _Refusal(http_status(error.status), error.message)

    def reserve_decoded(self, size: int) -> NereidError | None:
        """`size` more bytes for the running request (the app inflated its body): held until it ends, or the error
        that refuses them."""
        request = self.current
        if request is None or self.memory.try_reserve(size):
            if request is not None:
                request.reserved += size
            return None
        return self.memory.error(size)

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)  # a chunked body is counted as it arrives
        if self.body_factor:
            need = len(body) * self.body_factor
            if not self.memory.try_reserve(need):
                self._refuse_memory(need)
            self.arriving += need
        self.body_left -= len(body)
        if self.body_size > self.max_body:
            raise _Refusal(400, body_too_large(self.body_size, self.max_body, self._json_header()))
        self.body_parts.append(body)

    def on_message_complete(self) -> None:
        parts = self.body_parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()  # not held beside the body while the request runs, nor after it on an idle connection
        request = ParsedRequest(
            self.parser.get_method().decode("ascii"),
            self.url,
            self.headers,
            body,
            self.parser.should_keep_alive(),
            self.parser.get_http_version(),
        )
        request.reserved, self.arriving = self.arriving, 0
        if self.receive_start:
            request.received = (self.receive_start, time.monotonic_ns())
            self.receive_start = 0
        if self.busy:
            self.waiting.append(request)  # HTTP/1.1 answers pipelined requests in order
            if len(self.waiting) >= self.max_waiting and not self.reading_paused and self.transport is not None:
                self.transport.pause_reading()  # the client waits in its own socket buffer, not in our memory
                self.reading_paused = True
        else:
            self._start(request)

    # -- running the app ------------------------------------------------------------------------------------
    def _start(self, request: ParsedRequest) -> None:
        self.busy = True
        self.current = request
        self.started_at = self.loop.time()
        self.task = None
        transport = self.transport
        assert transport is not None  # a request starts on a live connection only
        if (
            self.direct is not None
            and request.method == "POST"
            and request.received is None
            and request.path.endswith("/infer")
            and self._start_direct(request, transport)
        ):
            return  # (an answer given at once may already have started the next pipelined request)
        exchange = self.exchange = Exchange(request, transport, self.flow, self.lost)
        self.task = self.loop.create_task(self._run(request, exchange))

    def _start_direct(self, request: ParsedRequest, transport: asyncio.WriteTransport) -> bool:
        """An inference through the app's task-free path: no task, no ASGI messages, the response written from the
        scheduler's callback. False: the app wants the ASGI call for this request (nothing was answered)."""
        limit = self.server.inflight
        if limit is not None and not limit.try_acquire():
            return False  # the ASGI call answers the 503
        call = self.direct_call = DirectCall(transport, self.flow, request.keep_alive, self.on_response, limit)
        assert self.direct is not None
        try:
            call.handle = self.direct(request.path, request.headers, request.body, call.answer)
        except Exception:  # a bug: answered as the ASGI call answers it
            log.exception("unhandled error for %s %s", request.method, request.path)
            call.keep_alive = False
            call.answer(500, [(b"content-type", b"text/plain")], b"Internal Server Error")
            return True
        if call.handle is None and not call.answered:
            self.direct_call = None
            call.release()
            return False
        return True

    async def _run(self, request: ParsedRequest, exchange: Exchange) -> None:
        limit = self.server.inflight
        try:
            if limit is None or not request.path.endswith(_LIMITED_PATHS):
                await exchange.run(self.app, self._scope(request))
            elif not limit.try_acquire():
                if self.transport is not None:
                    self.transport.write(error_response(503, limit.error().message, request.keep_alive))
            else:
                try:
                    await exchange.run(self.app, self._scope(request))
                finally:
                    limit.release()
        finally:
            self._release(request)  # (after_response does too; this covers a task cancelled with the server)
        self.after_response(exchange.keep_alive)

    def _scope(self, request: ParsedRequest) -> dict[str, Any]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": request.version,
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode("latin-1"),
            "query_string": request.query,
            "headers": request.headers,
            DISCONNECT_KEY: self.lost,
            REQUEST_MEMORY_KEY: self,
        }
        if request.received is not None:
            scope[RECEIVED_KEY] = request.received
        return scope

    def after_response(self, keep_alive: bool) -> None:
        """The next pipelined request, or an idle connection, once a response is done."""
        self.direct_call = None
        request = self.current
        if request is not None:  # _release(request), inline: this runs for every request
            if request.reserved:
                self.memory.held -= request.reserved
                request.reserved = 0
            request.body = b""
        if not keep_alive or self.server.should_exit or self.transport is None:
            self.close()  # (no transport: the client is gone, and so are the requests it queued)
            return
        if self.waiting:
            following = self.waiting.popleft()
            if isinstance(following, _Refusal):
                self._write_refusal(following)
                self._linger()
                return
            if self.reading_paused and len(self.waiting) <= self.max_waiting // 2 and self.transport is not None:
                self.reading_paused = False
                held, self.held = self.held, None
                if held:
                    self.data_received(held)  # may fill the queue (and pause) again
                if not self.reading_paused and self.transport is not None and not self.refusing:
                    self.transport.resume_reading()
            self._start(following)
        else:
            self.busy = False
            if self.eof:
                self.close()
                return
            if not self.in_headers:
                self.idle = True
                self.since = self.loop.time()
            if not self.evictable:
                self.evictable = True
                self.server.idle_connections[self] = None  # the newest idle one: closed last for a new one

    def check_timeouts(self, now: float) -> None:
        """Called by the server's sweep: end a connection whose headers are too slow, that sits idle too
        long, whose body stalls, or whose client stopped reading our answers."""
        limits = self.server.limits
        if self.transport is None:
            return
        deadline = limits.default_request_timeout_secs
        exchange = self.exchange
        if self.direct_call is not None:
            if deadline and now - self.started_at > deadline:
                self.direct_call.expire(deadline)
        elif (
            deadline
            and self.busy
            and self.task is not None
            and exchange is not None
            and not exchange.expired_after
            and now - self.started_at > deadline
            and not (exchange.started and exchange.request.path.endswith(_STREAMING_PATHS))
        ):
            exchange.expire(deadline)
            self.task.cancel()
        if self.lingering:
            if now - self.since > _LINGER_SECS:
                self.transport.abort()
        elif self.flow.drained is not None:
            if now - self.flow.paused_at > limits.http_idle_timeout_secs:
                self.transport.abort()  # a client that never reads: its buffered answer is dropped
        elif self.in_headers and not self.busy:
            if now - self.since > limits.http_header_timeout_secs:
                self._write_refusal(_Refusal(408, "request headers not received in time"))
                self.close()
        elif self.idle:
            if now - self.since > limits.http_idle_timeout_secs:
                self.close()
        elif not self.busy and now - self.last_read > limits.http_idle_timeout_secs:
            self._write_refusal(_Refusal(408, "request body not received in time"))
            self.close()

    def _write_refusal(self, refusal: _Refusal) -> None:
        """A limit's answer, in Triton's error shape: {"error": "..."} as JSON."""
        if self.transport is not None:
            self.transport.write(error_response(refusal.status, refusal.text))


class _RawHeaderConnection(_Connection):
    """A connection that also keeps header names' case; used only when the app asks for it, so the usual
    connection's per-header work stays as it is."""

    __slots__ = ("raw_headers",)

    def on_message_begin(self) -> None:
        self.url = b""
        headers = RawHeaders()
        self.headers = headers
        self.raw_headers = headers.raw
        self.body_parts = []
        if self.tracing is not None and self.tracing.enabled:
            self.receive_start = time.monotonic_ns()
        self._begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self.raw_headers.append((name, value))


class HttpServer:
    """Serves an ASGI app until `should_exit` is set, like uvicorn.Server's serve()."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        backlog: int = 4096,
        reuse_port: bool = False,
        limits: TransportLimits | None = None,
        max_input_size: int = 64 * 1024 * 1024,
        inflight: InflightLimit | None = None,
        request_memory: RequestMemoryBudget | None = None,
    ) -> None:
        self.app = app
        self.inflight = inflight  # --max-inflight-requests, shared with the gRPC port
        self.limits = limits or TransportLimits()
        # --request-memory-limit, shared with the other ports (one of its own when none is given)
        self.request_memory = request_memory or RequestMemoryBudget(self.limits.request_memory_limit)
        self.max_input_size = max_input_size  # --http-max-input-size: the largest request body
        self.host = host
        self.port = port
        self.backlog = backlog
        self.reuse_port = reuse_port  # --reuse-http-port: SO_REUSEPORT, so several servers can share the port
        keeps_case = isinstance(app, HeaderCaseApp) and app.keeps_header_case
        self.connection_class = _RawHeaderConnection if keeps_case else _Connection
        self.tracing: Any = app.tracing if isinstance(app, TracingApp) else None  # connections then time requests
        self.direct_infer = app.start_infer if isinstance(app, DirectInferApp) else None
        self.connections: set[_Connection] = set()
        # Connections with no request running, queued or arriving, the longest idle first: under
        # --http-max-connections the first of them is closed to make room for a new connection.
        self.idle_connections: dict[_Connection, None] = {}
        self.connections_refused = 0  # new connections closed at the limit with none idle, for operators and tests
        self.connections_evicted = 0  # idle connections closed to make room
        self._sweep_batch: list[_Connection] = []
        self._sweep_slice = 1
        self._sweep_cycle = 0.0
        self._exit = asyncio.Event()
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()

    def make_room(self) -> bool:
        """At --http-max-connections: close the longest idle connection for a new one (False: none is idle)."""
        idle = self.idle_connections
        if not idle:
            self.connections_refused += 1
            return False
        oldest = next(iter(idle))
        del idle[oldest]
        oldest.evictable = False
        self.connections.discard(oldest)
        oldest.close()
        self.connections_evicted += 1
        return True

    def _sweep(self) -> None:
        """Check each connection's timeouts once a second, a tenth of them per tick: with thousands of idle
        connections a tick costs a fraction of a millisecond instead of one pause of several."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        batch = self._sweep_batch
        if not batch and now >= self._sweep_cycle:
            self._sweep_cycle = now + _SWEEP_SECS - _SWEEP_SECS / (2 * _SWEEP_SLICES)
            batch = self._sweep_batch = list(self.connections)
            self._sweep_slice = -(-len(batch) // _SWEEP_SLICES)
        for _ in range(min(self._sweep_slice, len(batch))):
            batch.pop().check_timeouts(now)
        self._sweeper = loop.call_later(_SWEEP_SECS / _SWEEP_SLICES, self._sweep)

    async def start(self) -> None:
        """Bind the listening socket (OSError when the address is taken); serve() then serves it."""
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: self.connection_class(self.app, self),
            self.host,
            self.port,
            backlog=self.backlog,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )

    async def serve(self) -> None:
        if self._listener is None:
            await self.start()
        server = self._listener
        assert server is not None
        sweep = asyncio.get_running_loop().call_later(_SWEEP_SECS / _SWEEP_SLICES, self._sweep)
        self._sweeper = sweep
        try:
            await self._exit.wait()
        finally:
            self._sweeper.cancel()
            server.close()
            for connection in list(self.connections):
                if not connection.busy:
                    connection.close()
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                for connection in list(self.connections):
                    connection.close()
