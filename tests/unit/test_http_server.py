"""The HTTP/1.1 server as an ordinary client sees it: a slow request holds the answers pipelined behind it in
order, the ASGI scope carries method, path, query and lower-case headers, `connection: close` and HTTP/1.0 end the
connection after the answer, and a request line that is not HTTP is answered 400. (The limits and hostile
clients are in test_http_server_limits.py, whose harness this reuses.)"""

from __future__ import annotations

import asyncio
from typing import Any

from nereid.frontends.http.server import HttpServer
from tests.unit.test_http_server_limits import _App, _post, _response, _run, _until


class _ScopeApp(_App):
    """Also keeps each request's scope."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await super().__call__(scope, receive, send)


def test_a_slow_request_holds_the_pipelined_answers_behind_it_in_order() -> None:
    app = _App()

    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/hold", b"x") + _post("/after1", b"") + _post("/after2", b"yy"))
        await _until(lambda: app.calls >= 1)
        reading = asyncio.ensure_future(_response(reader))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not reading.done()  # nothing may overtake the held first answer
        app.release.set()
        assert (await reading)[2] == b"POST /hold 1"
        assert (await _response(reader))[2] == b"POST /after1 0"
        assert (await _response(reader))[2] == b"POST /after2 2"
        writer.close()

    _run(test, app)


def test_the_scope_carries_method_path_query_and_lower_case_headers() -> None:
    app = _ScopeApp()

    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v2/models/simple?verbose=1 HTTP/1.1\r\nHost: x\r\nX-Trace-Id: AbC\r\n\r\n")
        status, _, body = await _response(reader)
        assert (status, body) == (200, b"GET /v2/models/simple 0")
        writer.close()

    _run(test, app)
    scope = app.scopes[0]
    assert scope["method"] == "GET" and scope["path"] == "/v2/models/simple"
    assert scope["query_string"] == b"verbose=1"
    assert (b"x-trace-id", b"AbC") in [(bytes(k), bytes(v)) for k, v in scope["headers"]]
    assert scope["http_version"] == "1.1"


def test_connection_close_and_http_1_0_end_the_connection_after_the_answer() -> None:
    async def test(port: int, _: HttpServer) -> None:
        for request in (
            b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            b"GET /b HTTP/1.0\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            status, _, _ = await _response(reader)
            assert status == 200
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
            writer.close()

    _run(test)


def test_a_request_that_is_not_http_is_answered_400() -> None:
    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HELLO THERE\r\n\r\n")
        status, _, _ = await _response(reader)
        assert status == 400
        writer.close()

    _run(test)
