"""The LLM engine's waiting queue: a bound on waiting requests and prompt tokens that refuses past it at once
(back-pressure instead of an unbounded backlog), and the admission order: preempted sequences first, then
the lowest `priority` value, then, among equal priorities, the user with the fewest running sequences and,
between those, the one served least recently (round-robin between users), first come first served within a
user.

It orders jobs and counts them; it never allocates KV blocks or runs the model.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["WaitingQueue", "RETRY_AFTER_SECONDS"]

RETRY_AFTER_SECONDS = 1.0  # what a refused client is told to wait before trying again


class WaitingQueue:
    """`offer` runs on any thread (the request's); everything else on the engine thread."""

    def __init__(self, max_reqs: int, max_tokens: int, where: str = "") -> None:
        self.max_reqs = max_reqs
        self.max_tokens = max_tokens
        self._where = f"{where} " if where else ""
        self._lock = threading.Lock()
        self._reqs = 0  # admitted, not yet running (preempted sequences are not counted: they were admitted)
        self._tokens = 0
        self.refused = 0
        self._seq = 0
        self._preempted: deque[Any] = deque()
        # priority -> user -> that user's jobs in arrival order
        self._levels: dict[int, dict[str, deque[Any]]] = {}
        self._size = 0
        self._served = 0
        self._last_served: dict[str, int] = {}  # user -> when a job of theirs last started

    # -- any thread ------------------------------------------------------------------------------
    def offer(self, job: Any) -> None:
        """Count a new job in, or refuse it with an overloaded error naming the limit it would cross."""
        tokens = len(job.prompt_ids)
        with self._lock:
            if self._reqs + 1 > self.max_reqs:
                self.refused += 1
                raise NereidError.overloaded(
                    f"{self._where}the server is overloaded: {self._reqs} requests are waiting, the limit "
                    f"(max_num_queued_reqs) is {self.max_reqs}; retry later"
                )
            if self._tokens + tokens > self.max_tokens and self._reqs > 0:
                self.refused += 1
                raise NereidError.overloaded(
                    f"{self._where}the server is overloaded: {self._tokens} prompt tokens are waiting and this request "
                    f"adds {tokens}, the limit (max_num_queued_tokens) is {self.max_tokens}; retry later"
                )
            self._reqs += 1
            self._tokens += tokens
            self._seq += 1
            job.seq = self._seq

    def forget(self, job: Any) -> None:
        """Uncount a job that `offer` accepted but that never reached `push` (an engine failing it early)."""
        self._uncount(job)

    def _uncount(self, job: Any) -> None:
        with self._lock:
            self._reqs -= 1
            self._tokens -= len(job.prompt_ids)

    @property
    def queued_requests(self) -> int:
        return self._reqs

    @property
    def queued_tokens(self) -> int:
        return self._tokens

    # -- the engine thread -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size + len(self._preempted)

    def push(self, job: Any) -> None:
        users = self._levels.setdefault(job.priority, {})
        queue = users.get(job.user)
        if queue is None:
            queue = users[job.user] = deque()
        queue.append(job)
        self._size += 1

    def push_preempted(self, job: Any) -> None:
        """A preempted sequence goes back at the head: it resumes before anything new starts."""
        self._preempted.appendleft(job)

    def order(self, running_per_user: Mapping[str, int]) -> Iterator[Any]:
        """Jobs in admission order. The caller admits a yielded job with `take(job)` before asking for the
        next one, or stops iterating: a job that does not fit is never overtaken (no starving long prompts)."""
        while self._preempted:
            yield self._preempted[0]
        for priority in sorted(self._levels):
            users = self._levels[priority]
            last = self._last_served
            heap = [(running_per_user.get(user, 0), last.get(user, 0), queue[0].seq, user) for user, queue in users.items() if queue]
            heapq.heapify(heap)
            while heap:
                running, _last, _seq, user = heapq.heappop(heap)
                yield users[user][0]
                queue = users.get(user)  # `take` removes a user whose queue it empties
                if queue:
                    heapq.heappush(heap, (running + 1, last.get(user, 0), queue[0].seq, user))

    def take(self, job: Any) -> None:
        """Remove `job`, which `order` just yielded, from the head of its queue."""
        if self._preempted and self._preempted[0] is job:
            self._preempted.popleft()
            return
        queue = self._levels[job.priority][job.user]
        assert queue[0] is job
        queue.popleft()
        self._served += 1
        if len(self._last_served) > 65536:  # forget long-gone users now and then; only the order among the rest matters
            self._last_served.clear()
        self._last_served[job.user] = self._served
        if not queue:
            users = self._levels[job.priority]
            del users[job.user]
            if not users:
                del self._levels[job.priority]
        self._size -= 1
        self._uncount(job)

    def drop_cancelled(self) -> list[Any]:
        """Remove and return the jobs whose clients went away."""
        gone = [job for job in self._preempted if job.cancelled()]
        if gone:
            self._preempted = deque(job for job in self._preempted if not job.cancelled())
        for users in self._levels.values():
            for user, queue in list(users.items()):
                if any(job.cancelled() for job in queue):
                    kept: deque[Any] = deque()
                    for job in queue:
                        if job.cancelled():
                            gone.append(job)
                            self._size -= 1
                            self._uncount(job)
                        else:
                            kept.append(job)
                    if kept:
                        users[user] = kept
                    else:
                        del users[user]
        for priority in [p for p, users in self._levels.items() if not users]:
            del self._levels[priority]
        return gone

    def drain(self) -> list[Any]:
        """Everything, for an engine that is stopping."""
        jobs = list(self._preempted)
        self._preempted.clear()
        for users in self._levels.values():
            for queue in users.values():
                for job in queue:
                    self._uncount(job)
                jobs.extend(queue)
        self._levels.clear()
        self._size = 0
        return jobs
