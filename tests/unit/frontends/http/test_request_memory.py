"""The HTTP/1.1 transport under --request-memory-limit: a body is reserved when its size is known, before it is read;
past the limit the request is answered 503 naming the limit and the connection closes, while small requests are
still served; and every way a request ends gives its bytes back (answered, refused, client gone, queued unread)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import TransportLimits
from nereid.frontends.http.server import REQUEST_MEMORY_KEY, HttpServer

MiB = 1 << 20
LIMIT = 8 * MiB  # large requests may hold 7 MiB of it; requests of at most 1 MiB all 8


class _App:
    """Answers with the body's length; /hold waits for `release` first."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        body = (await receive())["body"]
        if scope["path"] == "/inflate":  # as HttpApp does for a Content-Encoding body
            error = scope[REQUEST_MEMORY_KEY].reserve_decoded(int(body))
            if error is not None:
                text = error.message.encode()
                await send({"type": "http.response.start", "status": 503, "headers": [(b"content-length", b"%d" % len(text))]})
                await send({"type": "http.response.body", "body": text})
                return
        if scope["path"] in ("/hold", "/inflate"):
            self.holding.set()
            await self.release.wait()
        text = b"%d" % len(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(text))]})
        await send({"type": "http.response.body", "body": text})


Test = Callable[[int, HttpServer, _App], Awaitable[None]]


def _run(test: Test) -> None:
    async def main() -> None:
        app = _App()
        budget = RequestMemoryBudget(LIMIT)
        server = HttpServer(app, "127.0.0.1", 0, limits=TransportLimits(), max_input_size=64 * MiB, request_memory=budget)
        await server.start()
        assert server._listener is not None
        port = server._listener.sockets[0].getsockname()[1]
        serving = asyncio.get_running_loop().create_task(server.serve())
        try:
            await asyncio.wait_for(test(port, server, app), 60)
        finally:
            app.release.set()
            server.should_exit = True
            await asyncio.wait_for(serving, 30)

    asyncio.run(main())


def _head(path: str, length: int, *headers: bytes) -> bytes:
    extra = b"".join(header + b"\r\n" for header in headers)
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n" % (path.encode(), length, extra)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return status, head, await reader.readexactly(length)


async def _until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _small_request(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_head("/small", 100) + b"x" * 100)
    status, _, body = await _response(reader)
    writer.close()
    assert status != 200 or body == b"100"
    return status


def test_a_declared_body_past_the_limit_is_answered_503_before_it_is_read_and_the_connection_closes() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # A JSON body counts three times (its numbers are decoded into arrays): 4 MiB needs 12 MiB.
        writer.write(_head("/infer", 4 * MiB, b"expect: 100-continue"))
        status, head, body = await _response(reader)
        assert status == 503 and b"connection: close" in head
        assert json.loads(body)["error"].startswith("request memory limit of 8 MiB reached: this request needs 12 MiB")
        assert b"100 Continue" not in head  # the body was never invited
        assert await reader.read() == b""  # closed: the body will not be read
        assert app.calls == 0 and server.request_memory.held == 0 and server.request_memory.refused == 1

    _run(test)


def test_binary_tensors_count_once_and_their_json_header_three_times_until_the_answer() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/infer", 2 * MiB, b"inference-header-content-length: 100") + b"x" * MiB)
        await _until(lambda: server.request_memory.held == 2 * MiB + 200)  # reserved before the body arrived
        writer.write(b"x" * MiB)
        status, _, body = await _response(reader)
        assert (status, body) == (200, b"%d" % (2 * MiB))
        await _until(lambda: server.request_memory.held == 0)
        writer.close()

    _run(test)


def test_small_requests_are_served_while_a_large_body_holds_the_budget_and_a_client_that_leaves_gives_it_back() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        _, holder = await asyncio.open_connection("127.0.0.1", port)
        holder.write(_head("/infer", 6 * MiB, b"inference-header-content-length: 10") + b"x" * MiB)  # then stalls
        await _until(lambda: server.request_memory.held == 6 * MiB + 20)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/infer", 2 * MiB, b"inference-header-content-length: 10"))
        status, _, body = await _response(reader)
        assert status == 503 and "requests in progress hold 6.0 MiB" in json.loads(body)["error"]
        writer.close()
        assert [await _small_request(port) for _ in range(3)] == [200, 200, 200]
        holder.close()  # gone mid-body: its reservation ends with the connection
        await _until(lambda: server.request_memory.held == 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/infer", 2 * MiB, b"inference-header-content-length: 10") + b"x" * 2 * MiB)
        assert (await _response(reader))[0] == 200
        writer.close()

    _run(test)


def test_a_chunked_body_is_counted_as_it_arrives_and_refused_once_it_no_longer_fits() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (MiB, b"x" * MiB)
        writer.write(chunk * 2)  # 2 MiB of JSON: 6 MiB reserved
        await _until(lambda: server.request_memory.held == 6 * MiB)
        writer.write(chunk)  # 3 MiB more would pass the 7 MiB large requests may hold
        status, _, body = await _response(reader)
        assert status == 503 and json.loads(body)["error"].startswith("request memory limit of 8 MiB reached")
        assert server.request_memory.held == 0 and app.calls == 0
        writer.close()

    _run(test)


def test_queued_and_running_requests_hold_their_bytes_until_they_end_even_when_the_client_leaves() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/hold", 1000) + b"x" * 1000 + (_head("/after", 2000) + b"y" * 2000) * 2)
        await app.holding.wait()
        await _until(lambda: server.request_memory.held == 3 * (1000 + 2 * 2000))  # one running, two queued
        writer.close()  # the queued two will never run: given back at once
        await _until(lambda: server.request_memory.held == 3 * 1000)
        app.release.set()  # the running one gives its bytes back when it ends
        await _until(lambda: server.request_memory.held == 0)

    _run(test)


def test_what_the_app_decodes_a_body_into_is_held_with_the_request_or_refused() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/inflate", 7) + b"%7d" % (6 * MiB))
        await app.holding.wait()
        assert server.request_memory.held == 3 * 7 + 6 * MiB
        app.release.set()
        assert (await _response(reader))[0] == 200
        await _until(lambda: server.request_memory.held == 0)
        writer.write(_head("/inflate", 7) + b"%7d" % (8 * MiB))
        status, _, body = await _response(reader)
        assert status == 503 and body.startswith(b"request memory limit of 8 MiB reached: this request needs 8 MiB")
        await _until(lambda: server.request_memory.held == 0)
        writer.close()

    _run(test)


def test_a_connection_lets_go_of_its_bodies_when_they_end_not_when_the_collector_runs() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/infer", 2 * MiB) + b"x" * 2 * MiB)  # arrives in several reads: joined once
        assert (await _response(reader))[0] == 200
        (connection,) = server.connections
        assert connection.body_parts == [] and connection.current is not None and connection.current.body == b""
        writer.write(_head("/infer", 2 * MiB) + b"x" * MiB)  # then gone mid-body
        await _until(lambda: len(connection.body_parts) > 0)
        writer.close()
        await _until(lambda: connection.transport is None)
        assert connection.body_parts == [] and server.request_memory.held == 0

    _run(test)


def test_a_small_body_is_refused_only_once_the_whole_limit_is_held() -> None:
    async def test(port: int, server: HttpServer, app: _App) -> None:
        budget = server.request_memory
        assert budget.try_reserve(7 * MiB) and budget.try_reserve(MiB - 200)  # large, then small requests: all but 200
        assert await _small_request(port) == 503  # its 100 bytes reserve 300
        budget.release(MiB - 200)
        assert await _small_request(port) == 200
        budget.release(7 * MiB)
        await _until(lambda: budget.held == 0)

    _run(test)
