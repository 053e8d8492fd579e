"""Every model's rollout: started and driven by hand or by its gates on a timer, persisted in a state file, and
asked on the request path. The Server hands it a narrow view of the repository (`VersionsView`), through which it
holds the versions each rollout needs loaded (beyond the version policy, and pinned under the memory budget while
the rollout is open)."""

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
    naming no version, a version's config parameters (its objectives), and holding versions loaded."""

    def ready_versions(self, model: str) -> list[str]: ...

    def default_version(self, model: str) -> str | None: ...

    def parameters(self, model: str, version: str) -> Any: ...

    def in_repository(self, model: str, version: str) -> bool:
        """Whether the repository holds this version of the model, loaded or not."""

    def hold(self, model: str, versions: list[str], pin: bool) -> None:
        """Keep these versions loaded beside the version policy's from the next load on; `pin`: never evicted. The
        first is the one requests naming no version get where no split applies (Rollout.held_versions)."""

    async def apply_held(self, model: str) -> None:
        """Load or retire versions now, so that what is loaded is the policy's and the held ones."""


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
        cost: Callable[[str, str], tuple[int, int] | None] = lambda model, version: None,
    ) -> None:
        self._versions = versions
        # The monitor's side: a version's input drift now, and telling it a candidate's reference is its primary's.
        self._input_drift = input_drift
        self._compare_with = compare_with
        self._cost = cost  # a version's cumulative (CPU ns, requests executed), for the cost objective
        self._state_file = Path(state_file) if state_file else None
        self._clock = clock
        self._rollouts: dict[str, Rollout] = {}
        # The models whose requests naming no version a rollout routes (running, paused, or ended with a choice that
        # lasts): the request path checks this dict first, and an empty one costs it one test.
        self.routing: dict[str, Rollout] = {}
        self._routings: dict[str, tuple[Routing, Routing]] = {}  # each model's: not copied, copied to the candidate
        self._task: asyncio.Task[None] | None = None
        self._settling: set[asyncio.Task[None]] = set()  # retiring the versions ended rollouts let go of
        self._starting: set[str] = set()  # models whose rollout is loading its candidate
        self.shadows_shed = 0
        self.rollbacks: dict[str, int] = {}  # model -> rollouts rolled back (by a gate or by hand)

    # -- the request path ----------------------------------------------------------------------------------------
    def route(self, rollout: Rollout, parameters: dict[str, Any]) -> tuple[Route, Routing | None]:
        """Where a request naming no version goes; a Routing when the rollout's windows count it."""
        key = parameters.get(rollout.sticky_key) if rollout.sticky_key else None
        route = rollout.route(None if key is None else str(key))
        if rollout.state is not RolloutState.RUNNING:
            return route, None
        routings = self._routings.get(rollout.model)
        if routings is None or routings[0].rollout is not rollout:  # made once per rollout: this runs per request
            routings = self._routings[rollout.model] = (Routing(rollout, None), Routing(rollout, rollout.candidate))
        return route, routings[route.shadow is not None]

    # -- life ------------------------------------------------------------------------------------------------------
    def restore(self) -> None:
        """Read the state file (open rollouts resume their step) and hold their versions: called before the
        repository's first loads, so that those load them."""
        self._load()
        for rollout in self._rollouts.values():
            self._versions.hold(rollout.model, rollout.held_versions(), rollout.open)

    def start(self) -> None:
        """Start judging gates, and load what the restored rollouts hold that the first loads did not."""
        self._task = asyncio.get_running_loop().create_task(self._judge_forever())
        for rollout in self._rollouts.values():
            self._settle(rollout)

    async def close(self) -> None:
        for task in [self._task, *self._settling]:
            if task is not None:
                task.cancel()
                try:
                    await task
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
            if rollout.state is RolloutState.RUNNING:
                for version, window in rollout.windows.items():
                    cost = self._cost(rollout.model, version)
                    if cost is not None:
                        window.observe_cost(*cost)
            before = (rollout.state, rollout.step)
            rollout.tick(now, self._input_drift(rollout.model, rollout.candidate) if rollout.open else None)
            if (rollout.state, rollout.step) != before:
                changed = True
                self._announce(rollout)
                if not rollout.open:
                    self._settle(rollout)
        if changed:
            self._save()

    # -- by hand -------------------------------------------------------------------------------------------------
    async def begin(self, model: str, candidate: str, steps: str, sticky_key: str = "") -> Rollout:
        """Start a rollout of `candidate` against the version that now takes requests naming no version (or, when
        that is the candidate itself, the newest other ready version). A candidate that is not loaded is loaded
        beside the primary first, whatever the version policy says; requests go on meanwhile."""
        current = self._rollouts.get(model)
        if (current is not None and current.open) or model in self._starting:
            what = f"of version {current.candidate} is {current.state.value}" if current is not None and current.open else "is starting"
            raise NereidError(Status.ALREADY_EXISTS, f"[model '{model}'] a rollout {what}: abort or promote it first")
        parsed = parse_steps(steps)
        if not candidate.isdigit():
            raise NereidError.invalid(f"[model '{model}'] rollout: the candidate version must be a number, not '{candidate}'")
        self._starting.add(model)
        try:
            ready = self._versions.ready_versions(model)
            if candidate not in ready and not self._versions.in_repository(model, candidate):
                raise NereidError.unavailable(
                    f"[model '{model}'] rollout: version {candidate} is not in the repository (ready: "
                    f"{', '.join(ready) or 'none'})"
                )
            primary = self._primary(model, candidate, ready, current)
            if candidate not in ready or primary not in ready:
                self._versions.hold(model, [primary, candidate], True)
                try:
                    await self._versions.apply_held(model)
                except NereidError as exc:
                    self._hold_as_before(model, current)
                    raise NereidError(exc.status, f"[model '{model}'] rollout: loading version {candidate} beside "
                                                  f"version {primary} failed: {exc.message}") from None  # fmt: skip
                ready = self._versions.ready_versions(model)
                if candidate not in ready:
                    self._hold_as_before(model, current)
                    raise NereidError.unavailable(
                        f"[model '{model}'] rollout: version {candidate} did not load (ready: {', '.join(ready) or 'none'})"
                    )
            objectives = Objectives.from_parameters(self._versions.parameters(model, candidate), model)
            rollout = Rollout.start(model, primary, candidate, parsed, self._clock(), objectives, sticky_key)
        finally:
            self._starting.discard(model)
        self._versions.hold(model, rollout.held_versions(), True)
        self._rollouts[model] = self.routing[model] = rollout
        self._compare_with(model, candidate, primary)
        self._announce(rollout)
        self._save()
        return rollout

    async def act(self, model: str, action: str) -> Rollout:
        """pause, resume, abort, promote or undo the model's rollout. Undo loads the previous version again
        first, when the promotion retired it, so that no request meets a version that is not there yet."""
        rollout = self.get(model)
        if action == "undo" and rollout.state is RolloutState.PROMOTED:
            self._versions.hold(model, [rollout.primary, rollout.candidate], False)
            await self._versions.apply_held(model)
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
        self._settle(rollout)
        self._save()
        return rollout

    def get(self, model: str) -> Rollout:
        rollout = self._rollouts.get(model)
        if rollout is None:
            raise NereidError.not_found(f"[model '{model}'] has no rollout")
        return rollout

    def status(self, model: str) -> dict[str, Any]:
        return self.get(model).status(self._clock())

    def report(self, model: str = "") -> dict[str, Any]:
        """What the rollout APIs answer: one model's status, or every rollout under "rollouts" when none is named."""
        if model:
            return self.status(model)
        return {"rollouts": [self.status(rollout.model) for rollout in self.all()]}

    def history_report(self, model: str) -> dict[str, Any]:
        return {"model": model, "history": [event.as_dict() for event in self.get(model).history]}

    def all(self) -> list[Rollout]:
        return list(self._rollouts.values())

    # -- inside ----------------------------------------------------------------------------------------------------
    def _settle(self, rollout: Rollout) -> None:
        """Hold what the rollout needs now and, in the background, load or retire versions to match: a promotion
        retires the old primary as the version policy says, a rollback the candidate."""
        self._versions.hold(rollout.model, rollout.held_versions(), rollout.open)
        task = asyncio.get_running_loop().create_task(self._apply(rollout.model))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _apply(self, model: str) -> None:
        try:
            await self._versions.apply_held(model)
        except NereidError as exc:
            log.error("rollout of model '%s': loading or retiring versions failed: %s", model, exc.message)

    def _hold_as_before(self, model: str, current: Rollout | None) -> None:
        if current is not None:
            self._versions.hold(model, current.held_versions(), current.open)
        else:
            self._versions.hold(model, [], False)

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
        # One temporary file per process: the Ray ingresses of one machine may share the state file.
        temporary = self._state_file.with_suffix(f"{self._state_file.suffix}.{os.getpid()}.tmp")
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(data, indent=1))
            os.replace(temporary, self._state_file)  # a crash mid-write leaves the previous state whole
        except OSError as exc:
            log.error("rollout state file '%s' could not be written: %s", self._state_file, exc)
