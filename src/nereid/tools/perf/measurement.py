"""Measurement windows and stability: completed requests are cut into windows by completion time, a level is
stable when the last three windows agree on throughput and latency within the threshold, and the stable
windows merge into one `PerfResult`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nereid.tools.perf.results import LatencySummary
from nereid.tools.perf.server_stats import ServerBreakdown
from nereid.tools.perf.worker import Records

__all__ = ["STABLE_WINDOWS", "Window", "WindowCollector", "is_stable", "latency_summary", "stabilizing_latency_us"]

STABLE_WINDOWS = 3


@dataclass(slots=True)
class Window:
    start_ns: int
    end_ns: int
    latencies_ns: np.ndarray  # int64, one per request that completed in the window
    first_ns: np.ndarray | None  # streaming: time to first response per request
    responses: np.ndarray | None  # streaming: responses per request
    errors: int
    first_error: str
    cpu_s: float  # CPU used by all workers during the window
    send_ns: int  # summed over `timed` requests (those drained since the previous window)
    recv_ns: int
    timed: int
    delayed: int
    server: ServerBreakdown | None = None

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 1) / 1e9

    @property
    def count(self) -> int:
        return int(self.latencies_ns.size)

    @property
    def requests_per_s(self) -> float:
        return self.count / self.duration_s


def _percentile(sorted_values: np.ndarray, p: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if sorted_values.size == 0:
        return 0.0
    rank = max(1, math.ceil(p / 100.0 * sorted_values.size))
    return float(sorted_values[rank - 1])


def latency_summary(values_ns: np.ndarray, extra_percentile: int | None = None) -> LatencySummary:
    ordered = np.sort(values_ns)
    us = 1000.0
    summary = LatencySummary(
        avg_us=float(ordered.mean()) / us if ordered.size else 0.0,
        p50_us=_percentile(ordered, 50) / us,
        p90_us=_percentile(ordered, 90) / us,
        p95_us=_percentile(ordered, 95) / us,
        p99_us=_percentile(ordered, 99) / us,
    )
    if extra_percentile is not None and extra_percentile not in (50, 90, 95, 99):
        summary.extra[extra_percentile] = _percentile(ordered, extra_percentile) / us
    return summary


def stabilizing_latency_us(window: Window, percentile: int | None) -> float:
    if window.count == 0:
        return 0.0
    if percentile is None:
        return float(window.latencies_ns.mean()) / 1000.0
    return _percentile(np.sort(window.latencies_ns), percentile) / 1000.0


def is_stable(windows: Sequence[Window], stability_percentage: float, percentile: int | None) -> bool:
    """perf_analyzer's rule: over the last three windows, max/min of throughput and of the stabilising latency
    both stay within the stability percentage."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    if any(w.count == 0 for w in last):
        return False
    limit = 1.0 + stability_percentage / 100.0
    throughputs = [w.requests_per_s for w in last]
    latencies = [stabilizing_latency_us(w, percentile) for w in last]
    return max(throughputs) <= min(throughputs) * limit and max(latencies) <= max(min(latencies), 1e-9) * limit


class WindowCollector:
    """Records drained from workers wait here until a window boundary claims them by completion time."""

    def __init__(self) -> None:
        self._start = np.empty(0, dtype=np.int64)
        self._end = np.empty(0, dtype=np.int64)
        self._first = np.empty(0, dtype=np.int64)
        self._responses = np.empty(0, dtype=np.int64)
        self.streaming = False
        self._errors = 0
        self._first_error = ""
        self._send_ns = 0
        self._recv_ns = 0
        self._timed = 0
        self._delayed = 0
        self._cpu: dict[int, float] = {}  # worker -> CPU seconds at the last drain

    def add(self, drained: list[Records]) -> float:
        """Take one drain from every worker; returns the CPU seconds they used since the previous drain."""
        cpu = 0.0
        for i, records in enumerate(drained):
            if records.end_ns:
                self._start = np.concatenate([self._start, np.frombuffer(records.start_ns, dtype=np.int64)])
                self._end = np.concatenate([self._end, np.frombuffer(records.end_ns, dtype=np.int64)])
                if records.first_ns:
                    self.streaming = True
                    self._first = np.concatenate([self._first, np.frombuffer(records.first_ns, dtype=np.int64)])
                    self._responses = np.concatenate([self._responses, np.frombuffer(records.responses, dtype=np.int64)])
            self._errors += records.errors
            if records.first_error and not self._first_error:
                self._first_error = records.first_error
            self._send_ns += records.send_ns
            self._recv_ns += records.recv_ns
            self._timed += len(records.end_ns)
            self._delayed += records.delayed
            previous = self._cpu.get(i)
            if previous is not None:
                cpu += records.cpu_s - previous
            self._cpu[i] = records.cpu_s
        return cpu

    def cut(self, start_ns: int, end_ns: int, cpu_s: float) -> Window:
        """The window [start_ns, end_ns): requests completed inside it. Earlier completions are dropped (warm-up),
        later ones wait for the next window."""
        inside = (self._end >= start_ns) & (self._end < end_ns)
        later = self._end >= end_ns
        latencies = self._end[inside] - self._start[inside]
        first = responses = None
        if self.streaming:
            first = self._first[inside] - self._start[inside]
            responses = self._responses[inside]
            self._first = self._first[later]
            self._responses = self._responses[later]
        self._start = self._start[later]
        self._end = self._end[later]
        window = Window(
            start_ns=start_ns,
            end_ns=end_ns,
            latencies_ns=latencies,
            first_ns=first,
            responses=responses,
            errors=self._errors,
            first_error=self._first_error,
            cpu_s=cpu_s,
            send_ns=self._send_ns,
            recv_ns=self._recv_ns,
            timed=self._timed,
            delayed=self._delayed,
        )
        self._errors = 0
        self._first_error = ""
        self._send_ns = self._recv_ns = self._timed = self._delayed = 0
        return window

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]
