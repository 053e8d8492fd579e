"""One HTTP/1.1 request as the connection parsed it (method, path, headers, body, keep-alive), what the transport
hands to the code that answers it. A plain record: it neither parses nor answers."""

from __future__ import annotations

__all__ = ["ParsedRequest", "RawHeaders"]


class ParsedRequest:
    """A complete request: its line, headers (names lower-cased) and whole body, whether the connection stays open
    after it, and, while tracing, its (first byte, whole request) monotonic ns."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "version", "received", "reserved")

    def __init__(self, method: str, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool, version: str) -> None:
        path, _, query = url.partition(b"?")
        self.method = method
        self.path = path.decode("latin-1")
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.version = version
        self.received: tuple[int, int] | None = None
        self.reserved = 0  # bytes held under --request-memory-limit until the request ends


class RawHeaders(list[tuple[bytes, bytes]]):
    """The ASGI header list (lowercased names) that also keeps each header as the client spelled it in `raw`:
    --http-header-forward-pattern forwards names unchanged, as Triton does."""

    __slots__ = ("raw",)

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[tuple[bytes, bytes]] = []
