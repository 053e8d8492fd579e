"""The models an ensemble depends on: loading them with it, finding circular ensembles, checking its steps against
the composing models' configs, and naming the ensembles that use a model. It never routes requests or changes a
model's record; loads go through the `EnsembleCalls` its owner hands down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial

from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError
from nereid.repository.model_version import ModelState, ModelVersion
from nereid.repository.records import ModelRecord
from nereid.scheduling.ensemble_graph import EnsembleStep, check_composing_models, ensemble_dependencies

__all__ = ["EnsembleCalls", "EnsembleDependencies"]

log = logging.getLogger("nereid.repository")


@dataclass(frozen=True, slots=True)
class EnsembleCalls:
    """What the ensemble dependencies read of the models and ask of their lifecycle; the owner hands these down.
    `records` is read, never changed."""

    records: Mapping[str, ModelRecord]
    repository_names: Callable[[], Collection[str]]  # the model names the repositories hold now
    # Load a composing model for an ensemble (name, the load's cause); raises NereidError.
    load: Callable[[str, str], Awaitable[None]]
    # The start-up load of a model that is still running, if any: an ensemble waits for it instead of loading again.
    startup_load: Callable[[str], asyncio.Future[None] | None]


class EnsembleDependencies:
    def __init__(self, calls: EnsembleCalls, explicit_control: bool) -> None:
        self._calls = calls
        # --model-control-mode=explicit: a composing model whose load failed is loaded again for each ensemble.
        self._explicit_control = explicit_control
        # Ensemble name -> the models its steps name, as last read from its config (finds circular ensembles).
        self._deps: dict[str, set[str]] = {}

    async def prepare(self, name: str, config: ModelConfig, cause: str) -> None:
        """Load the models the ensemble's steps name (Triton loads them with the ensemble), then check the
        steps against their configs; the ensemble is decoupled when a step it runs is. Raises NereidError with
        the reason the ensemble cannot load."""
        dependencies = ensemble_dependencies(config)
        self._deps[name] = dependencies
        cycle = self._cycle_from(name)
        if cycle:
            raise NereidError.invalid("circular dependency between ensembles: " + " -> ".join(cycle))
        sources = self._calls.repository_names()
        missing = sorted(d for d in dependencies if d not in sources and not self.ready_versions(d))
        if missing:
            raise NereidError.invalid(
                f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}"
            )
        for dependency in sorted(dependencies):
            await self._ensure_loaded(name, dependency, cause)
        decoupled = check_composing_models(config, partial(self._step_config, name))
        config.model_transaction_policy.decoupled = decoupled

    def _cycle_from(self, name: str) -> list[str] | None:
        """A chain of ensembles leading from `name` back to itself, if the configs read so far make one."""
        path = [name]

        def visit(current: str) -> list[str] | None:
            for dependency in sorted(self._deps.get(current, ())):
                if dependency == name:
                    return path + [name]
                if dependency in path:
                    continue
                path.append(dependency)
                found = visit(dependency)
                if found:
                    return found
                path.pop()
            return None

        return visit(name)

    def ready_versions(self, name: str) -> dict[int, ModelVersion]:
        record = self._calls.records.get(name)
        if record is None:
            return {}
        return {n: mv for n, mv in record.serving.items() if mv.state is ModelState.READY}

    async def _ensure_loaded(self, ensemble: str, name: str, cause: str) -> None:
        calls = self._calls
        startup = calls.startup_load(name)
        if startup is not None and not startup.done():
            await asyncio.wait([startup])
        record = calls.records.get(name)
        if record is not None and record.lock.locked():
            async with record.lock:
                pass
        if self.ready_versions(name):
            return
        failed = record is not None and (bool(record.reason) or bool(record.retired))
        error = ""
        if self._explicit_control or not failed:
            try:
                await calls.load(name, cause)
                return
            except NereidError as exc:
                error = exc.message
        elif record is not None:
            error = record.reason or next((r for r in record.retired.values() if isinstance(r, str)), "")
        message = f"ensemble '{ensemble}' depends on '{name}' which has no loaded version."
        if error:
            message += f" Model '{name}' loading failed with error: {error}"
        raise NereidError.invalid(message)

    def _step_config(self, ensemble: str, step: EnsembleStep) -> ModelConfig:
        ready = self.ready_versions(step.model_name)
        if not ready:
            raise NereidError.invalid(f"ensemble '{ensemble}' depends on '{step.model_name}' which has no loaded version.")
        if step.model_version < 0:
            return ready[max(ready)].config
        mv = ready.get(step.model_version)
        if mv is None:
            raise NereidError.invalid(
                f"ensemble '{ensemble}' depends on '{step.model_name}' whose required version {step.model_version} "
                f"is not loaded."
            )
        return mv.config

    def dependents(self, name: str) -> list[str]:
        """The serving ensembles with a step that uses `name`."""
        return self.dependents_by_model().get(name, [])

    def dependents_by_model(self) -> dict[str, list[str]]:
        """Each model that a serving ensemble's step uses, with those ensembles: one pass over the records, for a
        caller that asks of many models."""
        found: dict[str, set[str]] = {}
        for record in self._calls.records.values():
            for mv in record.serving.values():
                if mv.config.platform == "ensemble":
                    for step in ensemble_dependencies(mv.config):
                        if step != record.name:
                            found.setdefault(step, set()).add(record.name)
        return {step: sorted(ensembles) for step, ensembles in found.items()}

    def recheck_dependents(self, name: str) -> None:
        """After a composing model reloads, its ensembles keep serving (steps resolve the model per request);
        say so when the new config no longer fits one of them."""
        for dependent in self.dependents(name):
            for mv in self._calls.records[dependent].serving.values():
                try:
                    decoupled = check_composing_models(mv.config, partial(self._step_config, dependent))
                except NereidError as exc:
                    log.error("ensemble '%s' no longer fits reloaded model '%s': %s", dependent, name, exc.message)
                    continue
                if decoupled != mv.decoupled:
                    log.error(
                        "ensemble '%s': reloaded model '%s' changed whether the ensemble is decoupled; reload the "
                        "ensemble",
                        dependent,
                        name,
                    )
