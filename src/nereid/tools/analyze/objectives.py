"""Objectives (maximum throughput, minimum p99 latency) and constraints (maximum p99 latency, minimum
throughput, maximum memory): which measurements qualify, how a variant scores for the search, and which
measured variant is best for each objective."""

from __future__ import annotations

from dataclasses import dataclass

from nereid.tools.analyze.results import BestPick, LevelMeasurement, VariantOutcome

__all__ = ["Constraints", "Score", "best_pick", "objective_value", "variant_score"]

# A search score: (meets the constraints, value); tuples compare feasible first, then the value (higher is better).
Score = tuple[bool, float]


@dataclass(slots=True)
class Constraints:
    max_p99_latency_ms: float | None = None
    min_throughput: float | None = None
    max_memory_mb: float | None = None

    def as_dict(self) -> dict[str, float]:
        items = {
            "max_p99_latency_ms": self.max_p99_latency_ms,
            "min_throughput": self.min_throughput,
            "max_memory_mb": self.max_memory_mb,
        }
        return {k: v for k, v in items.items() if v is not None}

    def violations(self, m: LevelMeasurement) -> list[str]:
        """What a measurement breaks, in words; memory that could not be measured breaks nothing."""
        found = []
        if self.max_p99_latency_ms is not None and m.p99_ms > self.max_p99_latency_ms:
            found.append(f"p99 {m.p99_ms:.2f} ms > {self.max_p99_latency_ms:g} ms")
        if self.min_throughput is not None and m.throughput < self.min_throughput:
            found.append(f"throughput {m.throughput:.1f}/s < {self.min_throughput:g}/s")
        if self.max_memory_mb is not None and m.server_memory_mb is not None and m.server_memory_mb > self.max_memory_mb:
            found.append(f"memory {m.server_memory_mb:.0f} MB > {self.max_memory_mb:g} MB")
        return found

    def shortfall(self, m: LevelMeasurement) -> float:
        """How far a measurement is from meeting the constraints (0 when it meets them), as a sum of relative
        excesses: what lets a search move out of a region where nothing qualifies."""
        total = 0.0
        if self.max_p99_latency_ms is not None:
            total += max(0.0, m.p99_ms / self.max_p99_latency_ms - 1.0)
        if self.min_throughput is not None:
            total += max(0.0, 1.0 - m.throughput / self.min_throughput)
        if self.max_memory_mb is not None and m.server_memory_mb is not None:
            total += max(0.0, m.server_memory_mb / self.max_memory_mb - 1.0)
        return total

    def mark(self, m: LevelMeasurement) -> None:
        m.violations = self.violations(m)
        m.meets_constraints = not m.violations


def objective_value(objective: str, m: LevelMeasurement) -> float:
    """Higher is better: throughput, or the negated p99 latency."""
    return m.throughput if objective == "max_throughput" else -m.p99_ms


def _better(objective: str, a: LevelMeasurement, b: LevelMeasurement) -> bool:
    """a beats b: by the objective, ties broken by the other figure."""
    if objective == "max_throughput":
        return (a.throughput, -a.p99_ms) > (b.throughput, -b.p99_ms)
    return (-a.p99_ms, a.throughput) > (-b.p99_ms, b.throughput)


def _best_level(objective: str, measurements: list[LevelMeasurement]) -> LevelMeasurement | None:
    best: LevelMeasurement | None = None
    for m in measurements:
        if m.meets_constraints and (best is None or _better(objective, m, best)):
            best = m
    return best


def variant_score(objective: str, outcome: VariantOutcome, constraints: Constraints) -> Score:
    """The variant's best qualifying level by the objective; a variant with none scores by its shortfall."""
    if not outcome.measurements:
        return (False, float("-inf"))
    best = _best_level(objective, outcome.measurements)
    if best is not None:
        return (True, objective_value(objective, best))
    return (False, -min(constraints.shortfall(m) for m in outcome.measurements))


def best_pick(objective: str, outcomes: list[VariantOutcome]) -> BestPick | None:
    """The measured (variant, concurrency) that is best for the objective and meets the constraints."""
    pick: BestPick | None = None
    for outcome in outcomes:
        level = _best_level(objective, outcome.measurements)
        if level is not None and (pick is None or _better(objective, level, pick.measurement)):
            pick = BestPick(objective, outcome, level)
    return pick
