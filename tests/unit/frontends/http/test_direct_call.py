"""DirectCall, the task-free /infer's answer: written once through the transport it is given (status line, headers,
length, and `connection: close` when the connection will not be reused), then reported to `on_response` once the
client reads; the client going away drops the request unanswered, the server's deadline answers it 503 and closes,
and the --max-inflight-requests slot is given back whichever comes first."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nereid.core.admission import InflightLimit
from nereid.frontends.http.direct_call import DirectCall
from nereid.frontends.http.flow_control import FlowControl
from tests.unit.fakes.transport import FakeTransport

_JSON = [(b"content-type", b"application/json")]


class _Handle:
    """The app's started request, as the direct call sees it: a flag that drops it from its queue."""

    cancelled = False


def _call(
    keep_alive: bool = True, limit: InflightLimit | None = None, flow: FlowControl | None = None
) -> tuple[DirectCall, FakeTransport, list[bool]]:
    transport, ended = FakeTransport(), []
    flow = flow or _never_paused()
    call = DirectCall(transport, flow, keep_alive, ended.append, limit)  # type: ignore[arg-type]
    call.handle = _Handle()
    return call, transport, ended


def _never_paused() -> FlowControl:
    """Flow control of a client that reads all it is sent (its loop is only asked for while paused)."""
    return FlowControl(None)  # type: ignore[arg-type]


def _held(limit: InflightLimit) -> InflightLimit:
    assert limit.try_acquire()  # the connection takes the slot before it starts the call
    return limit


def test_the_answer_is_written_in_one_piece_with_its_length_then_the_connection_goes_on() -> None:
    call, transport, ended = _call()
    call.answer(200, _JSON, b'{"outputs":[]}')
    assert bytes(transport.written) == (
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 14\r\n\r\n{"outputs":[]}'
    )
    assert transport.writes == 1 and ended == [True]


def test_an_answer_on_a_connection_that_will_close_says_so() -> None:
    call, transport, ended = _call(keep_alive=False)
    call.answer(400, _JSON, b"{}")
    assert bytes(transport.written).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"content-length: 2\r\nconnection: close\r\n\r\n{}" in transport.written
    assert ended == [False]


def test_only_the_first_answer_counts() -> None:
    call, transport, ended = _call()
    call.answer(200, _JSON, b"{}")
    call.answer(500, _JSON, b"{}")
    assert transport.writes == 1 and ended == [True]


def test_the_inflight_slot_is_given_back_with_the_answer() -> None:
    limit = _held(InflightLimit(1))
    call, _, _ = _call(limit=limit)
    assert not limit.try_acquire()
    call.answer(200, _JSON, b"{}")
    assert limit.try_acquire()
    call.release()  # a second release gives back nothing more
    assert limit.count == 1


def test_a_lost_client_drops_the_request_unanswered_and_frees_its_slot() -> None:
    limit = _held(InflightLimit(1))
    call, transport, ended = _call(limit=limit)
    call.abandon()
    assert call.handle.cancelled and limit.count == 0
    call.answer(200, _JSON, b"{}")  # the scheduler's callback, if the request had already run
    assert transport.writes == 0 and ended == []


def test_past_the_deadline_the_request_is_dropped_and_answered_503_then_closed() -> None:
    limit = _held(InflightLimit(1))
    call, transport, ended = _call(limit=limit)
    call.expire(2.5)
    assert call.handle.cancelled and limit.count == 0
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"content-type: application/json" in head and b"connection: close" in head
    assert json.loads(body) == {"error": "Request timeout expired: over the server's default of 2.5 s"}
    assert ended == [False]
    call.answer(200, _JSON, b"{}")  # the model's answer after the deadline is not written
    assert transport.writes == 1


def test_a_client_that_does_not_read_holds_the_connection_back_until_it_does() -> None:
    async def test() -> None:
        flow = FlowControl(asyncio.get_running_loop())
        flow.pause_writing()
        call, transport, ended = _call(flow=flow)
        call.answer(200, _JSON, b"{}")
        assert transport.writes == 1 and ended == []  # written, but the next pipelined request waits
        flow.resume_writing()
        await asyncio.sleep(0)
        assert ended == [True]

    asyncio.run(asyncio.wait_for(test(), 10))


def test_a_late_deadline_or_disconnect_changes_nothing_once_answered() -> None:
    call, transport, ended = _call()
    call.answer(200, _JSON, b"{}")
    call.expire(1.0)
    call.abandon()
    assert transport.writes == 1 and ended == [True] and not call.handle.cancelled


def test_a_closing_transport_is_not_written_but_the_response_still_ends() -> None:
    call, transport, ended = _call()
    transport.close()
    call.answer(200, _JSON, b"{}")
    assert transport.writes == 0 and ended == [True]


def test_the_call_counts_as_answered_before_the_connection_hears_of_it() -> None:
    """on_response may start the next pipelined request at once: a late answer to this one must find it ended."""
    seen: list[Any] = []
    transport, flow = FakeTransport(), _never_paused()
    call = DirectCall(transport, flow, True, lambda keep_alive: seen.append((keep_alive, call.answered)), None)  # type: ignore[arg-type]
    call.answer(400, _JSON, b'{"error":"x"}')
    assert seen == [(True, True)]
