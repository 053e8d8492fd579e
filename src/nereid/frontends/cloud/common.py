"""What the SageMaker and Vertex AI frontends share: the ASGI entry that reads a request's body (both clouds send it
uncompressed, so Content-Encoding is not applied, as in Triton) and hands the request to a route, the JSON-header
size their binary MIME types carry, and writing an answer. No routing and no inference here."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.errors import NereidError
from nereid.frontends.http import reply
from nereid.frontends.http.app import send_stream
from nereid.frontends.http.body import read_body
from nereid.frontends.http.reply import JSON, TEXT, Reply
from nereid.frontends.http.request import HttpRequest
from nereid.frontends.http.server import DISCONNECT_KEY

__all__ = ["TEXT", "JSON", "CloudEndpointApp", "error_reply", "header_length", "send_reply", "text_reply"]

Send = Callable[[dict[str, Any]], Awaitable[None]]

_log = logging.getLogger("nereid.cloud")


def text_reply(status: int, body: bytes = b"") -> Reply:
    """An answer as Triton's cloud endpoints send their own errors and empty answers: text/plain."""
    return Reply(status, body, [TEXT])


def error_reply(error: NereidError, status: int | None = None, content_type: tuple[bytes, bytes] = TEXT) -> Reply:
    """An error as the cloud endpoints send it: text/plain unless told, with the error's status unless told."""
    return reply.error_reply(error, content_type, status)


def header_length(headers: list[tuple[bytes, bytes]], mime: bytes, body_length: int) -> int | None:
    """The JSON header's length of a v2 body: the `json-header-size=N` of the endpoint's binary MIME type when the
    Content-Type names it, else all of the body (None); an empty body counts as raw data, as in Triton."""
    for key, value in headers:
        if key != b"content-type":
            continue
        position = value.find(mime)
        if position < 0:
            break
        if position != 0:
            raise NereidError.invalid(
                f"expect MIME type for binary data starts with '{mime.decode()}', got: {value.decode('latin-1')}"
            )
        given = value[len(mime):].decode("latin-1")
        size = _leading_int(given)
        if size < 0 or size > body_length:
            raise NereidError.invalid(f"inference header size should be in range (0, {body_length}), got: {given}")
        return size
    return None if body_length else 0


def _leading_int(text: str) -> int:
    """C's atoi: the integer the text starts with, 0 when it starts with none."""
    text = text.lstrip()
    end = 1 if text[:1] in ("-", "+") else 0
    while end < len(text) and text[end].isdigit():
        end += 1
    try:
        return int(text[:end])
    except ValueError:
        return 0


async def send_reply(send: Send, reply: Reply) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": reply.headers + [(b"content-length", str(len(reply.body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": reply.body})


class CloudEndpointApp:
    """The ASGI entry both cloud endpoints share: read the body, route the request, and answer, errors included (a
    bug is answered as INTERNAL, never by dropping the connection)."""

    endpoint_name = ""  # in log lines: "SageMaker", "Vertex AI"
    max_input_size = 0

    async def _route(self, method: str, path: str, request: HttpRequest) -> Reply:
        raise NotImplementedError

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path, headers = scope["method"], scope["path"], scope["headers"]
        _log.debug("%s request: %s %s", self.endpoint_name, method, path)
        request = HttpRequest(b"", headers, receive, scope.get(DISCONNECT_KEY))
        try:
            request.body = await read_body(receive, self.max_input_size)
            reply = await self._route(method, path, request)
        except NereidError as exc:
            reply = error_reply(exc)
        except Exception as exc:  # never let a bug take the connection down without an answer
            _log.exception("unhandled error for %s %s %s", self.endpoint_name, method, path)
            reply = error_reply(NereidError.internal(f"{type(exc).__name__}: {exc}"))
        if reply.stream is not None:
            await send_stream(reply, send, receive)  # generate_stream's Server-Sent Events
        else:
            await send_reply(send, reply)
