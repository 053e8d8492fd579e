"""Per model-version counters in Triton's statistics schema; the metrics endpoint reads the same objects."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nereid.core.errors import Status
from nereid.core.types import InferenceResponse

__all__ = [
    "Duration",
    "BatchStats",
    "ResponseStats",
    "RESPONSE_STATS_FIELDS",
    "ResponseRecorder",
    "LatencyWindow",
    "ModelStatistics",
    "SUMMARY_QUANTILES",
    "FIRST_RESPONSE_BUCKETS_MS",
]

# Triton's default summary quantiles (--metrics-config summary_quantiles changes them).
SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
# Triton's default buckets for nv_inference_first_response_histogram_ms.
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# ResponseStats' fields in the order of Triton's InferResponseStatistics (its proto field numbers 1..6).
RESPONSE_STATS_FIELDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")


@dataclass(slots=True)
class ResponseStats:
    """One response index of a decoupled model, in the fields of Triton's InferResponseStatistics."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {name: getattr(self, name).as_dict() for name in RESPONSE_STATS_FIELDS}


class ResponseRecorder:
    """The respond callback of a decoupled model's request while it executes: it charges each response to its
    index, as Triton's backends report response statistics. A response's time runs from the end of the previous
    one (the first: from the execution's start) to the moment the backend delivered it (compute_infer), then to
    the moment the frontend had it (compute_output). A bare final flag is an empty response, an error a failure,
    a CANCELLED error a cancellation."""

    __slots__ = ("inner", "stats", "last_ns", "index")

    def __init__(self, inner: Callable[[InferenceResponse], None], stats: ModelStatistics, start_ns: int) -> None:
        self.inner = inner
        self.stats = stats
        self.last_ns = start_ns
        self.index = 0

    def __call__(self, response: InferenceResponse) -> None:
        ready = time.monotonic_ns()
        self.inner(response)
        end = time.monotonic_ns()
        start, self.last_ns = self.last_ns, end
        index = self.index
        self.index += 1
        responses = self.stats.responses
        entry = responses.get(index)
        if entry is None:
            entry = responses[index] = ResponseStats()
        if response.complete_only:
            entry.empty_response.add(end - start)
            return
        error = response.error
        if error is not None and error.status is Status.CANCELLED:
            entry.cancel.add(end - start)
            return
        entry.compute_infer.add(ready - start)
        entry.compute_output.add(end - ready)
        (entry.success if error is None else entry.fail).add(end - start)


class LatencyWindow:
    """Recent per-request latencies (µs) for the summary metrics; kept only when summaries are enabled."""

    def __init__(self, max_age_s: float = 60.0, max_samples: int = 20_000) -> None:
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=max_samples)
        self._max_age_s = max_age_s
        self.count = 0
        self.sum_us = 0.0

    def add(self, value_us: float) -> None:
        self._samples.append((time.monotonic(), value_us))
        self.count += 1
        self.sum_us += value_us

    def quantiles(self, wanted: tuple[float, ...] = SUMMARY_QUANTILES) -> list[tuple[float, float]]:
        cutoff = time.monotonic() - self._max_age_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
        values = sorted(v for _, v in self._samples)
        if not values:
            return [(q, float("nan")) for q in wanted]
        return [(q, values[min(int(q * len(values)), len(values) - 1)]) for q in wanted]


@dataclass(slots=True)
class ModelStatistics:
    """Mutated only on the event loop thread, so plain integers suffice."""

    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=dict)
    # A decoupled model's statistics per response index (0 = each request's first response).
    responses: dict[int, ResponseStats] = field(default_factory=dict)
    # Failures by reason, for nv_inference_request_failure{reason=...}.
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    # name -> window, present only with --metrics-config summary_latencies=true.
    summaries: dict[str, LatencyWindow] | None = None

    # Time to first response in ms, with --metrics-config histogram_latencies=true: bucket counts, sum.
    first_response: list[int] | None = None
    first_response_sum_ms: float = 0.0
    # Upper bounds (ms) of first_response's buckets but the last (+Inf); a model's config.pbtxt may set them.
    first_response_buckets: tuple[float, ...] = FIRST_RESPONSE_BUCKETS_MS

    def enable_first_response_histogram(self, buckets: tuple[float, ...] | None = None) -> None:
        if buckets is not None:
            self.first_response_buckets = buckets
        self.first_response = [0] * (len(self.first_response_buckets) + 1)

    def record_first_response(self, duration_ns: int) -> None:
        buckets = self.first_response
        if buckets is None:
            return
        ms = duration_ns / 1e6
        self.first_response_sum_ms += ms
        for index, bound in enumerate(self.first_response_buckets):
            if ms <= bound:
                buckets[index] += 1
                return
        buckets[-1] += 1

    def enable_summaries(self) -> None:
        self.summaries = {k: LatencyWindow() for k in ("request", "queue", "compute_input", "compute_infer", "compute_output")}

    def record_execution(
        self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One execution of `requests` requests holding `batch_size` items; each request is charged the
        batch's compute time, as Triton charges it."""
        # Runs once per batch, and the one after it once per request: Duration.add is written out in both, which saves
        # six and two Python calls on the path every request takes.
        self.execution_count += 1
        self.inference_count += batch_size
        duration = self.compute_input
        duration.count += requests
        duration.ns += input_ns * requests
        duration = self.compute_infer
        duration.count += requests
        duration.ns += infer_ns * requests
        duration = self.compute_output
        duration.count += requests
        duration.ns += output_ns * requests
        batch = self.batches.get(batch_size)
        if batch is None:
            batch = self.batches[batch_size] = BatchStats()
        duration = batch.compute_input
        duration.count += 1
        duration.ns += input_ns
        duration = batch.compute_infer
        duration.count += 1
        duration.ns += infer_ns
        duration = batch.compute_output
        duration.count += 1
        duration.ns += output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_success(self, duration_ns: int, queue_ns: int, compute: tuple[int, int, int] | None = None) -> None:
        success, queue = self.success, self.queue
        success.count += 1
        success.ns += duration_ns
        queue.count += 1
        queue.ns += queue_ns
        if self.summaries is not None:
            summaries = self.summaries
            summaries["request"].add(duration_ns / 1000)
            summaries["queue"].add(queue_ns / 1000)
            if compute is not None:
                summaries["compute_input"].add(compute[0] / 1000)
                summaries["compute_infer"].add(compute[1] / 1000)
                summaries["compute_output"].add(compute[2] / 1000)

    def record_failure(self, duration_ns: int, reason: str = "BACKEND") -> None:
        self.fail.add(duration_ns)
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {str(index): r.as_dict() for index, r in sorted(self.responses.items())},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for size, b in sorted(self.batches.items())
            ],
            # Triton's backends fill this only from their GPU memory tracker (CUPTI, TensorRT's
            # enable-memory-tracker); on a CPU server, and for Python models always, Triton 2.51 reports [].
            "memory_usage": [],
        }
