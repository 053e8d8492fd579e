"""Triton's sequence batcher: a sequence (correlation ID) holds a batch slot of one instance from START to
END, so its requests run on that instance in order with Triton's control tensors and implicit state; the
direct and oldest strategies batch across sequences, a backlog waits for slots and idle sequences are
released. Instances may be added and removed while it serves (an instance update): a removed one takes no new
sequence and goes once the sequences it holds have ended, as in Triton. It only schedules: it never builds tensors
(sequence_controls, sequence_state) nor runs models."""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from nereid.backends.base import BackendInstance
from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError, Status
from nereid.core.precise_timer import PreciseTimer
from nereid.core.settings import SchedulerDelay
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.scheduling.batch_forming import BatchSizes, shape_key
from nereid.scheduling.batch_runner import BatchRunner, Executed
from nereid.scheduling.rate_limiter import InstanceLimits, RateLimiter
from nereid.scheduling.response_order import ResponseOrder
from nereid.scheduling.sequence_controls import SEQUENCE_END, SEQUENCE_START, SequenceControls
from nereid.scheduling.sequence_slots import RELEASE, Backlog, CorrelationId, Release, Slot
from nereid.scheduling.sequence_state import ImplicitState

__all__ = ["SequenceBatcher"]

log = logging.getLogger("nereid.sequence_batcher")

# Triton's default when max_sequence_idle_microseconds is 0, and how often a backlogged idle sequence is
# looked at again.
_DEFAULT_IDLE_US = 1_000_000
_BACKLOG_IDLE_RECHECK_NS = 50_000_000
# How often an instance held by TRITONSERVER_DELAY_SCHEDULER counts the waiting requests again (Triton's 10 ms).
_DELAY_RECHECK_NS = 10_000_000

def _is_end(request: InferenceRequest) -> bool:
    return bool(request.flags & SEQUENCE_END)


def _zeros_like(tensor: InputTensor) -> InputTensor:
    data = np.full(tensor.shape, b"", dtype=object) if tensor.data.dtype == object else np.zeros_like(tensor.data)
    return InputTensor(tensor.name, tensor.datatype, tensor.shape, data)


class SequenceBatcher:
    def __init__(
        self,
        config: ModelConfig,
        instances: list[BackendInstance],
        stats: ModelStatistics,
        rate_limiter: RateLimiter | None = None,
        limits: list[InstanceLimits] | None = None,
        model_path: Path | None = None,
        delay: SchedulerDelay | None = None,
    ) -> None:
        self._model = config.name
        # Triton's testing hook (SchedulerDelay): instances hold their first batch until enough requests wait.
        self._delay = delay if delay is not None and delay.queued > 0 else None
        self._stats = stats
        self._decoupled = config.model_transaction_policy.decoupled
        # A sequence batch's size is its slots (fillers included), as Triton counts it.
        self._runner = BatchRunner(config.name, stats, self._decoupled, slot_batches=True)
        self._controls = SequenceControls(config)
        self._states = ImplicitState(config, model_path)
        self._batching = config.max_batch_size > 0
        self._ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        sb = config.sequence_batching
        self._idle_ns = (sb.max_sequence_idle_microseconds or _DEFAULT_IDLE_US) * 1000
        # iterative_sequence: a request without a correlation ID starts a sequence of its own, which the model
        # runs over several executions by releasing the request with RESCHEDULE; ids counted from 1, as Triton.
        self._iterative = sb.iterative_sequence
        self._next_sequence_id = 1
        self._iterating: set[int] = set()  # id() of requests rescheduled at least once and not yet finished
        self._added_inputs = frozenset(self._controls.names) | frozenset(self._states.input_names)
        max_batch = max(1, config.max_batch_size)
        oldest = sb.WhichOneof("strategy_choice") == "oldest"
        slot_count = max_batch
        if oldest and sb.oldest.max_candidate_sequences > 0:
            slot_count = sb.oldest.max_candidate_sequences
        self._limiter = rate_limiter if rate_limiter is not None and rate_limiter.enabled else None
        if not instances:
            raise NereidError.internal(f"model '{self._model}': the sequence batcher needs at least one instance")
        # Each instance's batcher, made as instances are added; its order number puts the earlier instance's free
        # slot first among slots of equal index.
        self._new_batcher = functools.partial(
            _OldestBatcher if oldest else _DirectBatcher, self, slot_count=slot_count,
            strategy=sb.oldest if oldest else sb.direct, max_batch=max_batch,
        )  # fmt: skip
        self._order = itertools.count()
        self._batchers: list[_InstanceBatcher] = []
        # Free slots, lowest slot index first and then instance order, so sequences spread over instances.
        self._free: list[tuple[int, int, Slot]] = []
        self._by_corrid: dict[CorrelationId, Slot] = {}
        self._backlog_by_corrid: dict[CorrelationId, Backlog] = {}
        self._backlogs: collections.deque[Backlog] = collections.deque()
        self._last_seen: dict[CorrelationId, int] = {}
        self._outstanding = 0
        self._drained = asyncio.Event()
        self._drained.set()
        # Closing refuses new sequences but lets started ones go on until drained, as Triton does; once
        # stopped, nothing is accepted.
        self._closed = False
        self._stopped = False
        self._reaper_wake = asyncio.Event()
        for instance, instance_limits in zip(instances, limits or [InstanceLimits() for _ in instances], strict=False):
            self.add_instance(instance, instance_limits)
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    def add_instance(self, instance: BackendInstance, limits: InstanceLimits) -> None:
        """Give `instance` slots: backlogged sequences take them first."""
        batcher: _InstanceBatcher = self._new_batcher(instance, limits, order=next(self._order))
        self._batchers.append(batcher)
        batcher.start()
        for slot in batcher.slots:
            self._give(slot)

    def remove_instance(self, instance: BackendInstance) -> asyncio.Future[None]:
        """Give `instance` no new sequence; resolved once the sequences it holds have ended and its last batch has
        run (the caller closes it)."""
        batcher = next(b for b in self._batchers if b.instance is instance)
        batcher.retiring = True
        self._free = [entry for entry in self._free if entry[2].batcher is not batcher]
        heapq.heapify(self._free)
        batcher.gone.add_done_callback(lambda _: self._batchers.remove(batcher))
        batcher.wake()
        return batcher.gone

    # -- the server's side ------------------------------------------------------------------------
    def submit(self, request: InferenceRequest) -> None:
        model = request.model_name
        if self._stopped or (self._closed and request.flags & SEQUENCE_START):
            raise NereidError.unavailable(
                "Server is stopping, scheduler for model has stopped accepting new inference requests"
            )
        if request.batch_size > 1:
            raise NereidError.invalid(
                f"inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
            )
        corrid = request.correlation_id
        generated = False
        if (corrid == 0 or corrid == "") and self._iterative:
            corrid = request.correlation_id = self._next_sequence_id
            self._next_sequence_id += 1
            request.flags |= SEQUENCE_START
            generated = True
        elif corrid == 0 or corrid == "":
            raise NereidError.invalid(
                f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
            )
        start = bool(request.flags & SEQUENCE_START)
        end = bool(request.flags & SEQUENCE_END)
        slot = self._by_corrid.get(corrid)
        backlog = self._backlog_by_corrid.get(corrid)
        if not start and slot is None and backlog is None:
            raise NereidError.invalid(
                f"inference request for sequence {corrid} to model '{model}' must specify the START flag on the first "
                "request of the sequence"
            )
        now = time.monotonic_ns()
        if start and (slot is not None or backlog is not None):
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this sequence "
                "start. Previous sequence will be terminated early.",
                corrid,
                model,
            )
        self._outstanding += 1
        self._drained.clear()
        self._stats.pending += 1
        if end:
            self._last_seen.pop(corrid, None)
        elif not generated:  # a sequence of one rescheduled request lasts as long as the model reschedules it
            self._last_seen[corrid] = now
        if slot is not None:
            if end:
                del self._by_corrid[corrid]
            slot.batcher.enqueue(slot, request)
            return
        if backlog is not None:
            backlog.add(request, now)
            if end:
                del self._backlog_by_corrid[corrid]
            self._wake_reaper_for(backlog)
            return
        if self._free:
            _, _, slot = heapq.heappop(self._free)
            slot.corrid = corrid
            if not end:
                self._by_corrid[corrid] = slot
            log.debug(
                "sequence %s of model '%s' takes slot %d of instance %s", corrid, model, slot.index, slot.batcher.name
            )
            slot.batcher.enqueue(slot, request)
            return
        backlog = Backlog(corrid)
        backlog.add(request, now)
        self._backlogs.append(backlog)
        if not end:
            self._backlog_by_corrid[corrid] = backlog
        self._wake_reaper_for(backlog)

    async def drain(self) -> None:
        await self._drained.wait()

    async def close(self) -> None:
        self._closed = True
        try:
            await self.drain()
        finally:
            self._stopped = True
            self._reaper.cancel()
            for batcher in self._batchers:
                batcher.stop()
            await asyncio.gather(self._reaper, *(b.task for b in self._batchers if b.task), return_exceptions=True)

    # -- slots ------------------------------------------------------------------------------------
    def release(self, slot: Slot) -> None:
        """The slot's sequence is over: give the slot to the oldest backlogged sequence, or free it."""
        if slot.corrid is not None and self._by_corrid.get(slot.corrid) is slot:
            del self._by_corrid[slot.corrid]
        leftover = [r for r in slot.queue if isinstance(r, InferenceRequest)]
        slot.queue.clear()
        for request in leftover:
            self._stats.pending -= 1
            self.reject(request, NereidError(Status.CANCELLED, "Request was cancelled"), "CANCELED")
        slot.corrid = None
        slot.state = {}
        self._give(slot)

    def _give(self, slot: Slot) -> None:
        """A free slot goes to the oldest backlogged sequence, or back to the free slots (a removed instance's
        slot to neither: its instance is told to look whether it may go)."""
        batcher = slot.batcher
        if batcher.retiring:
            batcher.wake()
            return
        while self._backlogs:
            backlog = self._backlogs.popleft()
            requests = [r for r in backlog.queue if isinstance(r, InferenceRequest)]
            if self._backlog_by_corrid.get(backlog.corrid) is backlog:
                del self._backlog_by_corrid[backlog.corrid]
                mapped = True
            else:
                mapped = False
            if any(r.cancelled for r in requests):
                for request in requests:
                    self._stats.pending -= 1
                    self.reject(request, NereidError(Status.CANCELLED, "Request was cancelled"), "CANCELED")
                continue
            slot.corrid = backlog.corrid
            if mapped:
                self._by_corrid[backlog.corrid] = slot
                self._last_seen[backlog.corrid] = time.monotonic_ns()
            log.debug(
                "backlogged sequence %s takes slot %d of instance %s", backlog.corrid, slot.index, slot.batcher.name
            )
            slot.queue.extend(requests)
            batcher.notify(slot)
            return
        heapq.heappush(self._free, (slot.index, batcher.order, slot))

    def held(self) -> bool:
        """Whether TRITONSERVER_DELAY_SCHEDULER still holds the instances: fewer requests wait in all instances'
        slots than it asks for, or (TRITONSERVER_BACKLOG_DELAY_SCHEDULER) fewer in the backlog, ended sequences'
        included (test_backlog_fill waits for two backlogged sequences of one request each)."""
        if self._delay is None:
            return False
        if sum(batcher.waiting() for batcher in self._batchers) < self._delay.queued:
            return True
        if sum(len(backlog.queue) for backlog in self._backlogs) < self._delay.backlogged:
            return True
        # Reached once, the hold ends for every instance: the first one to run takes requests away from the count,
        # and Triton's instances keep the count each one saw last, so none of them is held again.
        self._delay = None
        return False

    def cancel_sequence(self, slot: Slot) -> None:
        """A queued request of the slot's sequence was cancelled: cancel the sequence and release its slot."""
        log.debug("sequence %s of model '%s' cancelled", slot.corrid, self._model)
        self.release(slot)

    # -- request preparation ----------------------------------------------------------------------
    def shape_key(self, slot: Slot, request: InferenceRequest) -> tuple:
        """Requests share a direct batch only when every non-ragged input has the same non-batch shape."""
        inputs = shape_key(request, self._ragged)
        if not self._states:
            return inputs
        state = self._states.initial() if request.flags & SEQUENCE_START or not slot.state else slot.state
        return inputs + self._states.shapes(state)

    def prepare(self, slot: Slot, request: InferenceRequest) -> None:
        """Add the control and state inputs to a request leaving its slot queue for execution."""
        self._stats.pending -= 1
        request.inputs.extend(self._controls.for_request(request.flags, request.correlation_id))
        if self._states:
            if request.flags & SEQUENCE_START or not slot.state:
                slot.state = self._states.initial()
            request.inputs.extend(self._states.tensors(slot.state))

    def filler(self, representative: InferenceRequest) -> InferenceRequest:
        """A request for an idle slot of a direct batch: zeros shaped like `representative`, READY false."""
        controls = self._controls.names
        states = self._states.input_names
        inputs = [_zeros_like(t) for t in representative.inputs if t.name not in controls and t.name not in states]
        inputs.extend(self._controls.not_ready())
        if self._states:
            present = {t.name: t.data for t in representative.inputs if t.name in states}
            inputs.extend(self._states.dummy(present))
        return InferenceRequest(
            representative.model_name,
            representative.model_version,
            inputs,
            id="",
            outputs=representative.outputs,
        )

    # -- execution --------------------------------------------------------------------------------
    async def execute(
        self,
        instance: BackendInstance,
        limits: InstanceLimits,
        batch: list[InferenceRequest],
        owners: list[Slot | None],
    ) -> None:
        """Run one batch (fillers have owner None) and deliver the real requests' responses."""
        if self._decoupled:
            for request, owner in zip(batch, owners, strict=True):
                if owner is not None and id(request) not in self._iterating:  # a rescheduled one already is
                    self._intercept_decoupled(owner, request)
        if self._limiter is not None:
            await self._limiter.acquire(limits)
        try:
            executed = await self._runner.run(instance, batch, [owner is None for owner in owners])
        finally:
            if self._limiter is not None:
                self._limiter.release(limits)
        if not isinstance(executed, Executed):
            self._fail(batch, owners, executed)
            return
        runner = self._runner
        if self._decoupled:
            # The backend delivered the responses itself (through the intercepted respond).
            for request, owner in zip(batch, owners, strict=True):
                if owner is None:
                    continue
                # Triton counts every execution of a rescheduled request as a success.
                runner.succeeded(request, executed, report_compute=False)
                if request.rescheduled:
                    self._reschedule(owner, request)
                    continue
                if self._iterative:
                    self._end_iterative(owner, request)
            return
        for request, owner, response in zip(batch, owners, executed.responses, strict=True):
            if owner is None:
                continue
            if request.rescheduled:
                runner.succeeded(request, executed, report_compute=False)  # as Triton
                self._reschedule(owner, request)
                continue
            if self._iterative:
                self._end_iterative(owner, request)
            if response.error is None:
                self._keep_state(owner, request, response)
            runner.settle(request, response, executed)  # an ensemble step adds its compute to the ensemble's
            self.deliver(request, response)

    def _reschedule(self, slot: Slot, request: InferenceRequest) -> None:
        """The model released the request with RESCHEDULE: it runs again in its sequence, neither START nor END."""
        request.rescheduled = False
        request.flags = 0
        request.inputs = [t for t in request.inputs if t.name not in self._added_inputs]  # prepare() adds them again
        self._iterating.add(id(request))
        corrid = request.correlation_id
        if slot.corrid != corrid:  # the sequence was released meanwhile (idle, or cancelled)
            self._iterating.discard(id(request))
            self.reject(request, NereidError(Status.CANCELLED, "Request was cancelled"), "CANCELED", True)
            return
        self._stats.pending += 1
        if corrid in self._last_seen:
            self._last_seen[corrid] = time.monotonic_ns()
        slot.queue.appendleft(request)
        slot.batcher.notify(slot)

    def _end_iterative(self, slot: Slot, request: InferenceRequest) -> None:
        """An iterative sequence ends when its first request is released without RESCHEDULE (Triton then ends
        the sequence with a cancelled END request; this releases its slot)."""
        iterated = id(request) in self._iterating
        self._iterating.discard(id(request))
        corrid = request.correlation_id
        if (iterated or request.flags & SEQUENCE_START) and slot.corrid == corrid:
            self._last_seen.pop(corrid, None)
            self.release(slot)

    def _keep_state(self, slot: Slot, request: InferenceRequest, response: InferenceResponse) -> None:
        if not self._states:
            return
        new = self._states.take(request, response)
        if new is not None and slot.corrid == request.correlation_id and not _is_end(request):
            slot.state = {**slot.state, **new}

    def _intercept_decoupled(self, slot: Slot, request: InferenceRequest) -> None:
        respond = request.respond

        def intercepted(response: InferenceResponse) -> None:
            if response.error is None and response.outputs:
                self._keep_state(slot, request, response)
            if response.final:
                self._finished_one()
            respond(response)

        request.respond = intercepted

    def _fail(self, batch: list[InferenceRequest], owners: list[Slot | None], error: NereidError) -> None:
        for request, owner in zip(batch, owners, strict=True):
            if owner is not None:
                if self._iterative:  # a failed request is released without RESCHEDULE: its sequence is over
                    request.rescheduled = False
                    self._end_iterative(owner, request)
                self.reject(request, error, "BACKEND", decoupled_aware=True)

    def reject(self, request: InferenceRequest, error: NereidError, reason: str, decoupled_aware: bool = False) -> None:
        response = self._runner.reject(request, error, reason)
        if decoupled_aware and self._decoupled:
            request.respond(response)  # the intercepted respond counts it finished
            return
        self.deliver(request, response)

    def deliver(self, request: InferenceRequest, response: InferenceResponse) -> None:
        self._finished_one()
        request.respond(response)

    def _finished_one(self) -> None:
        self._outstanding -= 1
        if self._outstanding <= 0:
            self._outstanding = 0
            self._drained.set()

    # -- idle sequences and expired backlogs ------------------------------------------------------
    def _wake_reaper_for(self, backlog: Backlog) -> None:
        if backlog.expires_ns:
            self._reaper_wake.set()

    async def _reap(self) -> None:
        idle_ns = self._idle_ns
        while True:
            now = time.monotonic_ns()
            next_ns = now + idle_ns
            for corrid, seen in list(self._last_seen.items()):
                deadline = seen + idle_ns
                if deadline > now:
                    next_ns = min(next_ns, deadline)
                    continue
                slot = self._by_corrid.pop(corrid, None)
                if slot is not None:
                    del self._last_seen[corrid]
                    log.debug(
                        "sequence %s of model '%s' exceeded max sequence idle, releasing its slot", corrid, self._model
                    )
                    slot.batcher.enqueue(slot, RELEASE)
                elif corrid in self._backlog_by_corrid:
                    next_ns = min(next_ns, now + _BACKLOG_IDLE_RECHECK_NS)
                else:
                    del self._last_seen[corrid]
            for backlog in list(self._backlogs):
                if not backlog.expires_ns:
                    continue
                if backlog.expires_ns > now:
                    next_ns = min(next_ns, backlog.expires_ns)
                    continue
                self._backlogs.remove(backlog)
                if self._backlog_by_corrid.get(backlog.corrid) is backlog:
                    del self._backlog_by_corrid[backlog.corrid]
                for request in backlog.queue:
                    if isinstance(request, InferenceRequest):
                        self._stats.pending -= 1
                        self.reject(
                            request,
                            NereidError.unavailable("timeout of the corresponding sequence has been expired"),
                            "REJECTED",
                        )
            self._reaper_wake.clear()
            try:
                await asyncio.wait_for(self._reaper_wake.wait(), max(next_ns - now, 0) / 1e9)
            except TimeoutError:
                pass


class _InstanceBatcher:
    """The slots of one instance and the task that executes their requests."""

    def __init__(
        self,
        owner: SequenceBatcher,
        instance: BackendInstance,
        limits: InstanceLimits,
        slot_count: int,
        strategy: Any,
        max_batch: int,
        order: int,
    ) -> None:
        self.owner = owner
        self.instance = instance
        self.name = instance.name
        self.limits = limits
        self.order = order
        self.slots = [Slot(self, i) for i in range(slot_count)]
        self.task: asyncio.Task[None] | None = None
        # Removed by an instance update: it ends once no slot holds a sequence and its last batch has run.
        self.retiring = False
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake = asyncio.Event()
        self._timer = PreciseTimer()
        self._delay_ns = strategy.max_queue_delay_microseconds * 1000
        self._max_batch = max_batch
        # Held until the owner's TRITONSERVER_DELAY_SCHEDULER count is reached once; never again after that.
        self._delayed = owner._delay is not None
        self._configure(strategy)

    def _configure(self, strategy: Any) -> None:
        """Read the strategy's own settings (sequence_batching's `direct` or `oldest` message)."""

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run_until_gone())

    async def _run_until_gone(self) -> None:
        try:
            await self._run()
        finally:
            if not self.gone.done():
                self.gone.set_result(None)

    def wake(self) -> None:
        self._wake.set()

    def may_go(self) -> bool:
        """Removed, and nothing of a sequence left in it."""
        return self.retiring and all(slot.corrid is None and not slot.queue for slot in self.slots)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def enqueue(self, slot: Slot, request: InferenceRequest | Release) -> None:
        slot.queue.append(request)
        self.notify(slot)

    def notify(self, slot: Slot) -> None:
        self._wake.set()

    async def _sleep(self, deadline_ns: int | None) -> None:
        """Wait for new work, or until `deadline_ns` on the monotonic clock (to the microsecond: see PreciseTimer)."""
        if deadline_ns is None:
            await self._wake.wait()
            return
        self._timer.start(deadline_ns, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            self._timer.cancel()

    def waiting(self) -> int:
        """Requests waiting in this instance's slots (not yet executing)."""
        return sum(1 for slot in self.slots for item in slot.queue if isinstance(item, InferenceRequest))

    async def _hold(self) -> bool:
        """Wait a while if TRITONSERVER_DELAY_SCHEDULER still holds this instance; True if it did (look again)."""
        if not self._delayed:
            return False
        if self.owner.held():
            self._wake.clear()
            await self._sleep(time.monotonic_ns() + _DELAY_RECHECK_NS)  # backlog arrivals do not wake an instance
            return True
        log.debug("scheduler delay of instance %s is over", self.name)
        self._delayed = False
        return False

    async def _run(self) -> None:
        raise NotImplementedError


class _DirectBatcher(_InstanceBatcher):
    """One request per slot per execution, slots 0..highest ready; idle slots below that get fillers."""

    def _configure(self, strategy: Any) -> None:
        self._min_utilization = strategy.minimum_slot_utilization

    def _settle_fronts(self) -> None:
        """Release slots whose front is the reaper's marker or a cancelled request."""
        owner = self.owner
        for slot in self.slots:
            while slot.queue:
                front = slot.queue[0]
                if isinstance(front, Release):
                    slot.queue.popleft()
                    owner.release(slot)
                elif front.cancelled:
                    owner.cancel_sequence(slot)
                else:
                    break

    async def _run(self) -> None:
        owner = self.owner
        while True:
            self._settle_fronts()
            if self.may_go():
                return
            ready = [slot for slot in self.slots if slot.queue]
            if not ready and not self._delayed:
                self._wake.clear()
                await self._sleep(None)
                continue
            if await self._hold() or not ready:
                continue
            if self._delay_ns and self._min_utilization > 0:
                oldest = min(slot.queue[0].arrival_ns for slot in ready)  # type: ignore[union-attr]
                if time.monotonic_ns() < oldest + self._delay_ns and len(ready) / self._max_batch < self._min_utilization:
                    self._wake.clear()
                    await self._sleep(oldest + self._delay_ns)
                    continue
            batch, owners = self._form(ready[-1].index)
            await owner.execute(self.instance, self.limits, batch, owners)

    def _form(self, last: int) -> tuple[list[InferenceRequest], list[Slot | None]]:
        owner = self.owner
        check_shapes = owner._batching and last > 0
        key = None
        chosen: list[InferenceRequest | None] = []
        owners: list[Slot | None] = []
        for slot in self.slots[: last + 1]:
            front = slot.queue[0] if slot.queue else None
            if isinstance(front, InferenceRequest) and check_shapes:
                slot_key = owner.shape_key(slot, front)
                if key is None:
                    key = slot_key
                elif slot_key != key:
                    front = None  # a different shape waits for a batch of its own
            if not isinstance(front, InferenceRequest):
                chosen.append(None)
                owners.append(None)
                continue
            slot.queue.popleft()
            owner.prepare(slot, front)
            chosen.append(front)
            owners.append(slot)
            if _is_end(front):
                owner.release(slot)
        representative = next(r for r in chosen if r is not None)
        batch = [r if r is not None else owner.filler(representative) for r in chosen]
        return batch, owners


class _OldestBatcher(_InstanceBatcher):
    """A dynamic batcher over the next request of each of the instance's candidate sequences."""

    def _configure(self, strategy: Any) -> None:
        self._sizes = BatchSizes(self._max_batch, strategy.preferred_batch_size)
        # (slot, request, issue time): each candidate sequence's next request, in the order they became ready.
        self._ready: collections.deque[tuple[Slot, InferenceRequest, int]] = collections.deque()
        # preserve_ordering: this instance's responses leave in the order its requests were issued.
        self._order = ResponseOrder() if strategy.preserve_ordering else None

    def notify(self, slot: Slot) -> None:
        self._issue(slot)

    def waiting(self) -> int:
        return super().waiting() + len(self._ready)

    def _issue(self, slot: Slot) -> None:
        """Move the slot's next request to the ready list unless one of its sequence is executing."""
        owner = self.owner
        while not slot.in_flight and slot.queue:
            front = slot.queue[0]
            if isinstance(front, Release):
                slot.queue.popleft()
                owner.release(slot)
                continue
            if front.cancelled:
                owner.cancel_sequence(slot)
                continue
            slot.queue.popleft()
            owner.prepare(slot, front)
            if self._order is not None and id(front) not in owner._iterating:  # a rescheduled one keeps its place
                self._order.take_ticket(front)
            slot.in_flight = True
            self._ready.append((slot, front, time.monotonic_ns()))
            self._wake.set()

    async def _run(self) -> None:
        owner = self.owner
        ready = self._ready
        while True:
            if not ready and self.may_go():
                return
            if not ready and not self._delayed:
                self._wake.clear()
                await self._sleep(None)
                continue
            if await self._hold() or not ready:
                continue
            if self._delay_ns and len(ready) < self._sizes.target:
                deadline_ns = ready[0][2] + self._delay_ns
                if time.monotonic_ns() < deadline_ns:
                    self._wake.clear()
                    await self._sleep(deadline_ns)
                    continue
            taken = self._take()
            batch = [request for _, request, _ in taken]
            owners: list[Slot | None] = [slot for slot, _, _ in taken]
            try:
                await owner.execute(self.instance, self.limits, batch, owners)
            finally:
                for slot, request, _ in taken:
                    slot.in_flight = False
                    if _is_end(request) and slot.corrid == request.correlation_id:
                        owner.release(slot)
                for slot, _, _ in taken:
                    self._issue(slot)

    def _take(self) -> list[tuple[Slot, InferenceRequest, int]]:
        ready = self._ready
        limit = self._sizes.cut(len(ready))
        taken: list[tuple[Slot, InferenceRequest, int]] = []
        skipped: list[tuple[Slot, InferenceRequest, int]] = []
        key = None
        check_shapes = self.owner._batching and limit > 1
        while ready and len(taken) < limit:
            entry = ready.popleft()
            if check_shapes:
                entry_key = shape_key(entry[1], self.owner._ragged)
                if key is None:
                    key = entry_key
                elif entry_key != key:
                    skipped.append(entry)
                    continue
            taken.append(entry)
        ready.extendleft(reversed(skipped))
        return taken
