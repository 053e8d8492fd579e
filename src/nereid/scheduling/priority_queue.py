"""The dynamic batcher's queue: one FIFO per priority level, each with Triton's queue policy
(max_queue_size, default timeout with REJECT or DELAY, per-request timeout override). It keeps its own counts
and forms the next batch where it stands; it never executes or answers a request."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest

__all__ = ["QueuePolicy", "PriorityRequestQueue"]


@dataclass(slots=True, frozen=True)
class QueuePolicy:
    reject_on_timeout: bool = True
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_proto(cls, policy: Any) -> QueuePolicy:
        return cls(
            reject_on_timeout=policy.timeout_action != mc.ModelQueuePolicy.DELAY,
            default_timeout_us=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )


class PriorityRequestQueue:
    """Level 0 holds priority 1 (the highest). A request's deadline is fixed when it is queued."""

    def __init__(self, config: ModelConfig) -> None:
        db = config.dynamic_batching
        self.levels_count = max(db.priority_levels, 1)
        self.default_level = (db.default_priority_level or 1) if db.priority_levels else 1
        default_policy = QueuePolicy.from_proto(db.default_queue_policy) if db.HasField("default_queue_policy") else QueuePolicy()
        self._policies = [
            QueuePolicy.from_proto(db.priority_queue_policy[level])
            if level in db.priority_queue_policy
            else default_policy
            for level in range(1, self.levels_count + 1)
        ]
        self._levels: list[collections.deque[InferenceRequest]] = [collections.deque() for _ in range(self.levels_count)]
        # Requests whose DELAY timeout expired: served only after everything else.
        self._delayed: collections.deque[InferenceRequest] = collections.deque()
        # Every queue in service order, made once (the deques are changed in place, never replaced).
        self._in_order = [*self._levels, self._delayed]
        # Only the queue changes these: requests queued, and the batch items they hold (batch size 4 counts 4).
        self.size = 0
        self.items = 0
        self._has_timeouts = any(p.default_timeout_us or p.allow_timeout_override for p in self._policies)
        # Anything that acts on queued requests: priorities, timeouts, queue bounds.
        self.has_policies = self.levels_count > 1 or self._has_timeouts or any(p.max_queue_size for p in self._policies)

    def _level(self, request: InferenceRequest) -> int:
        priority = request.priority
        if priority < 1 or priority > self.levels_count:
            priority = self.default_level
        return priority - 1

    def push(self, request: InferenceRequest) -> None:
        level = self._level(request)
        policy = self._policies[level]
        queue = self._levels[level]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise NereidError.unavailable("Exceeds maximum queue size")
        if self._has_timeouts:
            timeout_us = policy.default_timeout_us
            if policy.allow_timeout_override and request.timeout_us:
                timeout_us = request.timeout_us
            request.deadline_ns = request.arrival_ns + timeout_us * 1000 if timeout_us else 0
        queue.append(request)
        self.size += 1
        self.items += request.batch_size

    def expire(self, now_ns: int) -> list[InferenceRequest]:
        """Remove requests past their deadline: REJECT ones are returned, DELAY ones move to the back."""
        if not self._has_timeouts:
            return []
        rejected: list[InferenceRequest] = []
        for level, queue in enumerate(self._levels):
            if not queue or not any(r.deadline_ns and r.deadline_ns <= now_ns for r in queue):
                continue
            reject = self._policies[level].reject_on_timeout
            kept: list[InferenceRequest] = []
            for request in queue:
                if request.deadline_ns and request.deadline_ns <= now_ns:
                    request.deadline_ns = 0
                    if reject:
                        rejected.append(request)
                        self.size -= 1
                        self.items -= request.batch_size
                    else:
                        self._delayed.append(request)
                else:
                    kept.append(request)
            queue.clear()
            queue.extend(kept)
        return rejected

    def __bool__(self) -> bool:
        return self.size > 0

    def oldest_arrival_ns(self) -> int:
        return min(q[0].arrival_ns for q in (*self._levels, self._delayed) if q)

    def ordered(self) -> Iterator[collections.deque[InferenceRequest]]:
        return iter(self._in_order)

    def pop_from(self, queue: collections.deque[InferenceRequest]) -> InferenceRequest:
        request = queue.popleft()
        self.size -= 1
        self.items -= request.batch_size
        return request

    def take_batch(
        self, limit: int, key: Callable[[InferenceRequest], object] | None
    ) -> tuple[list[InferenceRequest], list[InferenceRequest]]:
        """Take the next batch of at most `limit` items, highest priority first (the delayed requests last):
        the requests whose `key` (their shapes) matches the batch's first request, passing over the others,
        which keep their places. Returns the batch and the cancelled requests met on the way (removed too)."""
        batch: list[InferenceRequest] = []
        cancelled: list[InferenceRequest] = []
        size = 0
        batch_key: object = None
        for level in self._in_order:
            if not level:
                continue
            # The cursor: requests of another shape are set aside while it walks and put back in front after.
            passed: list[InferenceRequest] | None = None
            while level and size < limit:
                candidate = level[0]
                if candidate.cancelled:
                    cancelled.append(self.pop_from(level))
                    continue
                if batch and size + candidate.batch_size > limit:
                    break
                level.popleft()
                if key is not None:
                    candidate_key = key(candidate)
                    if not batch:
                        batch_key = candidate_key
                    elif candidate_key != batch_key:
                        if passed is None:
                            passed = []
                        passed.append(candidate)
                        continue
                batch.append(candidate)
                size += candidate.batch_size
            if passed:
                level.extendleft(reversed(passed))
            if size >= limit:
                break
        self.size -= len(batch)
        self.items -= size
        return batch, cancelled
