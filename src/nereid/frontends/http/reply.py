"""What an HTTP handler answers (status, body, headers, whether it may be compressed or is a stream), the answers
Triton gives for a path no route takes (404) or a method the route does not serve (405), and the whole responses the
transport writes itself (a limit's refusal, a deadline's or a bug's answer). No handler here."""

from __future__ import annotations

import http
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson

from nereid.core.errors import NereidError, http_status

__all__ = [
    "JSON",
    "TEXT",
    "NOT_ALLOWED_JSON",
    "NOT_ALLOWED_TEXT",
    "NOT_FOUND",
    "INTERNAL_ERROR_RESPONSE",
    "Reply",
    "deadline_text",
    "error_reply",
    "error_response",
    "json_reply",
    "status_line",
]

_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def status_line(status: int) -> bytes:
    """An HTTP/1.1 response's first line, with the standard reason phrase."""
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))


def error_response(status: int, message: str, keep_alive: bool = False) -> bytes:
    """A whole response the transport writes itself: `message` in Triton's error shape, {"error": ...}, as JSON."""
    body = json.dumps({"error": message}).encode()
    close = b"" if keep_alive else b"connection: close\r\n"
    return status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), close, body)


# The answer to a request whose handling raised before any of its response was sent (a bug); the connection closes.
INTERNAL_ERROR_RESPONSE = (
    status_line(500) + b"content-type: text/plain\r\ncontent-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


def deadline_text(seconds: float) -> str:
    """The error of a request still running past the server's default deadline (--default-request-timeout-secs)."""
    return f"Request timeout expired: over the server's default of {seconds:g} s"


JSON = (b"content-type", b"application/json")
TEXT = (b"content-type", b"text/plain")


class Reply:
    """What a handler returns: status, body, extra headers, and whether Accept-Encoding may compress it."""

    __slots__ = ("status", "body", "headers", "compressible", "stream")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        compressible: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.stream: AsyncIterator[bytes] | None = None  # set for Server-Sent Events
        self.headers = headers if headers is not None else [JSON]
        # Like Triton, only inference responses are compressed: tritonclient's aio client reads every other
        # answer without decoding it, whatever Accept-Encoding aiohttp sent.
        self.compressible = compressible


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(value))


def error_reply(error: NereidError, content_type: tuple[bytes, bytes] = JSON, status: int | None = None) -> Reply:
    """An error in Triton's shape, `{"error": message}`, with the HTTP status of its Triton status unless `status`
    is given."""
    code = http_status(error.status) if status is None else status
    return Reply(code, orjson.dumps({"error": error.message}), [content_type])


# Triton's answers to a path that names no route, and to a method its route does not serve: the health, model-ready
# and infer routes send the 405 as text/plain, the others as JSON. Shared objects: never mutate them.
NOT_FOUND = Reply(404, b'{"error":"Not Found"}', [TEXT])
NOT_ALLOWED_TEXT = Reply(405, b'{"error":"Method Not Allowed"}', [TEXT])
NOT_ALLOWED_JSON = Reply(405, b'{"error":"Method Not Allowed"}', [JSON])
