"""The settings of one `nereid perf` run (`PerfConfig`), the range parsers behind its flags, and `PerfError`.

Nothing here talks to a server; the CLI and `run_perf` callers both build a `PerfConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "PerfConfig",
    "PerfError",
    "parse_concurrency_range",
    "parse_request_rate_range",
    "parse_sequence_id_range",
    "parse_shape",
]

# Without an explicit end (end == 0), a search stops at the latency threshold or at these levels.
_Number = TypeVar("_Number", int, float)

_OPEN_CONCURRENCY_LIMIT = 1024
_OPEN_RATE_STEPS = 1000


class PerfError(Exception):
    """A problem the user can fix (bad flag, unknown model, unreachable server, failing requests): the CLI
    prints its message on one line and exits non-zero."""


@dataclass(slots=True)
class PerfConfig:
    """Everything `run_perf` needs. Field names follow perf_analyzer's flags; times are in their units."""

    model_name: str
    model_version: str = ""
    url: str = ""  # host:port; empty means localhost:8000 (HTTP) or localhost:8001 (gRPC)
    protocol: str = "http"  # http | grpc
    concurrency_range: tuple[int, int, int] | None = None  # start, end (0: open), step
    request_rate_range: tuple[float, float, float] | None = None  # start, end (0: open), step
    request_distribution: str = "constant"  # constant | poisson
    batch_size: int = 1
    measurement_interval_ms: int = 5000
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: int | None = None  # stabilise on this latency percentile instead of the average
    latency_threshold_ms: float = 0.0  # stop a search once the stabilising latency exceeds this
    input_data: list[str] = field(default_factory=lambda: ["random"])  # random | zero | JSON file | directory
    shapes: dict[str, list[int]] = field(default_factory=dict)  # input name -> shape without the batch dim
    string_length: int = 128
    string_data: str | None = None
    input_tensor_format: str = "binary"  # HTTP only: binary | json
    output_tensor_format: str = "binary"  # HTTP only: binary | json
    streaming: bool = False  # gRPC bidirectional stream
    async_mode: bool = False  # accepted for compatibility: every client here is asynchronous
    sequence_length: int = 20
    sequence_length_variation: float = 20.0
    sequence_length_given: bool = False  # True when --sequence-length was given explicitly
    sequence_id_range: tuple[int, int | None] = (1, None)
    num_of_sequences: int = 4  # concurrent sequences in request-rate mode
    shared_memory: str = "none"  # none | system
    output_shared_memory_size: int = 102400
    headers: dict[str, str] = field(default_factory=dict)  # extra HTTP headers
    workers: int = 0  # load-generator processes; 0 chooses from the load and the CPU count
    request_timeout_s: float = 60.0
    warmup_s: float = 0.0  # load before the first measurement window
    seed: int = 0
    verbose: bool = False

    @property
    def server_url(self) -> str:
        if self.url:
            return self.url
        return "localhost:8001" if self.protocol == "grpc" else "localhost:8000"

    @property
    def mode(self) -> str:
        return "request_rate" if self.request_rate_range is not None else "concurrency"

    def validate(self) -> None:
        """Raise `PerfError` naming the flag for any value perf_analyzer would refuse."""
        if not self.model_name:
            raise PerfError("-m: a model name is required")
        if self.protocol not in ("http", "grpc"):
            raise PerfError(f"-i: expected http or grpc, got '{self.protocol}'")
        if self.concurrency_range is not None and self.request_rate_range is not None:
            raise PerfError("--concurrency-range and --request-rate-range cannot be used together")
        if self.concurrency_range is not None:
            _check_range("--concurrency-range", self.concurrency_range)
        if self.request_rate_range is not None:
            _check_range("--request-rate-range", self.request_rate_range)
        if self.request_distribution not in ("constant", "poisson"):
            raise PerfError(f"--request-distribution: expected constant or poisson, got '{self.request_distribution}'")
        if self.batch_size < 1:
            raise PerfError(f"-b: batch size must be at least 1, got {self.batch_size}")
        if self.measurement_interval_ms <= 0:
            raise PerfError(f"--measurement-interval: expected milliseconds > 0, got {self.measurement_interval_ms}")
        if self.stability_percentage <= 0:
            raise PerfError(f"--stability-percentage: expected a percentage > 0, got {self.stability_percentage}")
        if self.max_trials < 3:
            raise PerfError(f"--max-trials: stability needs at least 3 windows, got {self.max_trials}")
        if self.percentile is not None and not 0 < self.percentile < 100:
            raise PerfError(f"--percentile: expected 1..99, got {self.percentile}")
        if self.latency_threshold_ms < 0:
            raise PerfError(f"--latency-threshold: expected milliseconds >= 0, got {self.latency_threshold_ms}")
        rng = self.request_rate_range or self.concurrency_range or (1, 1, 1)
        if rng[1] == 0 and self.latency_threshold_ms == 0:
            raise PerfError("an open range (end 0) needs --latency-threshold to know when to stop")
        if self.streaming and self.protocol != "grpc":
            raise PerfError("--streaming needs -i grpc")
        for flag, value in (("--input-tensor-format", self.input_tensor_format), ("--output-tensor-format", self.output_tensor_format)):
            if value not in ("binary", "json"):
                raise PerfError(f"{flag}: expected binary or json, got '{value}'")
        if self.shared_memory not in ("none", "system"):
            raise PerfError(f"--shared-memory: expected none or system, got '{self.shared_memory}' (cuda is not supported)")
        if self.sequence_length < 1:
            raise PerfError(f"--sequence-length: expected at least 1, got {self.sequence_length}")
        if not 0 <= self.sequence_length_variation < 100:
            raise PerfError(f"--sequence-length-variation: expected 0..99, got {self.sequence_length_variation}")
        if self.num_of_sequences < 1:
            raise PerfError(f"--num-of-sequences: expected at least 1, got {self.num_of_sequences}")
        if self.workers < 0:
            raise PerfError(f"--workers: expected 0 (automatic) or more, got {self.workers}")
        if self.string_length < 1:
            raise PerfError(f"--string-length: expected at least 1, got {self.string_length}")
        if self.request_timeout_s <= 0:
            raise PerfError(f"--request-timeout: expected seconds > 0, got {self.request_timeout_s}")
        if not self.input_data:
            raise PerfError("--input-data: expected random, zero or a path")

    def levels(self) -> list[float]:
        """The load levels to measure, in order; an open range lists them up to a safety limit."""
        if self.request_rate_range is not None:
            start, end, step = self.request_rate_range
            if end == 0:
                return [start + i * step for i in range(_OPEN_RATE_STEPS)]
            count = int(math.floor((end - start) / step + 1e-9)) + 1
            return [round(start + i * step, 9) for i in range(count)]
        start_c, end_c, step_c = self.concurrency_range or (1, 1, 1)
        stop = _OPEN_CONCURRENCY_LIMIT if end_c == 0 else end_c
        return [float(c) for c in range(start_c, stop + 1, step_c)]


def _check_range(flag: str, value: tuple[float, float, float]) -> None:
    start, end, step = value
    if start <= 0 or step <= 0 or (end != 0 and end < start):
        raise PerfError(f"{flag}: expected start[:end[:step]] with start > 0, step > 0 and end >= start (or 0), got {_fmt(value)}")


def _fmt(value: tuple[float, ...]) -> str:
    return ":".join(f"{v:g}" for v in value)


def _split_range(flag: str, text: str) -> list[str]:
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or any(p.strip() == "" for p in parts):
        raise PerfError(f"{flag}: expected start[:end[:step]], got '{text}'")
    return parts


def _range_of(flag: str, text: str, convert: Callable[[str], _Number], what: str) -> tuple[_Number, _Number, _Number]:
    """`start[:end[:step]]` converted by `convert`; a missing end is `start`, a missing step 1."""
    parts = _split_range(flag, text)
    try:
        numbers = [convert(p) for p in parts]
    except ValueError:
        raise PerfError(f"{flag}: expected {what} start[:end[:step]], got '{text}'") from None
    start = numbers[0]
    end = numbers[1] if len(numbers) > 1 else start
    step = numbers[2] if len(numbers) > 2 else convert("1")
    return start, end, step


def parse_concurrency_range(text: str) -> tuple[int, int, int]:
    """`start[:end[:step]]` of whole numbers; a missing end means just `start`, end 0 means open."""
    flag = "--concurrency-range"
    value = _range_of(flag, text, int, "whole numbers")
    _check_range(flag, value)
    return value


def parse_request_rate_range(text: str) -> tuple[float, float, float]:
    """`start[:end[:step]]` of requests per second (decimals allowed)."""
    flag = "--request-rate-range"
    value = _range_of(flag, text, float, "numbers")
    if any(not math.isfinite(n) for n in value):
        raise PerfError(f"{flag}: expected finite numbers, got '{text}'")
    _check_range(flag, value)
    return value


def parse_sequence_id_range(text: str) -> tuple[int, int | None]:
    """`start[:end]`: sequence ids from start up to end (excluded); no end means unbounded."""
    parts = text.strip().split(":")
    try:
        if len(parts) == 1:
            start, end = int(parts[0]), None
        elif len(parts) == 2:
            start, end = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise PerfError(f"--sequence-id-range: expected start[:end] with whole numbers, got '{text}'") from None
    if start < 1 or (end is not None and end <= start):
        raise PerfError(f"--sequence-id-range: expected 1 <= start < end, got '{text}'")
    return start, end


def parse_shape(text: str) -> tuple[str, list[int]]:
    """`NAME:d1,d2,...` (the shape without the batch dimension). The name may itself contain ':'."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise PerfError(f"--shape: expected NAME:d1,d2,..., got '{text}'")
    try:
        shape = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        raise PerfError(f"--shape: dimensions must be whole numbers, got '{text}'") from None
    if any(d < 0 for d in shape):
        raise PerfError(f"--shape: dimensions must be >= 0, got '{text}'")
    return name, shape
