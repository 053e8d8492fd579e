"""A gRPC stream's turns: a later request's answer waits for every earlier turn, then leaves at once."""

from __future__ import annotations

from nereid.frontends.grpc.stream_order import StreamOrder


def test_later_turns_wait_for_earlier_ones_and_then_leave_in_request_order() -> None:
    sent: list[str] = []
    order = StreamOrder(sent.append)
    first, second, third = order.take(), order.take(), order.take()
    order.put(third, "third")
    order.done(third)
    order.put(second, "second")
    assert sent == []  # the first request has not answered
    order.put(first, "first")
    assert sent == ["first"]  # the head's answer goes at once
    order.done(first)
    assert sent == ["first", "second"]  # the second is not done: what it wrote goes, the third still waits
    order.done(second)
    assert sent == ["first", "second", "third"]
    fourth = order.take()
    order.put(fourth, "fourth")
    assert sent[-1] == "fourth"
