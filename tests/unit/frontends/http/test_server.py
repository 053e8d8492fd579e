"""The HTTP/1.1 server as an ordinary client sees it: a slow request holds the answers pipelined behind it in
order, the ASGI scope carries method, path, query and lower-case headers, `connection: close` and HTTP/1.0 end the
connection after the answer, and a request line that is not HTTP is answered 400. (The limits and hostile
clients are in test_server_limits.py; both use the harness of fakes.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from nereid.frontends.http.server import HttpServer
from tests.unit.frontends.http.fakes import EchoApp, post, read_response, run_server, until


class _ScopeApp(EchoApp):
    """Also keeps each request's scope."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await super().__call__(scope, receive, send)


def test_a_slow_request_holds_the_pipelined_answers_behind_it_in_order() -> None:
    app = EchoApp()

    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hold", b"x") + post("/after1", b"") + post("/after2", b"yy"))
        await until(lambda: app.calls >= 1)
        reading = asyncio.ensure_future(read_response(reader))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not reading.done()  # nothing may overtake the held first answer
        app.release.set()
        assert (await reading)[2] == b"POST /hold 1"
        assert (await read_response(reader))[2] == b"POST /after1 0"
        assert (await read_response(reader))[2] == b"POST /after2 2"
        writer.close()

    run_server(test, app)


def test_the_scope_carries_method_path_query_and_lower_case_headers() -> None:
    app = _ScopeApp()

    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v2/models/simple?verbose=1 HTTP/1.1\r\nHost: x\r\nX-Trace-Id: AbC\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"GET /v2/models/simple 0")
        writer.close()

    run_server(test, app)
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
            status, _, _ = await read_response(reader)
            assert status == 200
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
            writer.close()

    run_server(test)


def test_a_request_that_is_not_http_is_answered_400() -> None:
    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HELLO THERE\r\n\r\n")
        status, _, _ = await read_response(reader)
        assert status == 400
        writer.close()

    run_server(test)


class _Handle:
    cancelled = False


class _DirectApp(EchoApp):
    """Also answers POST .../infer without a task: /x/infer at once, /hold/infer when `answer_held` is called,
    /asgi/infer through the ASGI call (start_infer returns None)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[_Handle, Any]] = []
        self.direct = 0

    def start_infer(self, path: str, headers: Any, body: bytes, answer: Any) -> _Handle | None:
        if path.startswith("/asgi"):
            return None
        self.direct += 1
        handle = _Handle()
        if path.startswith("/hold"):
            self.held.append((handle, answer))
        else:
            answer(200, [(b"content-type", b"text/plain")], b"direct %s %d" % (path.encode(), len(body)))
        return handle

    def answer_held(self) -> None:
        for _, answer in self.held:
            answer(200, [], b"held")


def test_an_inference_is_answered_through_the_apps_task_free_path_in_pipelined_order() -> None:
    app = _DirectApp()

    async def test(port: int, _: HttpServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hold/infer", b"x") + post("/a/infer", b"yy") + post("/asgi/infer", b"") + post("/b", b"z"))
        await until(lambda: len(app.held) == 1)
        for _ in range(50):
            await asyncio.sleep(0)
        assert app.direct == 1  # the pipelined requests wait behind the held answer
        app.answer_held()
        status, headers, body = await read_response(reader)
        assert (status, body) == (200, b"held") and headers[b"content-length"] == b"4"
        status, headers, body = await read_response(reader)
        assert (status, body, headers[b"content-type"]) == (200, b"direct /a/infer 2", b"text/plain")
        assert (await read_response(reader))[2] == b"POST /asgi/infer 0"  # start_infer declined: the ASGI call
        assert (await read_response(reader))[2] == b"POST /b 1"
        writer.close()

    run_server(test, app)
    assert app.direct == 2 and app.calls == 2


def test_a_task_free_inference_is_cancelled_when_its_client_goes_and_answered_at_the_deadline() -> None:
    app = _DirectApp()

    async def test(port: int, _: HttpServer) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hold/infer", b"x"))
        await until(lambda: len(app.held) == 1)
        writer.close()
        await until(lambda: app.held[0][0].cancelled)  # a queued request leaves its queue
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hold/infer", b"x"))
        status, _, body = await read_response(reader)  # the server's default deadline, 1 s
        assert status == 503 and b"Request timeout expired" in body and app.held[1][0].cancelled
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection is closed
        app.answer_held()  # the late answers go nowhere
        writer.close()

    run_server(test, app, default_request_timeout_secs=1)
