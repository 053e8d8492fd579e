"""A minimal HTTP/1.1 keep-alive client on asyncio protocols and httptools' C parser: write precomputed request
bytes, await the status. It keeps response bodies only for errors; it is the measured path, so it stays lean."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httptools

__all__ = ["HttpConnection", "HttpConnectionPool", "open_connection"]


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    __slots__ = ("transport", "_parser", "_waiter", "_status", "_error_body", "closed", "_recv_start", "recv_ns")

    def __init__(self) -> None:
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._status = 0
        self._error_body: list[bytes] = []
        self.closed = False
        self._recv_start = 0
        self.recv_ns = 0  # time spent receiving and parsing responses, summed

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if not self._recv_start:
            self._recv_start = time.monotonic_ns()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"the server closed the connection{f' ({exc})' if exc else ''}"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._status != 200:
            self._error_body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self.recv_ns += time.monotonic_ns() - self._recv_start
        self._recv_start = 0
        body = b""
        if self._error_body:
            body = b"".join(self._error_body)
            self._error_body = []
        if not self._parser.should_keep_alive():
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Send one request; the future resolves to (status, error body) or raises ConnectionError."""
        waiter: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(data)
        return waiter

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


async def open_connection(host: str, port: int) -> HttpConnection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(HttpConnection, host, port)
    return protocol


class HttpConnectionPool:
    """Connections for open-loop (request-rate) load: reuse an idle one, open another when all are busy."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[HttpConnection] = []
        self.all: list[HttpConnection] = []

    async def acquire(self) -> HttpConnection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        conn = await open_connection(self.host, self.port)
        self.all.append(conn)
        return conn

    def release(self, conn: HttpConnection) -> None:
        if not conn.closed:
            self._idle.append(conn)
        else:
            try:
                self.all.remove(conn)
            except ValueError:
                pass

    def close(self) -> None:
        for conn in self.all:
            conn.close()
        self.all.clear()
        self._idle.clear()
