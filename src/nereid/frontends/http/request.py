"""What an HTTP route's handler receives, as Starlette's endpoint(request) does: one object with the path's
parameters, the body (already size-checked and inflated), the headers, the means to watch for the client going away
and, while tracing, the frontend's trace. It reads nothing from the wire itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.tracing import FrontendTrace
from nereid.frontends.http.disconnect import DisconnectWatch

__all__ = ["HttpRequest"]

Receive = Callable[[], Awaitable[dict[str, Any]]]


class HttpRequest:
    """One request as its handler sees it. `receive` is the request's ASGI receive (read past the body, it waits for
    the client's disconnect); `lost`, when the transport gives one, completes when the client's connection is lost."""

    __slots__ = ("parameters", "body", "headers", "receive", "lost", "frontend_trace")

    def __init__(
        self,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        receive: Receive,
        lost: asyncio.Future[None] | None = None,
        frontend_trace: FrontendTrace | None = None,
    ) -> None:
        self.parameters: tuple[str, ...] = ()  # the route's path parameters, in pattern order (set at dispatch)
        self.body = body
        self.headers = headers
        self.receive = receive
        self.lost = lost
        # While tracing: the frontend's receive times, handed to the server with the inference request.
        self.frontend_trace = frontend_trace

    def disconnect_watch(self) -> DisconnectWatch:
        """`with request.disconnect_watch():` cancels the work inside when the client goes away (see DisconnectWatch)."""
        return DisconnectWatch(self.receive, self.lost)

    def header(self, name: bytes) -> str:
        """The value of header `name` (lower case), or "" without it."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return ""
