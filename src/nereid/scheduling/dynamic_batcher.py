"""The batching scheduler: one worker per instance takes requests from a shared priority queue, merging
them into batches up to max_batch_size within max_queue_delay (one request per execution when the model
has no dynamic_batching). Queue policies, cancellation and preserve_ordering are applied here. Instances may be
added and removed while it serves (an instance update): a removed one finishes the batches it holds first."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from nereid.backends.base import BackendInstance
from nereid.config.model_config import ModelConfig
from nereid.core.capabilities import GroupInstance, PipelinedInstance
from nereid.core.errors import NereidError, Status
from nereid.core.polling_policy import PollingPolicy
from nereid.core.precise_timer import PreciseTimer
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.scheduling.batch_forming import BatchSizes, shape_key
from nereid.scheduling.batch_runner import BatchRunner
from nereid.scheduling.priority_queue import PriorityRequestQueue
from nereid.scheduling.rate_limiter import InstanceLimits, RateLimiter

__all__ = ["BatchingScheduler"]


def _resolve(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_RETIRE = object()  # what an idle worker of a removed instance is woken with


@dataclass(slots=True, eq=False)
class _Serving:
    """One instance the scheduler hands batches to, and its worker loops (two for a pipelined instance)."""

    instance: BackendInstance
    limits: InstanceLimits
    loops: int = 0  # running worker loops
    retiring: bool = False  # removed: its loops end after the batch each runs
    parked: set[asyncio.Future[object]] = field(default_factory=set)  # its idle loops' waiters
    gone: asyncio.Future[None] | None = None  # resolved once its last loop has ended


class BatchingScheduler:
    def __init__(
        self,
        config: ModelConfig,
        instances: list[BackendInstance],
        stats: ModelStatistics,
        rate_limiter: RateLimiter | None = None,
        limits: list[InstanceLimits] | None = None,
        polling: PollingPolicy | None = None,
    ) -> None:
        self._stats = stats
        self._polling = polling
        self._decoupled = config.model_transaction_policy.decoupled
        self._runner = BatchRunner(config.name, stats, self._decoupled)
        self._queue = PriorityRequestQueue(config)
        self._idle: collections.deque[asyncio.Future[object]] = collections.deque()
        # Idle second loops of pipelined instances: woken only when no instance is idle, so work spreads
        # over instances before it queues behind a busy one.
        self._idle_pipelined: collections.deque[asyncio.Future[object]] = collections.deque()
        self._fill_waiters: list[asyncio.Future[None]] = []
        # Idle instances' loops woken for a request that have not run yet: a group leaves them a request each, so two
        # requests that arrive together go to two idle instances, not as one group to whichever loop runs first.
        self._waking = 0
        # Of those, the ones running toward their batch (holding it open for the queue delay): a batch leaves each a
        # share of the queue, so a burst runs on every instance it woke.
        self._forming = 0
        self._busy = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        batching = config.max_batch_size > 0 and config.HasField("dynamic_batching")
        db = config.dynamic_batching
        self._sizes = BatchSizes(config.max_batch_size, db.preferred_batch_size) if batching else BatchSizes(1)
        self._delay_ns = db.max_queue_delay_microseconds * 1000 if batching else 0
        ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        # One request per execution needs no shapes compared.
        self._shape_key = functools.partial(shape_key, ragged=ragged) if self._sizes.max_batch > 1 else None
        # Requests of a model without batching that queue behind a running one may go to an instance together.
        self._groups = self._sizes.max_batch == 1 and not self._decoupled
        # preserve_ordering: responses leave in arrival order even when instances finish out of order.
        self._ordered = batching and db.preserve_ordering
        self._next_ticket = 0
        self._next_to_send = 0
        self._held: dict[int, tuple[InferenceRequest, InferenceResponse]] = {}
        self._tickets: dict[int, int] = {}
        self._limiter = rate_limiter if rate_limiter is not None and rate_limiter.enabled else None
        # A batch handed to a pipelined instance while it runs another still awaits execution: it stays in
        # nv_inference_pending_request_count, as in Triton, until the batch before it ends. So do the requests of a
        # group behind its first (the worker runs them one after another and says nothing until the group ends).
        # Instance id -> (requests that start with it, requests that wait in it until it ends) of each batch or group
        # the instance holds, the running one first.
        self._in_instance: dict[int, list[tuple[int, int]]] = {}
        self._serving: dict[int, _Serving] = {}  # instance id -> its loops' state
        self._workers: set[asyncio.Task[None]] = set()
        for instance, instance_limits in zip(instances, limits or [InstanceLimits() for _ in instances]):
            self.add_instance(instance, instance_limits)

    def add_instance(self, instance: BackendInstance, limits: InstanceLimits) -> None:
        """Start handing batches to `instance`. It may take a second batch while it executes one (the Python
        backend queues it in its worker), so the worker never idles while the server prepares the next batch."""
        loop = asyncio.get_running_loop()
        serving = _Serving(instance, limits)
        self._serving[id(instance)] = serving
        self._in_instance[id(instance)] = []
        for depth in range(self._depth(instance)):
            serving.loops += 1
            task = loop.create_task(self._work(serving, self._idle if depth == 0 else self._idle_pipelined))
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    def remove_instance(self, instance: BackendInstance) -> asyncio.Future[None]:
        """Hand `instance` nothing more; resolved once the batches it holds have ended (the caller closes it)."""
        serving = self._serving.pop(id(instance))
        serving.retiring = True
        serving.gone = asyncio.get_running_loop().create_future()
        if not serving.loops:
            serving.gone.set_result(None)
        for waiter in serving.parked:
            if not waiter.done():
                (self._idle if waiter in self._idle else self._idle_pipelined).remove(waiter)
                waiter.set_result(_RETIRE)
        return serving.gone

    def _depth(self, instance: BackendInstance) -> int:
        """Batches an instance may hold at once. A batch handed over early can no longer be reordered,
        timed out or cancelled in the queue, so models that use priorities or queue policies, and the rate
        limiter (whose grants are per execution), keep one."""
        if self._limiter is not None or self._queue.has_policies:
            return 1
        return instance.pipelined_batches if isinstance(instance, PipelinedInstance) else 1

    # -- the server's side ------------------------------------------------------------------------
    def submit(self, request: InferenceRequest) -> None:
        if self._closed:
            raise NereidError.unavailable(f"model '{request.model_name}' is unloading")
        try:
            self._queue.push(request)
        except NereidError:
            self._stats.record_failure(0, "REJECTED")
            raise
        if self._ordered:
            self._tickets[id(request)] = self._next_ticket
            self._next_ticket += 1
        self._stats.pending += 1
        self._drained.clear()
        if self._idle:
            _resolve(self._idle.popleft())
            self._waking += 1
        elif self._idle_pipelined:
            _resolve(self._idle_pipelined.popleft())
        elif self._fill_waiters and self._queue.items >= self._sizes.target:
            for waiter in self._fill_waiters:
                _resolve(waiter)

    async def drain(self) -> None:
        await self._drained.wait()

    async def close(self) -> None:
        self._closed = True
        idle = self._busy == 0 and not self._queue
        await self.drain()
        for worker in self._workers:
            worker.cancel()
        # An idle scheduler's workers are parked on their idle futures and touch nothing once cancelled, so an
        # unload (an eviction holds the admission lock) need not wait the loop turns they take to end.
        if not idle:
            await asyncio.gather(*self._workers, return_exceptions=True)

    # -- the workers ------------------------------------------------------------------------------
    async def _work(self, serving: _Serving, idle: collections.deque[asyncio.Future[object]]) -> None:
        try:
            await self._serve(serving, idle)
        finally:
            serving.loops -= 1
            if serving.retiring and not serving.loops:
                del self._in_instance[id(serving.instance)]
                if serving.gone is not None and not serving.gone.done():
                    serving.gone.set_result(None)
            if serving.retiring and self._queue and self._idle:
                # A removed instance's loop woken for a request it will not take: wake another for it.
                _resolve(self._idle.popleft())
                self._waking += 1

    async def _serve(self, serving: _Serving, idle: collections.deque[asyncio.Future[object]]) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue
        instance, limits = serving.instance, serving.limits
        # A request handed over with others can no longer be reordered or cancelled in the queue: as for pipelining.
        grouped = instance if self._groups and self._depth(instance) > 1 and isinstance(instance, GroupInstance) else None
        fill_timer = PreciseTimer()  # the batch's queue delay, kept to the microsecond
        forming = False  # woken from idle for a request, and no batch taken since
        try:
            while not serving.retiring:
                if not queue:
                    if forming:
                        self._forming -= 1
                        forming = False
                    if self._busy == 0:
                        self._drained.set()
                    waiter: asyncio.Future[object] = loop.create_future()
                    idle.append(waiter)
                    serving.parked.add(waiter)
                    try:
                        woken = await waiter
                    finally:
                        serving.parked.discard(waiter)
                    if woken is _RETIRE:
                        return
                    if idle is self._idle:
                        self._waking -= 1
                        self._forming += 1
                        forming = True
                    continue
                self._busy += 1
                try:
                    if self._limiter is not None:
                        await self._limiter.acquire(limits)
                    try:
                        if self._delay_ns and queue.items < self._sizes.target:
                            await self._wait_for_fill(loop, fill_timer)
                        if grouped is not None and queue.items > 1:
                            batch = self._take_batch(self._group_limit(grouped))
                        elif idle is self._idle:
                            # Each instance's first loop shares with the other instances' first loops woken for the
                            # same requests (a pipelined second loop takes what is there: its own instance is busy).
                            batch = self._take_batch(share_with=self._waking + self._forming - forming)
                        else:
                            batch = self._take_batch()
                        if forming:
                            self._forming -= 1
                            forming = False
                        if batch:
                            await self._execute(instance, batch, grouped if len(batch) > 1 else None)
                        # An idle loop must not keep its last batch (its requests, their tensors) alive.
                        del batch
                    finally:
                        if self._limiter is not None:
                            self._limiter.release(limits)
                finally:
                    self._busy -= 1
        finally:
            if forming:
                self._forming -= 1

    def _group_limit(self, grouped: GroupInstance) -> int:
        """How many queued requests `grouped` may take as one group: what it allows, less one for each woken loop."""
        return max(1, min(grouped.group_limit, self._queue.items - self._waking))

    async def _wait_for_fill(self, loop: asyncio.AbstractEventLoop, timer: PreciseTimer) -> None:
        """Hold the batch open until it reaches its target size or the oldest request's delay runs out (to the
        microsecond, as Triton's: the loop's own timers count whole milliseconds)."""
        deadline_ns = self._queue.oldest_arrival_ns() + self._delay_ns
        if deadline_ns <= time.monotonic_ns():
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._fill_waiters.append(waiter)
        timer.start(deadline_ns, functools.partial(_resolve, waiter))
        if self._polling is not None:
            # A lone request's short wait: the loop polls through it rather than sleep and pay a halted CPU's wake.
            self._polling.hold_for_batch(self._delay_ns, deadline_ns)
        try:
            await waiter
        finally:
            timer.cancel()
            self._fill_waiters.remove(waiter)

    def _take_batch(self, limit: int = 0, share_with: int = 0) -> list[InferenceRequest]:
        """The next batch; with `limit`, that many requests of a model without batching at most (GroupInstance).
        `share_with`: other idle instances woken for these requests that have not taken theirs yet. Each is left its
        share, so a burst that arrives at once runs on every instance it woke, not as one batch on the first while
        the others stay idle."""
        queue = self._queue
        for request in queue.expire(time.monotonic_ns()):
            self._stats.pending -= 1
            self._reject(request, NereidError.unavailable("Request timeout expired"), "REJECTED")
        if not limit:
            limit = self._sizes.cut(queue.items)
            if share_with:
                limit = min(limit, -(-queue.items // (1 + share_with)))
        batch, cancelled = queue.take_batch(limit, self._shape_key)
        for request in cancelled:
            self._stats.pending -= 1
            self._reject(request, NereidError(Status.CANCELLED, "Request was cancelled"), "CANCELED")
        return batch

    def _executing(self, instance: object, count: int, grouped: bool) -> None:
        """A batch of `count` requests goes to `instance`: no longer pending once the instance runs it (a group's
        first request; the others once the group ends)."""
        batches = self._in_instance[id(instance)]
        starting = 1 if grouped else count
        batches.append((starting, count - starting))
        if len(batches) == 1:
            self._stats.pending -= starting

    def _executed(self, instance: object) -> None:
        batches = self._in_instance[id(instance)]
        _, waited_in_group = batches.pop(0)
        self._stats.pending -= waited_in_group
        if batches:
            self._stats.pending -= batches[0][0]  # the batch behind it runs now

    def _reject(self, request: InferenceRequest, error: NereidError, reason: str) -> None:
        self._deliver(request, self._runner.reject(request, error, reason))

    def _deliver(self, request: InferenceRequest, response: InferenceResponse) -> None:
        if not self._ordered:
            request.respond(response)
            return
        self._held[self._tickets.pop(id(request))] = (request, response)
        while self._next_to_send in self._held:
            held_request, held_response = self._held.pop(self._next_to_send)
            self._next_to_send += 1
            held_request.respond(held_response)

    async def _execute(
        self, instance: BackendInstance, batch: list[InferenceRequest], grouped: GroupInstance | None = None
    ) -> None:
        """Run a batch; with `grouped` (the same instance), run a group of a model without batching, each request on its
        own."""
        self._executing(instance, len(batch), grouped=grouped is not None)
        try:
            executed = await (self._runner.run(instance, batch) if grouped is None else self._runner.run_group(grouped, batch))
        finally:
            self._executed(instance)
        if isinstance(executed, NereidError):
            for request in batch:
                self._reject(request, executed, "BACKEND")
            return
        runner = self._runner
        if isinstance(executed, list):  # a group: one execution per request
            for request, one in zip(batch, executed):  # the statistics hold the group before its first response leaves
                runner.settle(request, one.responses[0], one)
            for request, one in zip(batch, executed):
                self._deliver(request, one.responses[0])
            return
        if self._decoupled:
            # The backend delivered a decoupled model's responses itself, through request.respond.
            for request in batch:
                runner.succeeded(request, executed)
            return
        runner.settle_all(batch, executed)  # the statistics hold the batch before its first response leaves
        for request, response in zip(batch, executed.responses):
            self._deliver(request, response)
