"""Search strategies: which variant to measure next. `BruteForceSearch` tries every point of the grid;
`HillClimbSearch` starts at the model's own config and moves to the best neighbour (one knob one step)
while that improves the primary objective. Both only propose; the runner measures and reports scores back."""

from __future__ import annotations

from typing import Protocol

from nereid.tools.analyze.objectives import Score
from nereid.tools.analyze.search_space import Point, SearchSpace, Variant

__all__ = ["BruteForceSearch", "HillClimbSearch", "SearchStrategy", "make_strategy"]

# A move must beat the current point by this fraction: smaller differences are measurement noise.
_MIN_IMPROVEMENT = 0.02


class SearchStrategy(Protocol):
    def next_variant(self) -> Variant | None: ...
    def record(self, variant: Variant, score: Score) -> None: ...
    def status(self) -> str: ...


class BruteForceSearch:
    """Every distinct variant of the grid, in grid order."""

    def __init__(self, space: SearchSpace) -> None:
        self._variants = space.all_variants()
        self._scores: dict[Variant, Score] = {}

    def next_variant(self) -> Variant | None:
        return next((v for v in self._variants if v not in self._scores), None)

    def record(self, variant: Variant, score: Score) -> None:
        self._scores[variant] = score

    def status(self) -> str:
        left = sum(1 for v in self._variants if v not in self._scores)
        return f"{left} of {len(self._variants)} left"


def improves(new: Score, old: Score) -> bool:
    if new[0] and old[0]:
        return new[1] > old[1] + _MIN_IMPROVEMENT * abs(old[1])
    return new > old


class HillClimbSearch:
    """Steepest-ascent hill climbing over the grid: measure every neighbour of the current point, move to the best
    one if it is better by more than noise, stop at a local optimum."""

    def __init__(self, space: SearchSpace, start: Variant) -> None:
        self._space = space
        self._current: Point = self._valid_start(space.nearest_point(start))
        self._frontier: list[Point] | None = None
        self._scores: dict[Variant, Score] = {}
        self._done = False
        self.moves = 0

    def _valid_start(self, point: Point) -> Point:
        if self._space.variant_at(point) is not None:
            return point
        return next(p for p in self._space.points() if self._space.variant_at(p) is not None)

    def _variant(self, point: Point) -> Variant:
        variant = self._space.variant_at(point)
        assert variant is not None
        return variant

    def next_variant(self) -> Variant | None:
        while not self._done:
            current = self._variant(self._current)
            if current not in self._scores:
                return current
            if self._frontier is None:
                frontier = []
                for point in self._space.neighbours(self._current):
                    variant = self._space.variant_at(point)
                    if variant is not None and variant != current:
                        frontier.append(point)
                self._frontier = frontier
            for point in self._frontier:
                variant = self._variant(point)
                if variant not in self._scores:
                    return variant
            best = max(self._frontier, key=lambda p: self._scores[self._variant(p)], default=None)
            if best is not None and improves(self._scores[self._variant(best)], self._scores[current]):
                self._current, self._frontier = best, None
                self.moves += 1
                continue
            self._done = True
        return None

    def record(self, variant: Variant, score: Score) -> None:
        self._scores[variant] = score

    def status(self) -> str:
        return f"climbing from {self._variant(self._current).name} ({self.moves} move(s) so far)"


def make_strategy(mode: str, space: SearchSpace, start: Variant) -> SearchStrategy:
    return BruteForceSearch(space) if mode == "brute" else HillClimbSearch(space, start)
