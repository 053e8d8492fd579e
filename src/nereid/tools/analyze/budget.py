"""`TimeBudget`: the deadline of the whole search and running estimates of what a variant load and one
measured level cost, so analyze stops before it would overrun instead of after."""

from __future__ import annotations

import time

__all__ = ["TimeBudget"]


class TimeBudget:
    def __init__(self, seconds: float, measurement_interval_ms: int, warmup_s: float) -> None:
        self.started = time.monotonic()
        self.seconds = seconds
        # Kept back for unloading, restoring the model, stopping the server and writing the report (~1 s).
        self.reserve_s = min(5.0, max(1.5, 0.1 * seconds), 0.5 * seconds)
        self.deadline = self.started + seconds - self.reserve_s
        self._interval_s = measurement_interval_ms / 1000.0
        # A level takes at least three windows plus worker start-up and warm-up.
        self._level_s = [3 * self._interval_s + warmup_s + 0.3]
        self._load_s = [1.0]
        self._level_observed = False
        self._load_observed = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def minimum_level_s(self) -> float:
        return self._level_s[0] if not self._level_observed else min(self._level_s)

    def level_estimate(self) -> float:
        """What the next level is expected to take: the mean of those measured so far."""
        return sum(self._level_s) / len(self._level_s)

    def load_estimate(self) -> float:
        return sum(self._load_s) / len(self._load_s)

    def observe_level(self, seconds: float) -> None:
        if not self._level_observed:
            self._level_s, self._level_observed = [], True
        self._level_s.append(seconds)

    def observe_load(self, seconds: float) -> None:
        if not self._load_observed:
            self._load_s, self._load_observed = [], True
        self._load_s.append(seconds)

    def trials_that_fit(self, max_trials: int) -> int:
        """How many measurement windows still fit before the deadline (at least 3, which the caller checks)."""
        usable = self.remaining() - 0.5
        return max(3, min(max_trials, int(usable / self._interval_s)))

    def fits_level(self) -> bool:
        """Is there time for at least a minimal (three-window) level?"""
        return self.remaining() >= max(3 * self._interval_s + 0.3, self.minimum_level_s())

    def fits_variant(self) -> bool:
        return self.remaining() >= self.load_estimate() + max(3 * self._interval_s + 0.3, self.minimum_level_s())
