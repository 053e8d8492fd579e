"""An HTTP inference answered without a task (see HttpApp.start_infer): the answer callback the app calls once, the
client going away, the server's default deadline, and the --max-inflight-requests slot the request holds. As uvicorn's
RequestResponseCycle, it gets the transport, the flow control and an `on_response` callback, never the connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from nereid.core.admission import InflightLimit
from nereid.frontends.http.flow_control import FlowControl
from nereid.frontends.http.reply import deadline_text, status_line

__all__ = ["DirectCall"]


class DirectCall:
    """An /infer answered through the app's start_infer: the answer callback, the client going away, the server's
    default deadline, and the --max-inflight-requests slot it holds until one of them ends it. `on_response(keep_alive)`
    is called once its answer is written and the client has read what was written before (not when the client went
    away): the connection then goes on."""

    __slots__ = ("transport", "flow", "keep_alive", "on_response", "limit", "handle", "answered")

    def __init__(
        self,
        transport: asyncio.WriteTransport,
        flow: FlowControl,
        keep_alive: bool,
        on_response: Callable[[bool], None],
        limit: InflightLimit | None,
    ) -> None:
        self.transport = transport
        self.flow = flow
        self.keep_alive = keep_alive
        self.on_response = on_response
        self.limit = limit
        self.handle: Any = None  # the app's started request: its `cancelled` drops it from its queue
        self.answered = False

    def release(self) -> None:
        if self.limit is not None:
            self.limit.release()
            self.limit = None

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.answered:
            return  # the client went away, or the deadline passed and answered first
        self.answered = True
        self.release()
        keep_alive = self.keep_alive
        transport = self.transport
        if not transport.is_closing():
            head = [status_line(status)]
            head += [b"%s: %s\r\n" % header for header in headers]
            head.append(b"content-length: %d\r\n%s\r\n" % (len(body), b"" if keep_alive else b"connection: close\r\n"))
            transport.write(b"".join(head) + body)
        drained = self.flow.drained
        if drained is None:
            self.on_response(keep_alive)
        else:  # the client is not reading: the next pipelined request waits until it does
            drained.add_done_callback(lambda _: self.on_response(keep_alive))

    def abandon(self) -> None:
        """The connection is lost: a queued request is dropped unexecuted, and no answer is written."""
        if self.answered:
            return
        self.answered = True
        self.release()
        if self.handle is not None:
            self.handle.cancelled = True

    def expire(self, deadline: float) -> None:
        """Over the server's default deadline: dropped from its queue, answered with the timeout, then closed."""
        if self.answered:
            return
        if self.handle is not None:
            self.handle.cancelled = True
        self.keep_alive = False
        self.answer(503, [(b"content-type", b"application/json")], json.dumps({"error": deadline_text(deadline)}).encode())
