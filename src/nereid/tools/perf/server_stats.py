"""The server-side view of a measurement: snapshots of the statistics endpoint (Triton's JSON shape) and the
per-request breakdown (queue, compute input, infer, output, overhead) from the delta between two snapshots."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ServerBreakdown", "StatsSnapshot", "breakdown", "parse_statistics"]

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass(slots=True)
class StatsSnapshot:
    """Cumulative counters of one model (all its versions, or the one asked for)."""

    inference_count: int = 0
    execution_count: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # duration name -> count
    ns: dict[str, int] = field(default_factory=dict)  # duration name -> total ns

    def count(self, key: str) -> int:
        return self.counts.get(key, 0)

    def total_ns(self, key: str) -> int:
        return self.ns.get(key, 0)


def parse_statistics(doc: dict[str, Any], model: str, version: str = "") -> StatsSnapshot:
    """Sum the entries for `model` (and `version` when given) in a statistics reply."""
    snapshot = StatsSnapshot(counts=dict.fromkeys(_DURATIONS, 0), ns=dict.fromkeys(_DURATIONS, 0))
    for item in doc.get("model_stats", []):
        if item.get("name") != model or (version and str(item.get("version")) != version):
            continue
        snapshot.inference_count += int(item.get("inference_count", 0))
        snapshot.execution_count += int(item.get("execution_count", 0))
        inference = item.get("inference_stats", {})
        for key in _DURATIONS:
            entry = inference.get(key) or {}
            snapshot.counts[key] += int(entry.get("count", 0))
            snapshot.ns[key] += int(entry.get("ns", 0))
    return snapshot


@dataclass(slots=True)
class ServerBreakdown:
    """What the server reports for the requests it finished between two snapshots; times are averages per
    request in microseconds."""

    request_count: int  # successful requests
    failed_count: int
    inference_count: int  # requests x batch size
    execution_count: int  # model executions (fewer than requests when the server batches)
    avg_request_us: float  # receipt to response, as the server measures it
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    overhead_us: float  # avg_request_us minus queue and compute
    cache_hit_count: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def breakdown(before: StatsSnapshot, after: StatsSnapshot) -> ServerBreakdown:
    def delta_count(key: str) -> int:
        return after.count(key) - before.count(key)

    def avg_us(key: str, per: int) -> float:
        n = per or delta_count(key)
        return (after.total_ns(key) - before.total_ns(key)) / n / 1000.0 if n > 0 else 0.0

    requests = delta_count("success")
    # Triton counts queue and compute once per request (compute is shared by a batch but charged to each).
    queue = avg_us("queue", delta_count("queue"))
    compute_input = avg_us("compute_input", delta_count("compute_input"))
    compute_infer = avg_us("compute_infer", delta_count("compute_infer"))
    compute_output = avg_us("compute_output", delta_count("compute_output"))
    request = avg_us("success", requests)
    return ServerBreakdown(
        request_count=requests,
        failed_count=delta_count("fail"),
        inference_count=after.inference_count - before.inference_count,
        execution_count=after.execution_count - before.execution_count,
        avg_request_us=request,
        queue_us=queue,
        compute_input_us=compute_input,
        compute_infer_us=compute_infer,
        compute_output_us=compute_output,
        overhead_us=max(0.0, request - queue - compute_input - compute_infer - compute_output),
        cache_hit_count=delta_count("cache_hit"),
    )
