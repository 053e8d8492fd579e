"""The paged KV cache's bookkeeping and the waiting queue, without a model: allocation, prefix sharing with
reference counts, LRU eviction of cached blocks, the queue's bounds and its admission order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from nereid.backends.llm.block_manager import BlockManager, block_keys
from nereid.backends.llm.waiting_queue import WaitingQueue
from nereid.core.errors import NereidError, Status


def _cache_sequence(manager: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate and cache the full blocks of `tokens` as the engine does once they are computed."""
    bs = manager.block_size
    count = len(tokens) // bs
    blocks = manager.allocate(count)
    assert blocks is not None
    for block, key in zip(blocks, block_keys(tokens, bs, count)):
        manager.cache_block(block, key)
    return blocks


def test_block_manager_allocates_until_the_pool_is_empty_and_takes_nothing_when_it_cannot() -> None:
    manager = BlockManager(num_blocks=8, block_size=4)
    first = manager.allocate(5)
    assert first == [0, 1, 2, 3, 4] and manager.num_available == 3 and manager.num_used == 5
    assert manager.allocate(4) is None
    assert manager.num_available == 3  # a refused allocation took nothing
    rest = manager.allocate(3)
    assert rest is not None and manager.num_available == 0
    manager.free(first)
    assert manager.num_available == 5 and manager.high_water == 8
    assert manager.allocate(1) == [first[0]]  # the most recently freed block is reused first (memory already touched)
    with pytest.raises(RuntimeError):
        manager.free([first[1]])  # freed twice


def test_block_manager_shares_a_cached_prefix_and_leaves_the_last_token_to_compute() -> None:
    manager = BlockManager(num_blocks=16, block_size=4)
    system = list(range(100, 112))  # three full blocks
    owner = _cache_sequence(manager, system)
    # Another prompt with the same 12-token prefix and more: all three blocks are shared.
    hits, keys = manager.match_prefix(system + [7, 8, 9])
    assert hits == owner and len(keys) == 3
    assert all(manager.refcount(block) == 2 for block in owner)
    assert manager.prefix_queries == 15 and manager.prefix_hits == 12
    # A prompt that is exactly the cached prefix: the last block is left out so its last token is computed.
    again, _ = manager.match_prefix(system)
    assert again == owner[:2]
    # The same tokens after a different beginning are a different prefix: no hit.
    other, _ = manager.match_prefix([1, 2, 3, 4] + system)
    assert other == []
    manager.free(hits)
    manager.free(again)
    assert all(manager.refcount(block) == 1 for block in owner)


def test_block_manager_keeps_released_prefixes_reusable_until_the_pool_needs_them() -> None:
    manager = BlockManager(num_blocks=6, block_size=2)
    blocks = _cache_sequence(manager, [1, 2, 3, 4])
    manager.free(blocks)  # the sequence finished (or was cancelled): nobody references the blocks
    assert manager.num_used == 0 and manager.num_available == 6 and manager.num_cached == 2
    hits, _ = manager.match_prefix([1, 2, 3, 4, 5])
    assert hits == blocks and manager.num_used == 2  # a hit takes them back out of the evictable set
    manager.free(hits)
    # Free blocks go first: the four never-cached blocks are used before any cached one is evicted.
    fresh = manager.allocate(4)
    assert fresh is not None and not set(fresh) & set(blocks)
    assert manager.match_prefix([1, 2, 3, 4, 5])[0] == blocks
    manager.free(blocks)
    manager.free(fresh)


def test_block_manager_evicts_the_least_recently_used_cached_blocks_first() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    old = _cache_sequence(manager, [1, 2, 3, 4])
    new = _cache_sequence(manager, [5, 6, 7, 8])
    manager.free(old)
    manager.free(new)
    # Touch the old prefix: it becomes the most recently used.
    touched, _ = manager.match_prefix([1, 2, 3, 4, 9])
    manager.free(touched)
    taken = manager.allocate(2)
    assert taken is not None and set(taken) == set(new)  # the untouched prefix went first
    assert manager.match_prefix([5, 6, 7, 8, 9])[0] == []
    assert manager.match_prefix([1, 2, 3, 4, 9])[0] == old
    assert manager.num_cached == 2


def test_block_manager_without_prefix_caching_never_matches() -> None:
    manager = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    blocks = _cache_sequence(manager, [1, 2, 3, 4])
    manager.free(blocks)
    assert manager.match_prefix([1, 2, 3, 4, 5]) == ([], []) and manager.num_cached == 0


@dataclass(eq=False)
class _Job:
    prompt_ids: list[int]
    priority: int = 0
    user: str = ""
    seq: int = 0
    gone: bool = False
    name: str = ""
    output_ids: list[int] = field(default_factory=list)

    def cancelled(self) -> bool:
        return self.gone


def _admit_all(queue: WaitingQueue, running: dict[str, int]) -> list[str]:
    """Take every job in the queue's order, counting each started job as running for its user."""
    names = []
    order = queue.order(running)
    for job in order:
        queue.take(job)
        running[job.user] = running.get(job.user, 0) + 1
        names.append(job.name)
    return names


def test_waiting_queue_refuses_past_its_bounds_with_an_overloaded_error_naming_the_limit() -> None:
    queue = WaitingQueue(max_reqs=2, max_tokens=10, where="[model 'm']")
    a, b = _Job([1] * 4, name="a"), _Job([1] * 4, name="b")
    queue.offer(a)
    queue.offer(b)
    with pytest.raises(NereidError) as info:
        queue.offer(_Job([1]))
    assert info.value.status is Status.UNAVAILABLE and info.value.retry_after is not None
    assert "max_num_queued_reqs" in info.value.message and "[model 'm']" in info.value.message
    queue.push(a)
    queue.push(b)
    assert _admit_all(queue, {}) == ["a", "b"]
    assert queue.queued_requests == 0 and queue.queued_tokens == 0
    queue.offer(_Job([1] * 6))
    with pytest.raises(NereidError) as info:
        queue.offer(_Job([1] * 6))  # 12 tokens > 10
    assert "max_num_queued_tokens" in info.value.message
    assert queue.refused == 2


def test_waiting_queue_orders_by_priority_then_the_user_with_fewest_running() -> None:
    queue = WaitingQueue(100, 10_000)
    jobs = [_Job([1], user="heavy", name=f"h{i}") for i in range(4)]
    jobs += [_Job([1], user="light", name="l0"), _Job([1], user="other", priority=-1, name="urgent")]
    for job in jobs:
        queue.offer(job)
        queue.push(job)
    # The urgent job first whatever its arrival; then users take turns, the heavy user's backlog last.
    assert _admit_all(queue, {}) == ["urgent", "h0", "l0", "h1", "h2", "h3"]
    for job in jobs[:5]:
        queue.offer(job)
        queue.push(job)
    # A user who already runs sequences waits behind one who runs none.
    assert _admit_all(queue, {"heavy": 3}) == ["l0", "h0", "h1", "h2", "h3"]


def test_waiting_queue_puts_preempted_jobs_first_and_drops_cancelled_ones() -> None:
    queue = WaitingQueue(100, 10_000)
    jobs = [_Job([1, 2], name=f"j{i}") for i in range(3)]
    for job in jobs:
        queue.offer(job)
        queue.push(job)
    preempted = _Job([5], priority=9, name="preempted")
    queue.push_preempted(preempted)
    jobs[1].gone = True
    assert queue.drop_cancelled() == [jobs[1]]
    assert len(queue) == 3 and queue.queued_requests == 2 and queue.queued_tokens == 4
    assert _admit_all(queue, {}) == ["preempted", "j0", "j2"]
    assert len(queue) == 0 and queue.queued_requests == 0


def test_waiting_queue_order_stops_where_the_caller_stops() -> None:
    """A job that does not fit is not overtaken: the caller stops and the job stays at the head."""
    queue = WaitingQueue(100, 10_000)
    jobs: list[Any] = [_Job([1], name=f"j{i}") for i in range(3)]
    for job in jobs:
        queue.offer(job)
        queue.push(job)
    first = next(iter(queue.order({})))
    assert first is jobs[0]
    assert _admit_all(queue, {}) == ["j0", "j1", "j2"]
