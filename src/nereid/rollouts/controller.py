"""Every model's rollout: started and driven by hand or by its gates on a timer, persisted in a state file, and
asked on the request path. The Server hands it a narrow view of the repository (`VersionsView`); it loads and
unloads nothing itself."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nereid.core.errors import NereidError, Status
from nereid.rollouts.gates import Objectives
from nereid.rollouts.rollout import Rollout, RolloutState
from nereid.rollouts.split import Route
from nereid.rollouts.steps import parse_steps

__all__ = ["RolloutController", "Routing", "VersionsView", "TICK_SECONDS"]

log = logging.getLogger("nereid.rollouts")

TICK_SECONDS = 0.25  # how often open rollouts' gates are judged


class VersionsView(Protocol):
    """What the controller needs of the repository: the ready versions of a model, the one that takes requests
    naming no version, and a version's config parameters (its objectives)."""

    def ready_versions(self, model: str) -> list[str]: ...

    def default_version(self, model: str) -> str | None: ...

    def parameters(self, model: str, version: str) -> Any: ...


@dataclass(slots=True)
class Routing:
    """A request routed by a rollout: the rollout that records its outcome, and the version it is copied to."""

    rollout: Rollout
    shadow: str | None


class RolloutController:
    def __init__(
        self,
        versions: VersionsView,
        state_file: str = "",
        clock: Callable[[], float] = time.time,
        input_drift: Callable[[str, str], float | None] = lambda model, version: None,
        compare_with: Callable[[str, str, str], None] = lambda model, candidate, primary: None,
    ) -> None:
        self._versions = versions
        # The monitor's side: a version's input drift now, and telling it a candidate's reference is its primary's.
        self._input_drift = input_drift
        self._compare_with = compare_with
        self._state_file = Path(state_file) if state_file else None
        self._clock = clock
        self._rollouts: dict[str, Rollout] = {}
        # The models whose requests naming no version a rollout routes (running, paused, or ended with a choice that
        # lasts): the request path checks this dict first, and an empty one costs it one test.
        self.routing: dict[str, Rollout] = {}
        self._task: asyncio.Task[None] | None = None
        self.shadows_shed = 0
        self.rollbacks: dict[str, int] = {}  # model -> rollouts rolled back (by a gate or by hand)

    # -- the request path ----------------------------------------------------------------------------------------
    def route(self, rollout: Rollout, parameters: dict[str, Any]) -> tuple[Route, Routing | None]:
        """Where a request naming no version goes; a Routing when the rollout's windows count it."""
        key = parameters.get(rollout.sticky_key) if rollout.sticky_key else None
        route = rollout.route(None if key is None else str(key))
        return route, Routing(rollout, route.shadow) if rollout.state is RolloutState.RUNNING else None

    # -- life ------------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Read the state file (open rollouts resume their step) and start judging gates."""
        self._load()
        self._task = asyncio.get_running_loop().create_task(self._judge_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._save()

    async def _judge_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self.judge()

    def judge(self) -> None:
        """One round of gates: each running rollout moves on, is promoted or rolls back."""
        now = self._clock()
        changed = False
        for rollout in list(self._rollouts.values()):
            before = (rollout.state, rollout.step)
            rollout.tick(now, self._input_drift(rollout.model, rollout.candidate) if rollout.open else None)
            if (rollout.state, rollout.step) != before:
                changed = True
                self._announce(rollout)
        if changed:
            self._save()

    # -- by hand -------------------------------------------------------------------------------------------------
    def begin(self, model: str, candidate: str, steps: str, sticky_key: str = "") -> Rollout:
        """Start a rollout of `candidate` against the version that now takes requests naming no version (or, when
        that is the candidate itself, the newest other ready version)."""
        current = self._rollouts.get(model)
        if current is not None and current.open:
            raise NereidError(
                Status.ALREADY_EXISTS,
                f"[model '{model}'] a rollout of version {current.candidate} is {current.state.value}: abort or "
                f"promote it first",
            )
        ready = self._versions.ready_versions(model)
        if candidate not in ready:
            raise NereidError.unavailable(
                f"[model '{model}'] rollout: version {candidate} is not ready (ready: {', '.join(ready) or 'none'})"
            )
        primary = self._primary(model, candidate, ready, current)
        objectives = Objectives.from_parameters(self._versions.parameters(model, candidate), model)
        rollout = Rollout.start(model, primary, candidate, parse_steps(steps), self._clock(), objectives, sticky_key)
        self._rollouts[model] = self.routing[model] = rollout
        self._compare_with(model, candidate, primary)
        self._announce(rollout)
        self._save()
        return rollout

    def act(self, model: str, action: str) -> Rollout:
        """pause, resume, abort, promote or undo the model's rollout."""
        rollout = self.get(model)
        now = self._clock()
        if action == "pause":
            rollout.pause(now)
        elif action == "resume":
            rollout.resume(now)
        elif action == "abort":
            rollout.abort(now)
        elif action == "promote":
            rollout.promote(now)
        elif action == "undo":
            rollout.undo(now)
        else:
            raise NereidError.invalid(f"unknown rollout action '{action}': pause, resume, abort, promote or undo")
        self._announce(rollout)
        self._save()
        return rollout

    def get(self, model: str) -> Rollout:
        rollout = self._rollouts.get(model)
        if rollout is None:
            raise NereidError.not_found(f"[model '{model}'] has no rollout")
        return rollout

    def status(self, model: str) -> dict[str, Any]:
        return self.get(model).status(self._clock())

    def all(self) -> list[Rollout]:
        return list(self._rollouts.values())

    # -- inside ----------------------------------------------------------------------------------------------------
    def _primary(self, model: str, candidate: str, ready: list[str], current: Rollout | None) -> str:
        if current is not None and current.state is RolloutState.PROMOTED:
            default: str | None = current.candidate
        elif current is not None:
            default = current.primary
        else:
            default = self._versions.default_version(model)
        if default is not None and default != candidate:
            return default
        others = sorted((v for v in ready if v != candidate), key=int, reverse=True)
        if not others:
            raise NereidError.unavailable(
                f"[model '{model}'] rollout: no other ready version to be the primary beside version {candidate}"
            )
        return others[0]

    def _announce(self, rollout: Rollout) -> None:
        if rollout.state is RolloutState.ROLLED_BACK:
            self.rollbacks[rollout.model] = self.rollbacks.get(rollout.model, 0) + 1
        event = rollout.history[-1] if rollout.history else None
        if event is None:
            return
        level = logging.WARNING if rollout.state is RolloutState.ROLLED_BACK else logging.INFO
        log.log(level, "rollout of model '%s' version %s: %s%s", rollout.model, rollout.candidate, event.what,
                f" ({event.detail})" if event.detail else "")  # fmt: skip

    def _load(self) -> None:
        if self._state_file is None or not self._state_file.exists():
            return
        try:
            saved = json.loads(self._state_file.read_text())
            now = self._clock()
            for data in saved.get("rollouts", []):
                rollout = Rollout.from_json(data, now)
                self._rollouts[rollout.model] = self.routing[rollout.model] = rollout
        except (OSError, ValueError, KeyError, TypeError, NereidError) as exc:
            log.error("rollout state file '%s' could not be read, starting without rollouts: %s", self._state_file, exc)

    def _save(self) -> None:
        if self._state_file is None:
            return
        data = {"rollouts": [rollout.to_json() for rollout in self._rollouts.values()]}
        temporary = self._state_file.with_suffix(self._state_file.suffix + ".tmp")
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(data, indent=1))
            os.replace(temporary, self._state_file)  # a crash mid-write leaves the previous state whole
        except OSError as exc:
            log.error("rollout state file '%s' could not be written: %s", self._state_file, exc)
