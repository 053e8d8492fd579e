"""Exchange, one request run through an ASGI app: receive hands over the body once and then waits for the client to
go away; send writes the head with the response's first body (a length added when the app gives none, chunked when
more follows), says `connection: close` when the connection will not be reused, and waits while the client does not
read; run answers a failure 500 and an overrun deadline 503, and ends the connection after a response cut short."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nereid.frontends.http.asgi_exchange import Exchange
from nereid.frontends.http.flow_control import FlowControl
from nereid.frontends.http.parsed_request import ParsedRequest
from tests.unit.fakes.transport import FakeTransport

Message = dict[str, Any]


def _exchange(keep_alive: bool = True, body: bytes = b'{"inputs":[]}') -> tuple[Exchange, FakeTransport]:
    request = ParsedRequest("POST", b"/v2/models/m/infer?x=1", [(b"host", b"h")], body, keep_alive, "1.1")
    transport = FakeTransport()
    loop = asyncio.get_running_loop()
    return Exchange(request, transport, FlowControl(loop), loop.create_future()), transport  # type: ignore[arg-type]


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


def _start(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> Message:
    return {"type": "http.response.start", "status": status, "headers": headers or [(b"content-type", b"text/plain")]}


def _body(body: bytes, more: bool = False) -> Message:
    return {"type": "http.response.body", "body": body, "more_body": more}


def test_receive_hands_over_the_body_once_then_waits_for_the_client_to_go_away() -> None:
    async def test() -> None:
        exchange, _ = _exchange()
        assert await exchange.receive() == {"type": "http.request", "body": b'{"inputs":[]}', "more_body": False}
        waiting = asyncio.ensure_future(exchange.receive())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        exchange.lost.set_result(None)
        assert await waiting == {"type": "http.disconnect"}

    _run(test)


def test_receive_after_the_response_is_a_disconnect_at_once() -> None:
    async def test() -> None:
        exchange, _ = _exchange()
        await exchange.receive()
        await exchange.send(_start())
        await exchange.send(_body(b"ok"))
        assert await exchange.receive() == {"type": "http.disconnect"}

    _run(test)


def test_a_whole_response_is_one_write_with_a_length_added() -> None:
    async def test() -> None:
        exchange, transport = _exchange()
        await exchange.send(_start(201))
        assert transport.writes == 0  # the head waits for the body, to go out in the same write
        await exchange.send(_body(b"hello"))
        assert bytes(transport.written) == b"HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello"
        assert transport.writes == 1 and exchange.started and exchange.finished

    _run(test)


def test_a_length_the_app_gives_is_kept_and_a_closing_connection_says_so() -> None:
    async def test() -> None:
        exchange, transport = _exchange(keep_alive=False)
        await exchange.send(_start(200, [(b"Content-Length", b"2")]))
        await exchange.send(_body(b"ok"))
        assert bytes(transport.written) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"

    _run(test)


def test_a_response_of_unknown_length_is_chunked() -> None:
    async def test() -> None:
        exchange, transport = _exchange()
        await exchange.send(_start())
        await exchange.send(_body(b"data: 1\n\n", more=True))
        await exchange.send(_body(b"", more=True))  # an empty chunk would end the stream: nothing is written
        await exchange.send(_body(b"data: 2\n\n", more=True))
        await exchange.send(_body(b""))
        assert bytes(transport.written) == (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
            b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        )
        assert exchange.finished
        await exchange.send(_body(b"late"))  # after the end, nothing more goes out
        assert bytes(transport.written).endswith(b"0\r\n\r\n")

    _run(test)


def test_send_waits_while_the_client_does_not_read() -> None:
    async def test() -> None:
        exchange, transport = _exchange()
        exchange.flow.pause_writing()
        await exchange.send(_start())
        sending = asyncio.ensure_future(exchange.send(_body(b"x", more=True)))
        await asyncio.sleep(0.01)
        assert transport.writes == 1 and not sending.done()  # written, but no more is buffered until it drains
        exchange.flow.resume_writing()
        await asyncio.wait_for(sending, 1)

    _run(test)


def test_nothing_is_written_once_the_transport_is_closing() -> None:
    async def test() -> None:
        exchange, transport = _exchange()
        transport.close()
        await exchange.send(_start())
        await exchange.send(_body(b"x"))
        assert transport.writes == 0 and exchange.finished and not exchange.started

    _run(test)


def test_run_passes_the_scope_and_keeps_the_connection_after_a_whole_response() -> None:
    async def test() -> None:
        exchange, transport = _exchange()
        scopes: list[Message] = []

        async def app(scope: Message, receive: Any, send: Any) -> None:
            scopes.append(scope)
            body = (await receive())["body"]
            await send(_start())
            await send(_body(body))

        await exchange.run(app, {"type": "http", "path": "/p"})
        assert scopes == [{"type": "http", "path": "/p"}]
        assert bytes(transport.written).endswith(b'\r\n\r\n{"inputs":[]}') and exchange.keep_alive

    _run(test)


def test_a_failing_app_is_answered_500_and_the_connection_closes() -> None:
    async def test() -> None:
        exchange, transport = _exchange()

        async def app(scope: Message, receive: Any, send: Any) -> None:
            raise RuntimeError("a bug")

        await exchange.run(app, {})
        assert bytes(transport.written) == (
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: 21\r\n"
            b"connection: close\r\n\r\nInternal Server Error"
        )
        assert not exchange.keep_alive

    _run(test)


@pytest.mark.parametrize("failing", [True, False])
def test_an_app_that_fails_or_stops_midway_through_its_response_ends_the_connection(failing: bool) -> None:
    async def test() -> None:
        exchange, transport = _exchange()

        async def app(scope: Message, receive: Any, send: Any) -> None:
            await send(_start())
            await send(_body(b"part", more=True))
            if failing:
                raise RuntimeError("a bug midway")

        await exchange.run(app, {})
        assert bytes(transport.written).endswith(b"4\r\npart\r\n")  # no 500 after a response has begun
        assert not exchange.keep_alive

    _run(test)


def test_a_request_past_the_deadline_is_answered_503_and_the_connection_closes() -> None:
    async def test() -> None:
        exchange, transport = _exchange()

        async def app(scope: Message, receive: Any, send: Any) -> None:
            await asyncio.Event().wait()

        running = asyncio.ensure_future(exchange.run(app, {}))
        await asyncio.sleep(0.01)
        exchange.expire(1.5)  # what the connection's timeout sweep does, then it cancels the task
        running.cancel()
        await running  # the deadline's cancellation ends the run quietly
        head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"connection: close" in head
        assert json.loads(body) == {"error": "Request timeout expired: over the server's default of 1.5 s"}
        assert not exchange.keep_alive

    _run(test)


def test_any_other_cancellation_propagates() -> None:
    async def test() -> None:
        exchange, transport = _exchange()

        async def app(scope: Message, receive: Any, send: Any) -> None:
            await asyncio.Event().wait()

        running = asyncio.ensure_future(exchange.run(app, {}))
        await asyncio.sleep(0.01)
        running.cancel()  # the server shutting down, say
        with pytest.raises(asyncio.CancelledError):
            await running
        assert transport.writes == 0

    _run(test)
