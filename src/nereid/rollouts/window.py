"""What one version did over a rollout step's window: requests, errors, latency quantiles, CPU time, and output
divergence from shadow comparisons. Bounded state (a log-spaced latency histogram, and up to _FOLD_AT latencies
not yet in it): a request costs an append, and the histogram takes latencies in batches, with numpy."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

__all__ = ["VersionWindow", "WindowFigures"]

# Latency buckets grow by 2%: a quantile read from them is within 2% of the true one, from 10 µs to hours.
_GROWTH = math.log(1.02)
_FLOOR_NS = 10_000
_FOLD_AT = 4096  # latencies kept before they go into the histogram


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """A version's figures over a window, as the gate and the status read them."""

    requests: int
    errors: int
    p99_ms: float
    mean_ms: float
    cpu_ms_per_request: float
    compared: int  # shadow comparisons made
    divergence: float  # the mean divergence of those comparisons (0: identical outputs)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "p99_ms": round(self.p99_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "cpu_ms_per_request": round(self.cpu_ms_per_request, 3),
            "shadow_comparisons": self.compared,
            "divergence": round(self.divergence, 6),
        }


class VersionWindow:
    """Outcomes of one version since the window began."""

    __slots__ = ("requests", "errors", "_latency_ns", "_buckets", "_pending", "compared", "_divergence", "_cost_base", "_cost")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self._latency_ns = 0
        self._buckets: dict[int, int] = {}
        self._pending = array("q")
        self.compared = 0
        self._divergence = 0.0
        # The version's CPU time and executed requests (cumulative counters) when the window first saw them, and
        # how far they have moved since: the cost objective's CPU time per request.
        self._cost_base: tuple[int, int] | None = None
        self._cost = (0, 0)

    def record(self, latency_ns: int, failed: bool) -> None:
        self.requests += 1
        self.errors += failed
        pending = self._pending
        pending.append(latency_ns)
        if len(pending) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """The pending latencies into the sum and the histogram."""
        if not self._pending:
            return
        latencies = np.frombuffer(self._pending, dtype=np.int64)
        self._latency_ns += int(latencies.sum())
        buckets = (np.log(np.maximum(latencies, _FLOOR_NS) / _FLOOR_NS) / _GROWTH).astype(np.int64)
        found, counts = np.unique(buckets, return_counts=True)
        for bucket, count in zip(found.tolist(), counts.tolist(), strict=True):
            self._buckets[bucket] = self._buckets.get(bucket, 0) + count
        self._pending = array("q")

    def record_comparison(self, divergence: float) -> None:
        self.compared += 1
        self._divergence += divergence

    def observe_cost(self, cpu_ns: int, requests: int) -> None:
        """The version's cumulative CPU time and requests executed, read now: the first reading is the window's
        base. Over all the version's requests, routed or not: CPU time cannot be told apart per request."""
        if self._cost_base is None:
            self._cost_base = (cpu_ns, requests)
        else:
            self._cost = (cpu_ns - self._cost_base[0], requests - self._cost_base[1])

    def quantile_ms(self, q: float) -> float:
        if not self.requests:
            return 0.0
        self._fold()
        rank = q * self.requests
        seen = 0
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            if seen >= rank:
                return _FLOOR_NS * math.exp((bucket + 1) * _GROWTH) / 1e6  # the bucket's upper edge
        return 0.0

    def figures(self) -> WindowFigures:
        self._fold()
        n = self.requests
        return WindowFigures(
            n,
            self.errors,
            self.quantile_ms(0.99),
            self._latency_ns / n / 1e6 if n else 0.0,
            self._cost[0] / self._cost[1] / 1e6 if self._cost[1] > 0 else 0.0,
            self.compared,
            self._divergence / self.compared if self.compared else 0.0,
        )
