"""One batch on one instance, as every batcher runs it: execute, turn a raised error or a wrong number of
responses into an error for the whole batch, and keep the model's statistics (the execution, then each
request's success or failure). It never chooses what runs nor delivers a response: the batchers do."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nereid.backends.base import BackendInstance
from nereid.core.capabilities import GroupInstance
from nereid.core.errors import NereidError
from nereid.core.statistics import ModelStatistics, ResponseRecorder
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BatchRunner", "Executed"]

log = logging.getLogger("nereid.scheduler")


@dataclass(slots=True)
class Executed:
    """A batch that ran: one response per batch entry (none for a decoupled model, which answers through
    `respond`) and the times each of its requests is charged."""

    responses: list[InferenceResponse]
    start_ns: int
    end_ns: int
    waited_ns: int  # spent inside the instance behind the batch before it: queue time
    compute: tuple[int, int, int]  # compute input, infer, output ns


def _failure(instance: str, exc: Exception) -> NereidError:
    """What an execution that raised answers each of its requests: the backend's error, or for any other
    exception (a backend bug, which must fail its requests, never the batcher) an internal one."""
    if isinstance(exc, NereidError):
        return exc
    log.exception("instance %s failed", instance)
    return NereidError.internal(f"{type(exc).__name__}: {exc}")


class BatchRunner:
    """Runs the batches of one model version and charges them to its statistics.

    `slot_batches`: an execution's batch size is every entry of the batch (the sequence batcher's slots, a
    failed request's included), not the items that succeeded (the dynamic batcher's). Either way only the
    requests that succeeded count as inferences: fillers and failures never do, as Triton counts them."""

    __slots__ = ("_model", "_stats", "_decoupled", "_slot_batches")

    def __init__(self, model: str, stats: ModelStatistics, decoupled: bool, slot_batches: bool = False) -> None:
        self._model = model
        self._stats = stats
        self._decoupled = decoupled
        self._slot_batches = slot_batches

    async def run(
        self, instance: BackendInstance, batch: list[InferenceRequest], fillers: Sequence[bool] | None = None
    ) -> Executed | NereidError:
        """Execute `batch` (`fillers` marks the entries that are no one's request) and record the execution;
        what fails, fails every request of the batch, and is returned for the batcher to answer with."""
        stats = self._stats
        start = time.monotonic_ns()
        if self._decoupled:
            for index, request in enumerate(batch):
                if fillers is None or not fillers[index]:
                    request.respond = ResponseRecorder(request.respond, stats, start)
        try:
            responses, times = await instance.execute(batch)
        except Exception as exc:
            return _failure(instance.name, exc)
        end = time.monotonic_ns()
        if not self._decoupled and len(responses) != len(batch):
            return self._miscount(len(responses), len(batch))
        compute = (times.compute_input_ns, times.compute_infer_ns, times.compute_output_ns)
        # The execution's statistics (written here, not in a helper: this runs once per batch).
        all_items = 0
        ok_requests = 0
        ok_items = 0
        for index, request in enumerate(batch):
            all_items += request.batch_size
            if fillers is not None and fillers[index]:
                continue
            if self._decoupled or responses[index].error is None:  # a decoupled model's requests all count
                ok_requests += 1
                ok_items += request.batch_size
        if ok_requests:
            batch_size = all_items if self._slot_batches or self._decoupled else ok_items
            stats.record_execution(batch_size, ok_requests, *compute)
            if batch_size != ok_items:  # fillers and failed slots count in the batch size, never as inferences
                stats.inference_count -= batch_size - ok_items
        return Executed(responses, start, end, times.waited_ns, compute)

    async def run_group(self, instance: GroupInstance, group: list[InferenceRequest]) -> list[Executed] | NereidError:
        """Execute each request of `group` on its own, the group handed over at once (a model without batching):
        one execution per request that succeeded, each charged its own times."""
        start = time.monotonic_ns()
        try:
            outcomes = await instance.execute_group(group)
        except Exception as exc:
            return _failure(instance.name, exc)
        end = time.monotonic_ns()
        if len(outcomes) != len(group):
            return self._miscount(len(outcomes), len(group))
        stats = self._stats
        executed = []
        for request, (response, times) in zip(group, outcomes):
            compute = (times.compute_input_ns, times.compute_infer_ns, times.compute_output_ns)
            if response.error is None:
                stats.record_execution(request.batch_size, 1, *compute)
            executed.append(Executed([response], start, end, times.waited_ns, compute))
        return executed

    def _miscount(self, responses: int, requests: int) -> NereidError:
        return NereidError.internal(f"model '{self._model}' returned {responses} responses for {requests} requests")

    def succeeded(self, request: InferenceRequest, executed: Executed, report_compute: bool = True) -> None:
        """Charge one request of the batch as a success; an ensemble step also reports its compute."""
        self._stats.record_success(
            executed.end_ns - request.arrival_ns,
            executed.start_ns - request.arrival_ns + executed.waited_ns,
            executed.compute,
        )
        if report_compute and request.report_compute is not None:
            request.report_compute(*executed.compute)

    def settle(self, request: InferenceRequest, response: InferenceResponse, executed: Executed) -> None:
        """Charge a request by the response the model gave it."""
        if response.error is None:
            self.succeeded(request, executed)
        else:
            self._stats.record_failure(executed.end_ns - request.arrival_ns)

    def settle_all(self, batch: list[InferenceRequest], executed: Executed) -> None:
        """Charge every request of a batch by its response, in one pass (the dynamic batcher's, per batch)."""
        stats = self._stats
        end = executed.end_ns
        queued = executed.start_ns + executed.waited_ns
        compute = executed.compute
        for request, response in zip(batch, executed.responses):
            if response.error is None:
                stats.record_success(end - request.arrival_ns, queued - request.arrival_ns, compute)
                if request.report_compute is not None:
                    request.report_compute(*compute)
            else:
                stats.record_failure(end - request.arrival_ns)

    def reject(self, request: InferenceRequest, error: NereidError, reason: str) -> InferenceResponse:
        """Charge a request that gets `error` instead of running (or whose batch failed); the answer to send."""
        self._stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason)
        return InferenceResponse(request.model_name, request.model_version, request.id, error=error)
