"""One HTTP request run through an ASGI app, as uvicorn's RequestResponseCycle runs it: the body once, then the
client's disconnect; the response head and body written as they are sent, chunked when their length is not given,
waiting while the client does not read; and the answer when the app fails or overruns the server's deadline. It
writes through the transport and flow control it is given; it never sees the connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.frontends.http.flow_control import FlowControl
from nereid.frontends.http.parsed_request import ParsedRequest
from nereid.frontends.http.reply import INTERNAL_ERROR_RESPONSE, deadline_text, error_response, status_line

__all__ = ["Exchange"]

log = logging.getLogger("nereid.http")

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]

_REQUEST_DONE = {"type": "http.disconnect"}


class Exchange:
    """One request's ASGI receive/send pair. After `run`, `keep_alive` says whether the connection may serve another
    request (not when the response was cut short); `started` whether any of the response was written."""

    __slots__ = (
        "request", "transport", "flow", "lost", "keep_alive", "started", "finished", "chunked", "status", "headers",
        "_body_sent", "expired_after",
    )  # fmt: skip

    def __init__(
        self, request: ParsedRequest, transport: asyncio.WriteTransport, flow: FlowControl, lost: asyncio.Future[None]
    ) -> None:
        self.request = request
        self.transport = transport
        self.flow = flow
        self.lost = lost  # completes when the client's connection is lost
        self.keep_alive = request.keep_alive
        self.started = False
        self.finished = False
        self.chunked = False
        self.status = 200
        self.headers: list[tuple[bytes, bytes]] = []
        self._body_sent = False
        self.expired_after = 0.0  # the server's default deadline, once the request overran it

    def expire(self, deadline: float) -> None:
        """The request overran the server's `deadline` (seconds): the caller cancels its task, and `run` then answers
        with the timeout (503) unless part of the response went out already, and closes."""
        self.expired_after = deadline

    async def run(self, app: App, scope: dict[str, Any]) -> None:
        """Call the app; a failure before the response started is answered 500, a response left unfinished or an
        overrun deadline ends the connection after it."""
        try:
            await app(scope, self.receive, self.send)
        except asyncio.CancelledError:
            if not self.expired_after:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            # The request left its queue (or its model) when cancelled.
            self.keep_alive = False
            if not self.started:
                self._write(error_response(503, deadline_text(self.expired_after)))
        except Exception:
            log.exception("unhandled error for %s %s", self.request.method, self.request.path)
            if not self.started:
                self.keep_alive = False
                self._write(INTERNAL_ERROR_RESPONSE)
        if not self.finished and self.started:
            self.keep_alive = False  # a response that never ended cannot be followed on this connection

    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.request.body, "more_body": False}
        if not self.finished:
            await asyncio.shield(self.lost)
        return _REQUEST_DONE

    async def send(self, message: dict[str, Any]) -> None:
        transport = self.transport
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body" or self.finished:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if transport.is_closing():
            self.finished = not more
            return
        if not self.started:
            self.started = True
            head = [status_line(self.status)]
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
        drained = self.flow.drained
        if drained is not None:
            await asyncio.shield(drained)  # the client is not reading: wait for it, do not buffer more
