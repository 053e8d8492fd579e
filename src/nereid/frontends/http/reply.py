"""What an HTTP handler answers (status, body, headers, whether it may be compressed or is a stream), and the
answers Triton gives for a path no route takes (404) or a method the route does not serve (405). No handler here."""

from __future__ import annotations

import http
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
    "Reply",
    "error_reply",
    "json_reply",
    "status_line",
]

_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def status_line(status: int) -> bytes:
    """An HTTP/1.1 response's first line, with the standard reason phrase."""
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))


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
