"""The batching scheduler: one worker per instance takes requests from a shared queue, merging them into
batches up to max_batch_size within max_queue_delay (no batching when the model has no dynamic_batching)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from nereid.backends.base import BackendInstance
from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BatchingScheduler"]

log = logging.getLogger("nereid.scheduler")


def _batch_key(request: InferenceRequest) -> tuple:
    """Requests can share a batch only when every non-batch dimension matches."""
    return tuple((t.name, t.shape[1:]) for t in request.inputs)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class BatchingScheduler:
    def __init__(self, config: ModelConfig, instances: list[BackendInstance], stats: ModelStatistics) -> None:
        self._stats = stats
        self._queue: collections.deque[InferenceRequest] = collections.deque()
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._busy = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        batching = config.max_batch_size > 0 and config.HasField("dynamic_batching")
        self._max_batch = config.max_batch_size if batching else 1
        db = config.dynamic_batching
        self._delay_s = db.max_queue_delay_microseconds / 1e6 if batching else 0.0
        preferred = sorted(db.preferred_batch_size) if batching else []
        self._target = preferred[-1] if preferred else self._max_batch
        self._ragged = any(t.allow_ragged_batch for t in config.input)
        self._fill_waiter: asyncio.Future[None] | None = None
        self._workers = [asyncio.get_running_loop().create_task(self._work(i)) for i in instances]

    # -- the server's side ------------------------------------------------------------------------
    def submit(self, request: InferenceRequest) -> None:
        if self._closed:
            raise NereidError.unavailable(f"model '{request.model_name}' is unloading")
        self._queue.append(request)
        self._stats.pending += 1
        self._drained.clear()
        if self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
        elif self._fill_waiter is not None and self._queued_items() >= self._target:
            if not self._fill_waiter.done():
                self._fill_waiter.set_result(None)

    async def drain(self) -> None:
        await self._drained.wait()

    async def close(self) -> None:
        self._closed = True
        await self.drain()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    # -- the workers ------------------------------------------------------------------------------
    def _queued_items(self) -> int:
        return sum(r.batch_size for r in self._queue)

    async def _work(self, instance: BackendInstance) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._mark_drained_if_idle()
                waiter = loop.create_future()
                self._idle.append(waiter)
                await waiter
                continue
            if self._delay_s and self._queued_items() < self._target:
                await self._wait_for_fill(loop)
                if not self._queue:
                    continue
            batch = self._take_batch()
            self._busy += 1
            try:
                await self._execute(instance, batch)
            finally:
                self._busy -= 1

    async def _wait_for_fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hold the batch open until it reaches its target size or the oldest request's delay runs out."""
        oldest = self._queue[0].arrival_ns / 1e9
        remaining = oldest + self._delay_s - time.monotonic()
        if remaining <= 0:
            return
        waiter = loop.create_future()
        self._fill_waiter = waiter
        handle = loop.call_later(remaining, _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._fill_waiter = None

    def _take_batch(self) -> list[InferenceRequest]:
        queue = self._queue
        first = queue.popleft()
        batch = [first]
        size = first.batch_size
        if self._max_batch > 1:
            key = None if self._ragged else _batch_key(first)
            skipped: list[InferenceRequest] = []
            while queue and size < self._max_batch:
                candidate = queue[0]
                if size + candidate.batch_size > self._max_batch:
                    break
                queue.popleft()
                if key is not None and _batch_key(candidate) != key:
                    skipped.append(candidate)
                    continue
                batch.append(candidate)
                size += candidate.batch_size
            queue.extendleft(reversed(skipped))
        self._stats.pending -= len(batch)
        return batch

    def _mark_drained_if_idle(self) -> None:
        if not self._queue and self._busy == 0:
            self._drained.set()

    async def _execute(self, instance: BackendInstance, batch: list[InferenceRequest]) -> None:
        stats = self._stats
        start = time.monotonic_ns()
        try:
            responses, times = await instance.execute(batch)
        except NereidError as exc:
            self._fail_all(batch, exc, start)
            return
        except Exception as exc:  # a backend bug must fail its requests, never the worker
            log.exception("instance %s failed", instance.name)
            self._fail_all(batch, NereidError.internal(f"{type(exc).__name__}: {exc}"), start)
            return
        if len(responses) != len(batch):
            self._fail_all(
                batch,
                NereidError.internal(
                    f"model '{batch[0].model_name}' returned {len(responses)} responses for {len(batch)} requests"
                ),
                start,
            )
            return
        end = time.monotonic_ns()
        ok = [r for r, resp in zip(batch, responses, strict=False) if resp.error is None]
        if ok:
            stats.record_execution(
                sum(r.batch_size for r in ok),
                len(ok),
                times.compute_input_ns,
                times.compute_infer_ns,
                times.compute_output_ns,
            )
        for request, response in zip(batch, responses, strict=False):
            if response.error is None:
                stats.record_success(end - request.arrival_ns, start - request.arrival_ns)
            else:
                stats.record_failure(end - request.arrival_ns)
            request.respond(response)

    def _fail_all(self, batch: list[InferenceRequest], error: NereidError, start: int) -> None:
        end = time.monotonic_ns()
        for request in batch:
            self._stats.record_failure(end - request.arrival_ns)
            request.respond(InferenceResponse(request.model_name, request.model_version, request.id, error=error))
