"""An HTTP/1.1 transport served on a loopback port for a test, with an echoing ASGI app, and the raw-socket
client side the tests speak: a request written by hand and a response read back (content-length or chunked)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.settings import TransportLimits
from nereid.frontends.http.server import HttpServer

CHUNK = 64 * 1024


class EchoApp:
    """Echoes the method, path and body length; /stream sends 1,000 chunks of 64 KiB, counting them;
    /hold waits for `release`."""

    def __init__(self) -> None:
        self.calls = 0
        self.bodies: list[bytes] = []
        self.produced = 0
        self.release = asyncio.Event()
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        self.scopes.append(scope)
        body = (await receive())["body"]
        self.bodies.append(body)
        path = scope["path"]
        if path == "/hold":
            await self.release.wait()
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(1000):
                self.produced += CHUNK
                await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        text = b"%s %s %d" % (scope["method"].encode(), path.encode(), len(body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(text))]})
        await send({"type": "http.response.body", "body": text})


async def serve(app: EchoApp, test: Callable[[int, HttpServer], Awaitable[None]], **limits: Any) -> None:
    max_input_size = limits.pop("max_input_size", 1024 * 1024)
    server = HttpServer(app, "127.0.0.1", 0, limits=TransportLimits(**limits), max_input_size=max_input_size)
    await server.start()
    assert server._listener is not None
    port = server._listener.sockets[0].getsockname()[1]
    serving = asyncio.get_running_loop().create_task(server.serve())
    try:
        await asyncio.wait_for(test(port, server), 60)
    finally:
        app.release.set()
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


def run_server(test: Callable[[int, HttpServer], Awaitable[None]], app: EchoApp | None = None, **limits: Any) -> EchoApp:
    holder: list[EchoApp] = []

    async def main() -> None:
        the_app = app or EchoApp()
        holder.append(the_app)
        await serve(the_app, test, **limits)

    asyncio.run(main())
    return holder[0]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(part[:-2] for part in parts)
    else:
        body = b""
    return status, headers, body


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
