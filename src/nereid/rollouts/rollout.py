"""One model's rollout as a state machine: the split of its current step, both versions' windows, and the gate that
moves it on, promotes it or rolls it back. Time comes in as an argument, so it is tested without waiting; it never
loads or unloads a model (the controller around it does)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from nereid.core.errors import NereidError
from nereid.rollouts.gates import Objectives, Verdict, judge
from nereid.rollouts.split import Route, VersionSplit
from nereid.rollouts.steps import Step, format_steps, parse_steps
from nereid.rollouts.window import VersionWindow

__all__ = ["Rollout", "RolloutState", "Event"]


class RolloutState(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


_OPEN = (RolloutState.RUNNING, RolloutState.PAUSED)


@dataclass(frozen=True, slots=True)
class Event:
    """A line of the rollout's history: when (wall-clock seconds), what, and why."""

    at: float
    what: str
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "event": self.what, "detail": self.detail}


@dataclass(slots=True)
class Rollout:
    model: str
    primary: str
    candidate: str
    steps: list[Step]
    objectives: Objectives = field(default_factory=Objectives)
    sticky_key: str = ""
    state: RolloutState = RolloutState.RUNNING
    step: int = 0
    step_started: float = 0.0  # wall-clock seconds; restarts keep the step, with a fresh window
    reason: str = ""
    history: list[Event] = field(default_factory=list)
    split: VersionSplit | None = None
    windows: dict[str, VersionWindow] = field(default_factory=dict)

    @classmethod
    def start(
        cls, model: str, primary: str, candidate: str, steps: list[Step], now: float, objectives: Objectives | None = None,
        sticky_key: str = "",
    ) -> Rollout:  # fmt: skip
        if primary == candidate:
            raise NereidError.invalid(f"[model '{model}'] rollout: version {candidate} is already the primary")
        rollout = cls(model, primary, candidate, steps, objectives or Objectives(), sticky_key)
        rollout._enter_step(0, now)
        rollout._log(now, "started", f"{candidate} against {primary}: {format_steps(steps)}")
        return rollout

    # -- the request path ----------------------------------------------------------------------------------------
    def route(self, key: str | None) -> Route:
        """Where a request naming no version goes now."""
        split = self.split
        if split is not None:
            return split.route(key)
        return Route(self.settled_version())

    def record(self, version: str, latency_ns: int, failed: bool) -> None:
        window = self.windows.get(version)
        if window is not None:
            window.record(latency_ns, failed)

    def record_comparison(self, divergence: float) -> None:
        window = self.windows.get(self.candidate)
        if window is not None:
            window.record_comparison(divergence)

    # -- the gate ------------------------------------------------------------------------------------------------
    def tick(self, now: float, input_drift: float | None = None) -> Verdict | None:
        """Judge the current step: a failing gate (once the step has its minimum of candidate requests) rolls back at
        once; a passing one moves on when the step has also lasted its duration. Returns the verdict acted on."""
        if self.state is not RolloutState.RUNNING:
            return None
        step = self.steps[self.step]
        candidate = self.windows[self.candidate].figures()
        if candidate.requests < step.min_requests:
            return None
        verdict = judge(candidate, self.windows[self.primary].figures(), self.objectives, input_drift)
        if not verdict.passed:
            self.roll_back(now, f"step {self.step} ({step}) failed its gate: {verdict.reason}")
            return verdict
        if now - self.step_started >= step.seconds:
            self._log(now, "step passed", f"step {self.step} ({step}): {self._summary()}")
            if self.step + 1 < len(self.steps):
                self._enter_step(self.step + 1, now)
            else:
                self.promote(now, "every step passed its gate")
            return verdict
        return None

    # -- by hand (and by the gate) -------------------------------------------------------------------------------
    def pause(self, now: float) -> None:
        self._require(RolloutState.RUNNING, "pause")
        self.state, self.split = RolloutState.PAUSED, None  # all traffic to the primary while paused
        self._log(now, "paused")

    def resume(self, now: float) -> None:
        self._require(RolloutState.PAUSED, "resume")
        self.state = RolloutState.RUNNING
        self._enter_step(self.step, now)
        self._log(now, "resumed", f"step {self.step} starts over")

    def abort(self, now: float, reason: str = "aborted by hand") -> None:
        self._require_open("abort")
        self._end(RolloutState.ABORTED, now, reason)

    def roll_back(self, now: float, reason: str) -> None:
        self._require_open("roll back")
        self._end(RolloutState.ROLLED_BACK, now, reason)

    def promote(self, now: float, reason: str = "promoted by hand") -> None:
        self._require_open("promote")
        self._end(RolloutState.PROMOTED, now, reason)

    def undo(self, now: float) -> None:
        """Undo the promotion: the previous version takes full traffic again."""
        if self.state is not RolloutState.PROMOTED:
            raise NereidError.invalid(f"[model '{self.model}'] rollout: only a promotion can be undone, this one is {self.state.value}")
        self.state = RolloutState.ROLLED_BACK
        self.reason = "promotion undone by hand"
        self._log(now, "undone", f"{self.primary} takes full traffic again")

    @property
    def open(self) -> bool:
        return self.state in _OPEN

    def settled_version(self) -> str:
        """The version requests naming no version get where no split applies: the primary until a promotion."""
        return self.candidate if self.state is RolloutState.PROMOTED else self.primary

    def held_versions(self) -> list[str]:
        """The versions this rollout needs loaded, the settled one first: both while it is open, then the one it
        chose."""
        if self.open:
            return [self.primary, self.candidate]
        return [self.settled_version()]

    # -- status and persistence ----------------------------------------------------------------------------------
    def status(self, now: float) -> dict[str, Any]:
        step = self.steps[self.step]
        return {
            "model": self.model,
            "primary": self.primary,
            "candidate": self.candidate,
            "state": self.state.value,
            "step": self.step,
            "steps": format_steps(self.steps),
            "current_step": {"kind": step.kind, "percent": step.percent, "seconds": step.seconds,
                             "min_requests": step.min_requests, "elapsed_seconds": round(max(0.0, now - self.step_started), 3)},
            "reason": self.reason,
            "sticky_key": self.sticky_key,
            "versions": {version: window.figures().as_dict() for version, window in self.windows.items()},
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "primary": self.primary, "candidate": self.candidate, "steps": format_steps(self.steps),
            "objectives": {k: v for k, v in _objective_items(self.objectives) if v is not None},
            "sticky_key": self.sticky_key, "state": self.state.value, "step": self.step, "step_started": self.step_started,
            "reason": self.reason, "history": [event.as_dict() for event in self.history],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any], now: float) -> Rollout:
        """A rollout from its state file: an open one resumes its step with fresh windows (counted from `now`)."""
        rollout = cls(
            data["model"], data["primary"], data["candidate"], parse_steps(data["steps"]),
            Objectives(**data.get("objectives", {})), data.get("sticky_key", ""), RolloutState(data["state"]),
            int(data["step"]), float(data.get("step_started", now)), data.get("reason", ""),
            [Event(e["at"], e["event"], e.get("detail", "")) for e in data.get("history", [])],
        )  # fmt: skip
        if rollout.state is RolloutState.RUNNING:
            rollout._enter_step(rollout.step, now)
            rollout._log(now, "resumed after a restart", f"step {rollout.step} starts over")
        return rollout

    # -- inside ----------------------------------------------------------------------------------------------------
    def _enter_step(self, index: int, now: float) -> None:
        self.step, self.step_started = index, now
        step = self.steps[index]
        if step.kind == "canary":
            self.split = VersionSplit(self.primary, self.candidate, canary_percent=step.percent)
        else:
            self.split = VersionSplit(self.primary, self.candidate, shadow_percent=step.percent)
        self.windows = {self.primary: VersionWindow(), self.candidate: VersionWindow()}
        if index:
            self._log(now, "step started", f"step {index} ({step})")

    def _end(self, state: RolloutState, now: float, reason: str) -> None:
        self.state, self.reason, self.split = state, reason, None
        self._log(now, state.value, reason)

    def _summary(self) -> str:
        c, p = self.windows[self.candidate].figures(), self.windows[self.primary].figures()
        return (
            f"candidate {c.requests} requests, {c.error_rate:.2%} errors, p99 {c.p99_ms:.1f} ms; "
            f"primary {p.requests} requests, {p.error_rate:.2%} errors, p99 {p.p99_ms:.1f} ms"
        )

    def _log(self, now: float, what: str, detail: str = "") -> None:
        self.history.append(Event(now, what, detail))

    def _require(self, state: RolloutState, action: str) -> None:
        if self.state is not state:
            raise NereidError.invalid(f"[model '{self.model}'] rollout: cannot {action} a rollout that is {self.state.value}")

    def _require_open(self, action: str) -> None:
        if not self.open:
            raise NereidError.invalid(f"[model '{self.model}'] rollout: cannot {action} a rollout that is {self.state.value}")


def _objective_items(objectives: Objectives) -> list[tuple[str, float | None]]:
    return [(name, getattr(objectives, name)) for name in Objectives.__dataclass_fields__]
