"""The dynamic batcher's queue: priority levels, max_queue_size, REJECT and DELAY timeouts with the per-request
override, and the counts the batcher reads (requests and batch items)."""

from __future__ import annotations

import pytest

from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest
from nereid.scheduling.priority_queue import PriorityRequestQueue, QueuePolicy


def _queue(dynamic_batching: str) -> PriorityRequestQueue:
    config = parse_pbtxt(f'name: "m" backend: "python" max_batch_size: 8 dynamic_batching {{ {dynamic_batching} }}', "m")
    return PriorityRequestQueue(config)


def _request(rid: str, priority: int = 0, arrival_ns: int = 1_000, timeout_us: int = 0, batch: int = 1) -> InferenceRequest:
    return InferenceRequest("m", "", [], id=rid, priority=priority, arrival_ns=arrival_ns, timeout_us=timeout_us, batch_size=batch)


def _drain(queue: PriorityRequestQueue) -> list[str]:
    order = []
    for level in queue.ordered():
        while level:
            order.append(queue.pop_from(level).id)
    return order


def test_higher_priorities_are_served_first_and_fifo_within_a_level() -> None:
    queue = _queue("priority_levels: 3 default_priority_level: 2")
    for rid, priority in [("a", 3), ("b", 1), ("c", 0), ("d", 1), ("e", 7)]:  # 0 and out-of-range: the default (2)
        queue.push(_request(rid, priority))
    assert queue.size == 5 and bool(queue)
    assert _drain(queue) == ["b", "d", "c", "e", "a"]
    assert queue.size == 0 and queue.items == 0 and not queue


def test_items_count_batch_sizes_and_oldest_arrival_spans_levels() -> None:
    queue = _queue("priority_levels: 2 default_priority_level: 1")
    queue.push(_request("late", 1, arrival_ns=500, batch=3))
    queue.push(_request("early", 2, arrival_ns=100, batch=2))
    assert (queue.size, queue.items) == (2, 5)
    assert queue.oldest_arrival_ns() == 100


def test_max_queue_size_refuses_with_unavailable_per_level() -> None:
    queue = _queue(
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { max_queue_size: 1 } }"
    )
    queue.push(_request("first", 1))
    with pytest.raises(NereidError) as refused:
        queue.push(_request("second", 1))
    assert refused.value.status == Status.UNAVAILABLE
    assert refused.value.message == "Exceeds maximum queue size"
    queue.push(_request("other level", 2))  # level 2 has no bound
    assert queue.size == 2


def test_reject_timeout_returns_expired_requests_and_forgets_them() -> None:
    queue = _queue("default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100 }")
    queue.push(_request("old", arrival_ns=0, batch=2))
    queue.push(_request("new", arrival_ns=90_000))
    assert queue.expire(99_999) == []
    rejected = queue.expire(100_000)
    assert [r.id for r in rejected] == ["old"]
    assert (queue.size, queue.items) == (1, 1)
    assert _drain(queue) == ["new"]


def test_delay_timeout_moves_expired_requests_behind_everything_else() -> None:
    queue = _queue("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 }")
    queue.push(_request("expires", arrival_ns=0))
    queue.push(_request("fresh", arrival_ns=1_000_000))
    assert queue.expire(10_000) == []
    assert queue.size == 2
    assert _drain(queue) == ["fresh", "expires"]


def test_a_request_timeout_overrides_the_default_only_when_allowed() -> None:
    allowed = _queue("default_queue_policy { default_timeout_microseconds: 1000000 allow_timeout_override: true }")
    allowed.push(_request("short", arrival_ns=0, timeout_us=5))
    assert [r.id for r in allowed.expire(5_000)] == ["short"]
    fixed = _queue("default_queue_policy { default_timeout_microseconds: 1000000 }")
    fixed.push(_request("short", arrival_ns=0, timeout_us=5))
    assert fixed.expire(5_000) == []
    assert [r.id for r in fixed.expire(1_000_000_000)] == ["short"]


def test_a_queue_without_policies_says_so_and_never_expires() -> None:
    queue = _queue("")
    assert not queue.has_policies
    queue.push(_request("a", arrival_ns=0, timeout_us=1))
    assert queue.expire(10**18) == [] and queue.size == 1
    assert _queue("priority_levels: 2").has_policies


def test_queue_policy_from_proto_reads_tritons_fields() -> None:
    config = parse_pbtxt(
        'name: "m" backend: "python" max_batch_size: 8 dynamic_batching { default_queue_policy { timeout_action: DELAY '
        "default_timeout_microseconds: 7 allow_timeout_override: true max_queue_size: 3 } }",
        "m",
    )
    assert QueuePolicy.from_proto(config.dynamic_batching.default_queue_policy) == QueuePolicy(
        reject_on_timeout=False, default_timeout_us=7, allow_timeout_override=True, max_queue_size=3
    )


def _by_width(request: InferenceRequest) -> object:
    return request.parameters["width"]


def test_take_batch_passes_over_other_shapes_which_keep_their_places_and_counts() -> None:
    queue = _queue("priority_levels: 2 default_priority_level: 2")
    for rid, priority, width in [("a", 1, 2), ("b", 1, 3), ("c", 2, 2), ("d", 2, 2)]:
        request = _request(rid, priority, batch=2)
        request.parameters["width"] = width
        queue.push(request)
    batch, cancelled = queue.take_batch(6, _by_width)
    assert [r.id for r in batch] == ["a", "c", "d"] and cancelled == []
    assert (queue.size, queue.items) == (1, 2)
    assert _drain(queue) == ["b"]


def test_take_batch_stops_before_a_request_that_would_pass_the_limit_and_drops_cancelled_ones() -> None:
    queue = _queue("")
    for rid, batch_size in [("a", 2), ("gone", 1), ("b", 3), ("c", 1)]:
        queue.push(_request(rid, batch=batch_size))
    queue._levels[0][1].cancelled = True
    batch, cancelled = queue.take_batch(4, None)
    assert [r.id for r in batch] == ["a"] and [r.id for r in cancelled] == ["gone"]
    assert (queue.size, queue.items) == (2, 4)
    assert [r.id for r in queue.take_batch(4, None)[0]] == ["b", "c"]
    assert (queue.size, queue.items) == (0, 0) and not queue
