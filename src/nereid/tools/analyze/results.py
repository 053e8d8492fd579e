"""What an analysis found: one `LevelMeasurement` per variant and concurrency, a `VariantOutcome` per variant
(its config and measurements, or why it failed), the `BestPick` of each objective and the `AnalyzeResult`
that the report, the CSV and the output repository are written from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.tools.analyze.search_space import Variant

__all__ = ["AnalyzeResult", "BestPick", "LevelMeasurement", "VariantOutcome"]


@dataclass(slots=True)
class LevelMeasurement:
    """One variant at one concurrency: the load generator's numbers and the server's resources meanwhile."""

    variant: str
    concurrency: int
    throughput: float  # inferences per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_us: float | None
    server_compute_us: float | None
    client_cpu_percent: float
    server_cpu_percent: float | None  # 100 = one core busy (process tree), or machine-wide from the metrics
    server_memory_mb: float | None  # peak resident memory of the server process tree (or machine-wide used)
    gpu_utilization_percent: float | None
    gpu_memory_mb: float | None
    stable: bool
    meets_constraints: bool = True
    violations: list[str] = field(default_factory=list)


@dataclass(slots=True)
class VariantOutcome:
    label: str  # the variant's name, or "baseline" for the model's own config
    variant: Variant
    config_text: str  # the config.pbtxt this variant loads
    order: int  # 1 for the first variant measured
    measurements: list[LevelMeasurement] = field(default_factory=list)
    error: str | None = None  # why it could not be loaded or measured
    load_s: float = 0.0
    complete: bool = True  # False when the time budget cut its concurrency sweep short

    @property
    def measured(self) -> bool:
        return bool(self.measurements)

    @property
    def is_baseline(self) -> bool:
        return self.label == "baseline"


@dataclass(slots=True)
class BestPick:
    objective: str
    outcome: VariantOutcome
    measurement: LevelMeasurement
    config_path: Path | None = None  # where its config.pbtxt was written


@dataclass(slots=True)
class AnalyzeResult:
    model: str
    server: str  # "nereid serve (started by analyze)" or the URL
    mode: str
    objectives: list[str]
    constraints: dict[str, float]
    search_space: str
    resource_source: str  # where CPU and memory figures come from
    outcomes: list[VariantOutcome] = field(default_factory=list)
    best: dict[str, BestPick] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stopped_early: str | None = None  # why the search ended before the strategy was done
    fatal: str | None = None  # an error that ended the search (the server exited)
    elapsed_s: float = 0.0
    time_budget_s: float = 0.0
    variants_in_space: int = 0
    files: dict[str, Path] = field(default_factory=dict)  # report files by kind

    @property
    def measurements(self) -> list[LevelMeasurement]:
        return [m for outcome in self.outcomes for m in outcome.measurements]

    def to_dict(self) -> dict[str, Any]:
        def outcome_dict(o: VariantOutcome) -> dict[str, Any]:
            return {
                "label": o.label,
                "variant": o.variant.name,
                "description": o.variant.describe(),
                "error": o.error,
                "load_s": o.load_s,
                "complete": o.complete,
                "config": o.config_text,
                "measurements": [_measurement_dict(m) for m in o.measurements],
            }

        return {
            "model": self.model,
            "server": self.server,
            "mode": self.mode,
            "objectives": self.objectives,
            "constraints": self.constraints,
            "search_space": self.search_space,
            "resource_source": self.resource_source,
            "elapsed_s": self.elapsed_s,
            "time_budget_s": self.time_budget_s,
            "variants_in_space": self.variants_in_space,
            "stopped_early": self.stopped_early,
            "fatal": self.fatal,
            "notes": self.notes,
            "best": {
                name: {
                    "variant": pick.outcome.label,
                    "concurrency": pick.measurement.concurrency,
                    "throughput": pick.measurement.throughput,
                    "p99_ms": pick.measurement.p99_ms,
                    "config_path": str(pick.config_path) if pick.config_path else None,
                }
                for name, pick in self.best.items()
            },
            "variants": [outcome_dict(o) for o in self.outcomes],
        }


def _measurement_dict(m: LevelMeasurement) -> dict[str, Any]:
    return {name: getattr(m, name) for name in LevelMeasurement.__slots__}  # type: ignore[attr-defined]
