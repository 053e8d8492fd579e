"""A request's body before dispatch: read whole from ASGI `receive` within --http-max-input-size and, when the client
compressed it, inflated within the same limit; with the one wording of that limit (tritonserver's), which the transport's refusal
uses too. Run once per request, before any route; it knows nothing of what the body holds."""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["body_too_large", "inflate", "read_body"]

Receive = Callable[[], Awaitable[dict[str, Any]]]


def body_too_large(size: int | None, limit: int, json_header: int = -1) -> str:
    """Why a body over --http-max-input-size is refused, in tritonserver's words: `size` None is a compressed body that
    inflates past it; `json_header` 0 (Inference-Header-Content-Length: 0) a raw binary body, else a JSON one."""
    use = "Use --http-max-input-size to increase the limit."
    if size is None:
        return f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {use}"
    if json_header == 0:
        return f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {limit} bytes. {use}"
    return f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {use}"


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, however many ASGI messages carry it; INVALID_ARG once it passes `limit` bytes."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):  # the usual case: Nereid's transport hands the body over in one message
        if len(body) > limit:
            raise NereidError.invalid(body_too_large(len(body), limit))
        return body
    parts = [body]
    size = len(body)
    while True:
        if size > limit:
            raise NereidError.invalid(body_too_large(size, limit))
        if not message.get("more_body"):
            return b"".join(parts)
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        parts.append(chunk)


def inflate(body: bytes, encoding: bytes, limit: int) -> bytes:
    """`body` decoded by its Content-Encoding (gzip, deflate or identity), at most `limit` bytes of it."""
    encoding = encoding.strip().lower()
    try:
        if encoding == b"gzip":
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, limit + 1)
        elif encoding == b"deflate":
            out = zlib.decompressobj().decompress(body, limit + 1)
        elif encoding in (b"identity", b""):
            return body
        else:
            raise NereidError.unsupported(f"unsupported Content-Encoding '{encoding.decode()}'")
    except zlib.error as exc:
        raise NereidError.invalid(f"failed to decompress the request body ({encoding.decode()}): {exc}") from None
    if len(out) > limit:
        raise NereidError.invalid(body_too_large(None, limit))
    return out
