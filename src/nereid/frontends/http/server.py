"""A lean HTTP/1.1 server for the inference port: httptools parsing on an asyncio Protocol, calling the ASGI
app with one task per request and one write per response. It does what uvicorn does for this app with
less per-request work, and it tells the app when a client disconnects without a watcher task."""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import time
from typing import Any

import httptools

__all__ = ["HttpServer", "DISCONNECT_KEY", "RECEIVED_KEY", "RawHeaders"]

log = logging.getLogger("nereid.http")

# The scope key holding a future that completes when the client's connection is lost.
DISCONNECT_KEY = "nereid.disconnected"
# The scope key holding (first byte, whole request) monotonic ns, present only while the app's `tracing` flag is on.
RECEIVED_KEY = "nereid.received"

_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
_REQUEST_DONE = {"type": "http.disconnect"}


class _Request:
    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "version", "received")

    def __init__(self, method: str, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool, version: str) -> None:
        path, _, query = url.partition(b"?")
        self.method = method
        self.path = path.decode("latin-1")
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.version = version
        self.received: tuple[int, int] | None = None


class RawHeaders(list[tuple[bytes, bytes]]):
    """The ASGI header list (lowercased names) that also keeps each header as the client spelled it in `raw`:
    --http-header-forward-pattern forwards names unchanged, as Triton does."""

    __slots__ = ("raw",)

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[tuple[bytes, bytes]] = []


class _Connection(asyncio.Protocol):
    def __init__(self, app: Any, server: HttpServer) -> None:
        self.app = app
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_parts: list[bytes] = []
        self.waiting: collections.deque[_Request] = collections.deque()
        self.busy = False
        self.lost: asyncio.Future[None] = self.loop.create_future()
        # The app's tracing switch (an object with `enabled`): receive times are taken only while it is on.
        self.tracing = server.tracing
        self.receive_start = 0

    # -- transport events ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write_simple(400, b"Bad Request")
            self.close()

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

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        for name, value in self.headers:
            if name == b"expect" and value.lower() == b"100-continue" and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_parts.append(body)

    def on_message_complete(self) -> None:
        parts = self.body_parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        request = _Request(
            self.parser.get_method().decode("ascii"),
            self.url,
            self.headers,
            body,
            self.parser.should_keep_alive(),
            self.parser.get_http_version(),
        )
        if self.receive_start:
            request.received = (self.receive_start, time.monotonic_ns())
            self.receive_start = 0
        if self.busy:
            self.waiting.append(request)  # HTTP/1.1 answers pipelined requests in order
        else:
            self._start(request)

    # -- running the app ------------------------------------------------------------------------------------
    def _start(self, request: _Request) -> None:
        self.busy = True
        self.loop.create_task(self._run(request))

    async def _run(self, request: _Request) -> None:
        exchange = _Exchange(self, request)
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
        }
        if request.received is not None:
            scope[RECEIVED_KEY] = request.received
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except Exception:
            log.exception("unhandled error for %s %s", request.method, request.path)
            if not exchange.started:
                exchange.keep_alive = False
                self._write_simple(500, b"Internal Server Error")
        if not exchange.finished and exchange.started:
            exchange.keep_alive = False  # a response that never ended cannot be followed on this connection
        if not exchange.keep_alive or self.server.should_exit:
            self.close()
            return
        if self.waiting:
            self._start(self.waiting.popleft())
        else:
            self.busy = False

    def _write_simple(self, status: int, text: bytes) -> None:
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                % (status, _REASONS.get(status, b""), len(text), text)
            )


class _RawHeaderConnection(_Connection):
    """A connection that also keeps header names' case; used only when the app asks for it, so the usual
    connection's per-header work stays as it is."""

    def on_message_begin(self) -> None:
        self.url = b""
        headers = RawHeaders()
        self.headers = headers
        self.raw_headers = headers.raw
        self.body_parts = []
        if self.tracing is not None and self.tracing.enabled:
            self.receive_start = time.monotonic_ns()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self.raw_headers.append((name, value))


class _Exchange:
    """One request's ASGI receive/send pair."""

    __slots__ = ("connection", "request", "keep_alive", "started", "finished", "chunked", "status", "headers", "_body_sent")

    def __init__(self, connection: _Connection, request: _Request) -> None:
        self.connection = connection
        self.request = request
        self.keep_alive = request.keep_alive
        self.started = False
        self.finished = False
        self.chunked = False
        self.status = 200
        self.headers: list[tuple[bytes, bytes]] = []
        self._body_sent = False

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.request.body, "more_body": False}
        if not self.finished:
            await asyncio.shield(self.connection.lost)
        return _REQUEST_DONE

    async def send(self, message: dict[str, Any]) -> None:
        transport = self.connection.transport
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body" or self.finished:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if transport is None or transport.is_closing():
            self.finished = not more
            return
        if not self.started:
            self.started = True
            head = [b"HTTP/1.1 %d %s\r\n" % (self.status, _REASONS.get(self.status, b""))]
            has_length = False
            for name, value in self.headers:
                if name.lower() == b"content-length":
                    has_length = True
                head.append(b"%s: %s\r\n" % (name, value))
            if more and not has_length:
                self.chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
            elif not has_length:
                head.append(b"content-length: %d\r\n" % len(body))
            if not self.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            if self.chunked:
                transport.write(b"".join(head) + (b"%x\r\n%s\r\n" % (len(body), body) if body else b""))
            else:
                transport.write(b"".join(head) + body)
        elif self.chunked:
            if body:
                transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        else:
            transport.write(body)
        if not more:
            self.finished = True
            if self.chunked:
                transport.write(b"0\r\n\r\n")


class HttpServer:
    """Serves an ASGI app until `should_exit` is set, like uvicorn.Server's serve()."""

    def __init__(self, app: Any, host: str, port: int, backlog: int = 4096, reuse_port: bool = False) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.backlog = backlog
        self.reuse_port = reuse_port  # --reuse-http-port: SO_REUSEPORT, so several servers can share the port
        # An app that reads header names as sent (HttpApp with a header forward pattern) sets keeps_header_case.
        self.connection_class = _RawHeaderConnection if getattr(app, "keeps_header_case", False) else _Connection
        # An app that traces requests (HttpApp) names its switch `tracing`; connections then time each request.
        self.tracing: Any = getattr(app, "tracing", None)
        self.connections: set[_Connection] = set()
        self._exit = asyncio.Event()
        self._listener: asyncio.Server | None = None

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()

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
        try:
            await self._exit.wait()
        finally:
            server.close()
            for connection in list(self.connections):
                if not connection.busy:
                    connection.close()
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                for connection in list(self.connections):
                    connection.close()
