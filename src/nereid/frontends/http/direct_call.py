"""An HTTP inference answered without a task (see HttpApp.start_infer): the answer callback the app calls once, the
client going away, the server's default deadline, and the --max-inflight-requests slot the request holds. Kept apart
from server.py, the connection it writes through, which calls it at those moments."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nereid.core.admission import InflightLimit
from nereid.frontends.http.reply import status_line

if TYPE_CHECKING:
    from nereid.frontends.http.server import _Connection as Connection
    from nereid.frontends.http.server import _Request as Request

__all__ = ["DirectCall", "deadline_text"]


def deadline_text(seconds: float) -> str:
    return f"Request timeout expired: over the server's default of {seconds:g} s"


class DirectCall:
    """An /infer answered through the app's start_infer: the answer callback, the client going away, the server's
    default deadline, and the --max-inflight-requests slot it holds until one of them ends it."""

    __slots__ = ("connection", "request", "limit", "handle", "answered")

    def __init__(self, connection: Connection, request: Request, limit: InflightLimit | None) -> None:
        self.connection = connection
        self.request = request
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
        connection = self.connection
        connection.direct_call = None
        keep_alive = self.request.keep_alive
        transport = connection.transport
        if transport is not None and not transport.is_closing():
            head = [status_line(status)]
            head += [b"%s: %s\r\n" % header for header in headers]
            head.append(b"content-length: %d\r\n%s\r\n" % (len(body), b"" if keep_alive else b"connection: close\r\n"))
            transport.write(b"".join(head) + body)
        drained = connection.drained
        if drained is None:
            connection.after_response(keep_alive)
        else:  # the client is not reading: the next pipelined request waits until it does
            drained.add_done_callback(lambda _: connection.after_response(keep_alive))

    def abandon(self) -> None:
        """The connection is lost: a queued request is dropped unexecuted, and no answer is written."""
        self.answered = True
        self.release()
        self.connection.direct_call = None
        if self.handle is not None:
            self.handle.cancelled = True

    def expire(self, deadline: float) -> None:
        """Over the server's default deadline: dropped from its queue, answered with the timeout, then closed."""
        if self.handle is not None:
            self.handle.cancelled = True
        self.request.keep_alive = False
        self.answer(503, [(b"content-type", b"application/json")], json.dumps({"error": deadline_text(deadline)}).encode())
