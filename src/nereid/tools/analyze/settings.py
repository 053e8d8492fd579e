"""The settings of one `nereid analyze` run (`AnalyzeSettings`), the list parsers behind its flags, and
`AnalyzeError`. Nothing here talks to a server or reads a model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "OBJECTIVES",
    "AnalyzeError",
    "AnalyzeSettings",
    "parse_bool_list",
    "parse_concurrency_list",
    "parse_int_list",
    "parse_objective",
    "parse_preferred_list",
]

# Canonical objective names; each also names the folder of its best config in the output directory.
OBJECTIVES = ("max_throughput", "min_latency")
_OBJECTIVE_ALIASES = {
    "max_throughput": "max_throughput",
    "max-throughput": "max_throughput",
    "throughput": "max_throughput",
    "min_latency": "min_latency",
    "min-latency": "min_latency",
    "latency": "min_latency",
    "min_p99_latency": "min_latency",
}


class AnalyzeError(Exception):
    """A problem the user can fix (bad flag, unknown model, unreachable server, a server that will not start):
    the CLI prints its message on one line and exits non-zero."""


@dataclass(slots=True)
class AnalyzeSettings:
    """Everything `run_analyze` needs. A list left as None takes the default the model allows."""

    model: str
    model_repository: Path | None = None  # needed when analyze starts its own server
    url: str = ""  # HTTP host:port of a running server in explicit mode; empty: start `nereid serve` here
    grpc_url: str = ""  # for -i grpc against a running server (default: the HTTP host, port 8001)
    metrics_url: str = ""  # host:port of the metrics endpoint (default: the HTTP host, port 8002)
    protocol: str = "http"  # what the load generator speaks: http | grpc
    output_dir: Path = Path("analysis")
    mode: str = "quick"  # quick (hill climbing) | brute (every combination)
    objectives: list[str] = field(default_factory=lambda: list(OBJECTIVES))
    max_p99_latency_ms: float | None = None
    min_throughput: float | None = None
    max_memory_mb: float | None = None
    max_batch_sizes: list[int] | None = None
    dynamic_batching: list[bool] | None = None
    max_queue_delays_us: list[int] | None = None
    preferred_batch_sizes: list[str] | None = None  # "none", "max" (the variant's max_batch_size) or a number
    instance_counts: list[int] | None = None
    intra_op_threads: list[int] | None = None  # ONNX models only
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    batch_size: int = 1  # client batch size of each request
    shapes: dict[str, list[int]] = field(default_factory=dict)  # perf --shape for variable dims
    measurement_interval_ms: int = 1000
    max_trials: int = 5
    stability_percentage: float = 20.0
    warmup_s: float = 0.25
    time_budget_s: float = 600.0
    max_variants: int = 0  # 0: no limit besides the time budget
    copy_model_files: bool = False  # copy version folders into the output repository instead of linking them
    server_start_timeout_s: float = 120.0
    load_timeout_s: float = 300.0
    verbose: bool = False

    def validate(self) -> None:
        """Raise `AnalyzeError` naming the flag for any value that cannot work."""
        if not self.model:
            raise AnalyzeError("-m: a model name is required")
        if self.protocol not in ("http", "grpc"):
            raise AnalyzeError(f"-i: expected http or grpc, got '{self.protocol}'")
        if self.mode not in ("quick", "brute"):
            raise AnalyzeError(f"--mode: expected quick or brute, got '{self.mode}'")
        if not self.url and self.model_repository is None:
            raise AnalyzeError("--model-repository is required unless --url names a running server")
        if self.model_repository is not None and not self.model_repository.is_dir():
            raise AnalyzeError(f"--model-repository: '{self.model_repository}' is not a directory")
        if not self.objectives:
            raise AnalyzeError("--objective: at least one objective is needed")
        for name in self.objectives:
            if name not in OBJECTIVES:
                raise AnalyzeError(f"--objective: expected one of {', '.join(OBJECTIVES)}, got '{name}'")
        for flag, limit in (
            ("--max-p99-latency-ms", self.max_p99_latency_ms),
            ("--min-throughput", self.min_throughput),
            ("--max-memory-mb", self.max_memory_mb),
        ):
            if limit is not None and (not math.isfinite(limit) or limit <= 0):
                raise AnalyzeError(f"{flag}: expected a number > 0, got {limit:g}")
        _positive_list("--max-batch-sizes", self.max_batch_sizes)
        _positive_list("--instance-counts", self.instance_counts)
        _positive_list("--intra-op-threads", self.intra_op_threads)
        _positive_list("--concurrency", self.concurrency)
        if self.max_queue_delays_us is not None and (not self.max_queue_delays_us or min(self.max_queue_delays_us) < 0):
            raise AnalyzeError("--max-queue-delays-us: expected microseconds >= 0")
        if self.dynamic_batching is not None and not self.dynamic_batching:
            raise AnalyzeError("--dynamic-batching: expected on, off or both")
        if self.preferred_batch_sizes is not None:
            for token in self.preferred_batch_sizes:
                if token not in ("none", "max") and not (token.isdigit() and int(token) > 0):
                    raise AnalyzeError(f"--preferred-batch-sizes: expected none, max or a number > 0, got '{token}'")
        if self.batch_size < 1:
            raise AnalyzeError(f"--batch-size: expected at least 1, got {self.batch_size}")
        if self.measurement_interval_ms <= 0:
            raise AnalyzeError(f"--measurement-interval-ms: expected milliseconds > 0, got {self.measurement_interval_ms}")
        if self.max_trials < 3:
            raise AnalyzeError(f"--max-trials: stability needs at least 3 windows, got {self.max_trials}")
        if self.stability_percentage <= 0:
            raise AnalyzeError(f"--stability-percentage: expected a percentage > 0, got {self.stability_percentage:g}")
        if self.warmup_s < 0:
            raise AnalyzeError(f"--warmup-s: expected seconds >= 0, got {self.warmup_s:g}")
        if not math.isfinite(self.time_budget_s) or self.time_budget_s <= 0:
            raise AnalyzeError(f"--time-budget-s: expected seconds > 0, got {self.time_budget_s:g}")
        if self.max_variants < 0:
            raise AnalyzeError(f"--max-variants: expected 0 (no limit) or more, got {self.max_variants}")


def _positive_list(flag: str, values: list[int] | None) -> None:
    if values is not None and (not values or min(values) < 1):
        raise AnalyzeError(f"{flag}: expected a comma-separated list of whole numbers >= 1")


def _tokens(flag: str, text: str) -> list[str]:
    tokens = [t.strip() for t in text.split(",")]
    if not text.strip() or any(t == "" for t in tokens):
        raise AnalyzeError(f"{flag}: expected a comma-separated list, got '{text}'")
    return tokens


def parse_int_list(flag: str, text: str, minimum: int = 1) -> list[int]:
    """`1,2,4` (or a range `start:end[:step]`) into sorted distinct whole numbers >= minimum."""
    text = text.strip()
    if ":" in text and "," not in text:
        parts = text.split(":")
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            raise AnalyzeError(f"{flag}: expected whole numbers start:end[:step] or a list a,b,c, got '{text}'") from None
        if len(numbers) not in (2, 3) or (len(numbers) == 3 and numbers[2] < 1) or numbers[1] < numbers[0]:
            raise AnalyzeError(f"{flag}: expected start:end[:step] with end >= start and step >= 1, got '{text}'")
        values = list(range(numbers[0], numbers[1] + 1, numbers[2] if len(numbers) == 3 else 1))
    else:
        try:
            values = [int(t) for t in _tokens(flag, text)]
        except ValueError:
            raise AnalyzeError(f"{flag}: expected whole numbers like 1,2,4, got '{text}'") from None
    if min(values) < minimum:
        raise AnalyzeError(f"{flag}: every value must be >= {minimum}, got '{text}'")
    return sorted(set(values))


def parse_concurrency_list(text: str) -> list[int]:
    """`1,2,4,8` or perf's `start:end:step`."""
    return parse_int_list("--concurrency", text)


def parse_bool_list(text: str) -> list[bool]:
    """`on`, `off` or `both` (also `off,on`): the dynamic batching settings to try, off first."""
    flag = "--dynamic-batching"
    values: set[bool] = set()
    for token in _tokens(flag, text.lower()):
        if token == "both":
            values.update((False, True))
        elif token in ("on", "true", "yes", "1"):
            values.add(True)
        elif token in ("off", "false", "no", "0"):
            values.add(False)
        else:
            raise AnalyzeError(f"{flag}: expected on, off or both, got '{text}'")
    return sorted(values)


def parse_preferred_list(text: str) -> list[str]:
    """`none,max,4`: preferred batch size choices; `max` means the variant's own max_batch_size."""
    flag = "--preferred-batch-sizes"
    choices: list[str] = []
    for token in _tokens(flag, text.lower()):
        if token not in ("none", "max") and not (token.isdigit() and int(token) > 0):
            raise AnalyzeError(f"{flag}: expected none, max or a number > 0, got '{token}'")
        if token not in choices:
            choices.append(token)
    return choices


def parse_objective(text: str) -> str:
    name = _OBJECTIVE_ALIASES.get(text.strip().lower())
    if name is None:
        raise AnalyzeError(f"--objective: expected max_throughput or min_latency, got '{text}'")
    return name
