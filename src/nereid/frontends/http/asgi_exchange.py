"""One HTTP request's ASGI receive/send pair, for the requests the connection (server.py) runs through the app's
ASGI call: the body once, then the client's disconnect; the response head and body written as they are sent, chunked
when their length is not given, waiting while the client does not read."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from nereid.frontends.http.reply import status_line

if TYPE_CHECKING:
    from nereid.frontends.http.server import _Connection as Connection
    from nereid.frontends.http.server import _Request as Request

__all__ = ["Exchange"]

_REQUEST_DONE = {"type": "http.disconnect"}


class Exchange:
    """One request's ASGI receive/send pair."""

    __slots__ = ("connection", "request", "keep_alive", "started", "finished", "chunked", "status", "headers", "_body_sent")

    def __init__(self, connection: Connection, request: Request) -> None:
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
        drained = self.connection.drained
        if drained is not None:
            await asyncio.shield(drained)  # the client is not reading: wait for it, do not buffer more
