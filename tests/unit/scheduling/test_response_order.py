"""The sequence batcher's response order (oldest.preserve_ordering): a request's responses wait until every
request issued before it has sent its final response."""

from __future__ import annotations

from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.scheduling.response_order import ResponseOrder


def _requests(order: ResponseOrder, count: int, sent: list[tuple[str, bool]]) -> list[InferenceRequest]:
    requests = []
    for index in range(count):
        request = InferenceRequest("m", "1", [], id=str(index))
        request.respond = lambda response: sent.append((response.id, response.final))
        order.take_ticket(request)
        requests.append(request)
    return requests


def _response(request: InferenceRequest, final: bool = True) -> InferenceResponse:
    return InferenceResponse("m", "1", request.id, final=final)


def test_a_later_requests_response_waits_for_the_earlier_ones() -> None:
    sent: list[tuple[str, bool]] = []
    a, b, c = _requests(ResponseOrder(), 3, sent)
    c.respond(_response(c))
    b.respond(_response(b))
    assert sent == []
    a.respond(_response(a))
    assert sent == [("0", True), ("1", True), ("2", True)]


def test_streamed_responses_pass_while_their_request_is_the_oldest_and_are_held_otherwise() -> None:
    sent: list[tuple[str, bool]] = []
    a, b = _requests(ResponseOrder(), 2, sent)
    a.respond(_response(a, final=False))
    b.respond(_response(b, final=False))
    b.respond(_response(b, final=False))
    assert sent == [("0", False)]
    a.respond(_response(a))
    # b's held responses follow a's final one; b is now the oldest, so its next response goes straight out.
    assert sent == [("0", False), ("0", True), ("1", False), ("1", False)]
    b.respond(_response(b))
    assert sent[-1] == ("1", True)


def test_requests_issued_after_the_oldest_finished_answer_at_once() -> None:
    sent: list[tuple[str, bool]] = []
    order = ResponseOrder()
    (a,) = _requests(order, 1, sent)
    a.respond(_response(a))
    (b,) = _requests(order, 1, sent)
    b.respond(_response(b))
    assert sent == [("0", True), ("0", True)]
