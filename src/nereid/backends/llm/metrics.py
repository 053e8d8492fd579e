"""The LLM engine's own figures (vLLM's metric names, as Triton's vLLM backend reports them): token counters,
time to first token, time per output token, request latency, running and waiting sequences, KV cache use, the
prefix cache's queries and hits, preemptions and requests refused by the waiting queue's bound.

Written by the engine thread, read by the metrics endpoint; plain ints and floats, no locks needed."""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from nereid.core.capabilities import MetricSample

__all__ = ["Histogram", "LlmMetrics", "MetricSample"]

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class Histogram:
    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def samples(self, name: str, labels: dict[str, str]) -> Iterator[tuple[str, dict[str, str], float]]:
        running = 0
        for bound, count in zip(self.bounds, self.counts):
            running += count
            yield name + "_bucket", {**labels, "le": _le(bound)}, running
        yield name + "_bucket", {**labels, "le": "+Inf"}, self.count
        yield name + "_count", labels, self.count
        yield name + "_sum", labels, self.total


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


class LlmMetrics:
    def __init__(self, kv_capacity_tokens: int) -> None:
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished: dict[str, int] = {}
        self.kv_used_tokens = 0
        self.kv_capacity_tokens = max(kv_capacity_tokens, 1)
        # The paged KV cache (set by Nereid's engine; 0 blocks: the figures above are used instead).
        self.kv_blocks_total = 0
        self.kv_blocks_used = 0
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found there (not computed again)
        self.num_preemptions = 0
        self.refused = 0  # requests the waiting queue's bound turned away
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.tpot = Histogram(_TPOT_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)
        self.steps = 0
        # (monotonic seconds, generated tokens so far) once per step, for a recent tokens/s figure.
        self._recent: deque[tuple[float, int]] = deque(maxlen=256)

    # -- the engine thread -----------------------------------------------------------------------
    def record_step(self, tokens: int, prefill_tokens: int) -> None:
        self.steps += 1
        self.prompt_tokens += prefill_tokens
        self._recent.append((time.monotonic(), self.generation_tokens))

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self.tpot.observe(seconds)

    def observe_finished(self, job: Any, now_ns: int) -> None:
        self.e2e.observe((now_ns - job.arrival_ns) / 1e9)

    def count_finish(self, reason: str) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    # -- readers ---------------------------------------------------------------------------------
    def kv_cache_usage(self) -> float:
        if self.kv_blocks_total:
            return self.kv_blocks_used / self.kv_blocks_total
        return self.kv_used_tokens / self.kv_capacity_tokens

    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def tokens_per_second(self, window: float = 5.0) -> float:
        recent = list(self._recent)
        if len(recent) < 2:
            return 0.0
        now = time.monotonic()
        if now - recent[-1][0] > window:
            return 0.0
        first = next((item for item in recent if now - item[0] <= window), recent[0])
        elapsed = recent[-1][0] - first[0]
        return (recent[-1][1] - first[1]) / elapsed if elapsed > 0 else 0.0

    def samples(self, labels: dict[str, str]) -> Iterator[MetricSample]:
        simple = (
            ("vllm:num_requests_running", "gauge", "Number of requests currently running on the engine.", self.running),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", max(self.waiting, 0)),
            ("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage()),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage()),
            ("nereid_llm_kv_blocks_used", "gauge", "KV cache blocks held by running sequences.", self.kv_blocks_used),
            ("nereid_llm_kv_blocks_free", "gauge", "KV cache blocks free or holding only evictable cached prefixes.", max(self.kv_blocks_total - self.kv_blocks_used, 0)),
            ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", self.prefix_cache_queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", self.prefix_cache_hits),
            ("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", self.num_preemptions),
            ("nereid_llm_requests_refused_total", "counter", "Requests refused because the waiting queue was full (HTTP 429 / UNAVAILABLE).", self.refused),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", self.generation_tokens),
            ("nereid_llm_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 5 seconds.", self.tokens_per_second()),
        )
        for name, kind, help_text, value in simple:
            yield (name, kind, help_text, name, labels, value)
        for reason, count in sorted(self.requests_finished.items()):
            name = "vllm:request_success_total"
            yield (name, "counter", "Count of finished requests by finish reason.", name, {**labels, "finished_reason": reason}, count)
        for name, help_text, histogram in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", self.tpot),
            ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", self.e2e),
        ):
            for sample_name, sample_labels, value in histogram.samples(name, labels):
                yield (name, "histogram", help_text, sample_name, sample_labels, value)
