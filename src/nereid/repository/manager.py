"""The lifecycle of every model: load, reload, unload and poll, and routing requests to ready versions.

Reloads never fail requests in flight: new versions go live first, old ones drain before they close.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from nereid.backends.base import ModelContext, get_backend
from nereid.config.model_config import (
    ModelConfig,
    config_from_json,
    mc,
    normalize,
    read_config_file,
    validate,
)
from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.repository.file_overrides import decode_file_overrides, write_file_overrides
from nereid.repository.layout import ModelSource, fingerprint, scan_repositories, select_versions, version_folders
from nereid.repository.model_version import ModelState, ModelVersion
from nereid.scheduling.ensemble_graph import (
    EnsembleStep,
    check_composing_models,
    check_ensemble_config,
    ensemble_dependencies,
)
from nereid.scheduling.rate_limiter import RateLimiter, parse_resource_flags

__all__ = ["ModelRepositoryManager", "check_version_string", "decode_file_overrides"]

log = logging.getLogger("nereid.repository")

# Files whose presence in a version folder names the backend when a config names none.
_BACKEND_BY_FILE = {
    "model.onnx": "onnxruntime",
    "model.py": "python",
    "model.pt": "pytorch",
    "model.pt2": "pytorch",
    "model.xml": "openvino",
    # The fil backend's default file names (model.txt, LightGBM's, is too common a name to guess from).
    "xgboost.json": "fil",
    "xgboost.ubj": "fil",
    "xgboost.model": "fil",
    "checkpoint.tl": "fil",
}


@dataclass
class _ModelRecord:
    name: str
    serving: dict[int, ModelVersion] = field(default_factory=dict)
    # Versions that are not serving, kept for the repository index (failed or unloaded).
    retired: dict[int, ModelVersion | str] = field(default_factory=dict)
    reason: str = ""  # a failure before any version could be named (a bad config)
    fingerprint: str = ""
    override_dir: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Loaded because someone asked for it (not only because an ensemble needs it): unload_dependents keeps it.
    explicit: bool = False


class ModelRepositoryManager:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._records: dict[str, _ModelRecord] = {}
        # name -> (version string -> ready version, default version); rebuilt on every change.
        self._routes: dict[str, tuple[dict[str, ModelVersion], ModelVersion | None]] = {}
        self._poll_task: asyncio.Task[None] | None = None
        # Ensemble name -> the models its steps name, as last read from its config (finds circular ensembles).
        self._ensemble_deps: dict[str, set[str]] = {}
        # The start-up loads still running: an ensemble waits for its composing models' own load.
        self._startup_loads: dict[str, asyncio.Future[None]] = {}
        self.server: Any = None  # the Server that owns this manager; set by it
        self.rate_limiter = RateLimiter(
            settings.rate_limit == "execution_count", parse_resource_flags(settings.rate_limit_resources)
        )

    # -- routing (hot path) ---------------------------------------------------------------------
    def resolve(self, name: str, version: str) -> ModelVersion:
        route = self._routes.get(name)
        if route is None:
            check_version_string(version)
            raise NereidError.not_found(f"Request for unknown model: '{name}' is not found")
        by_version, latest = route
        if not version:
            if latest is None:
                raise NereidError.not_found(f"Request for unknown model: '{name}' has no available versions")
            return latest
        found = by_version.get(version)
        if found is None:
            check_version_string(version)
            record = self._records.get(name)
            if record is not None and (int(version) in record.serving or int(version) in record.retired):
                # A version Nereid knows (failed, loading or unloaded) is there but not serving, as Triton says.
                raise NereidError.unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready state"
                )
            raise NereidError.not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return found

    def resolve_versions(self, name: str) -> list[str]:
        route = self._routes.get(name)
        return list(route[0]) if route else []

    def find_any(self, name: str, version: str) -> ModelVersion | None:
        """The version for metadata/config/ready: ready or not."""
        record = self._records.get(name)
        if record is None:
            return None
        try:
            return self.resolve(name, version)
        except NereidError:
            return None

    def _rebuild_routes(self, record: _ModelRecord) -> None:
        serving = {str(v): mv for v, mv in record.serving.items() if mv.state is ModelState.READY}
        if serving or record.name in self._routes or record.retired or record.reason:
            latest = serving[str(max(int(v) for v in serving))] if serving else None
            self._routes[record.name] = (serving, latest)

    def ready_versions(self) -> list[ModelVersion]:
        return [mv for by_version, _ in self._routes.values() for mv in by_version.values()]

    def all_ready(self) -> bool:
        """Strict readiness: no model that was asked to load has failed."""
        return not any(
            record.reason or any(isinstance(v, str) for v in record.retired.values())
            for record in self._records.values()
        )

    # -- the repository index ---------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        names = set(self._records)
        try:
            names |= set(scan_repositories(self.settings.model_repositories, self.settings.model_config_name))
        except NereidError:
            pass
        entries: list[dict[str, Any]] = []
        for name in sorted(names):
            record = self._records.get(name)
            rows: list[dict[str, Any]] = []
            if record is not None:
                versions: dict[int, dict[str, Any]] = {}
                for number, retired in record.retired.items():
                    if isinstance(retired, str):
                        versions[number] = {"name": name, "version": str(number), "state": "UNAVAILABLE", "reason": retired}
                    else:
                        versions[number] = retired.index_entry()
                for number, mv in record.serving.items():
                    versions[number] = mv.index_entry()
                rows = [versions[v] for v in sorted(versions)]
                if not rows and record.reason:
                    rows = [{"name": name, "state": "UNAVAILABLE", "reason": record.reason}]
            if ready_only:
                rows = [r for r in rows if r.get("state") == "READY"]
                entries.extend(rows)
            else:
                entries.extend(rows or [{"name": name}])
        return entries

    # -- load ----------------------------------------------------------------------------------
    async def load_initial(self) -> list[str]:
        """Load what the control mode says to load at start-up; return the failure messages."""
        settings = self.settings
        sources = scan_repositories(settings.model_repositories, settings.model_config_name)
        if settings.model_control_mode == "explicit":
            wanted = set(settings.load_models)
            names = sorted(sources) if "*" in wanted else sorted(wanted)
        else:
            names = sorted(sources)
        self._startup_loads = {n: asyncio.ensure_future(self.load(n, from_startup=True)) for n in names}
        results = await asyncio.gather(*self._startup_loads.values(), return_exceptions=True)
        self._startup_loads = {}
        failures = [str(r) for r in results if isinstance(r, BaseException)]
        if settings.model_control_mode == "poll":
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_forever())
        return failures

    async def load(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
        from_startup: bool = False,
        explicit: bool = True,
    ) -> None:
        if name not in self._records and not files:
            # A name the repository does not hold leaves no record behind (no index entry, no readiness change).
            if name not in scan_repositories(self.settings.model_repositories, self.settings.model_config_name):
                raise NereidError.internal(f"failed to load '{name}', failed to poll from model repository")
        record = self._records.setdefault(name, _ModelRecord(name))
        if explicit:
            record.explicit = True
        async with record.lock:
            reloading = bool(record.serving)
            previous_dir = record.override_dir
            try:
                await self._load_locked(record, config_json, files, from_startup)
            except BaseException:
                # A failed load keeps serving what served before, from the folder it came from.
                if record.override_dir is not None and record.override_dir != previous_dir:
                    shutil.rmtree(record.override_dir, ignore_errors=True)
                record.override_dir = previous_dir
                raise
            if previous_dir is not None and previous_dir != record.override_dir:
                # The versions loaded from the earlier override folder have been unloaded by now.
                shutil.rmtree(previous_dir, ignore_errors=True)
        if reloading:
            self._recheck_dependents(name)

    def _source_for(self, record: _ModelRecord, config_json: str | None, files: dict[str, bytes] | None) -> ModelSource:
        name = record.name
        if files:
            if config_json is None:
                raise NereidError.invalid(
                    f"failed to load '{name}': a 'config' parameter must be given with 'file:' overrides"
                )
            directory, model_dir = write_file_overrides(name, files)
            record.override_dir = directory
            return ModelSource(name, model_dir, directory, None)
        sources = scan_repositories(self.settings.model_repositories, self.settings.model_config_name)
        source = sources.get(name)
        if source is None:
            raise NereidError.internal(f"failed to load '{name}', failed to poll from model repository")
        record.override_dir = None
        return source

    def _drop_override_dir(self, record: _ModelRecord) -> None:
        if record.override_dir is not None:
            shutil.rmtree(record.override_dir, ignore_errors=True)
            record.override_dir = None

    def _read_config(self, source: ModelSource, config_json: str | None) -> ModelConfig:
        if config_json is not None:
            return config_from_json(config_json, source.name)
        if source.config_path is not None:
            return read_config_file(source.config_path)
        if not self.settings.auto_complete_config:
            raise NereidError.invalid(
                f"failed to load '{source.name}': no model configuration file 'config.pbtxt' and auto-complete "
                f"is disabled (--disable-auto-complete-config)"
            )
        return mc.ModelConfig()

    def _prepare(self, source: ModelSource, config_json: str | None) -> tuple[ModelConfig, list[int]]:
        """Read, auto-complete, normalise and validate the config; choose the versions to load."""
        config = self._read_config(source, config_json)
        available = version_folders(source.path)
        if not config.backend and not config.platform:
            for version in reversed(available):
                for filename, backend_name in _BACKEND_BY_FILE.items():
                    if (source.path / str(version) / filename).exists():
                        config.backend = backend_name
                        break
                if config.backend:
                    break
        normalize(config, source.name)
        check_ensemble_config(config, source.name)
        if config.platform == "ensemble":
            validate(config, source.name)
            return config, select_versions(config, available, source.name)
        try:
            backend = get_backend(config.backend)
        except NereidError:
            # Loading fails each version with this reason (as Triton reports a missing backend library).
            return config, select_versions(config, available, source.name)
        if self.settings.auto_complete_config and available:
            backend.auto_complete(self._context(source, config, max(available)))
            normalize(config, source.name)
        validate(config, source.name)
        return config, select_versions(config, available, source.name)

    def _context(self, source: ModelSource, config: ModelConfig, version: int) -> ModelContext:
        return ModelContext(
            name=source.name,
            version=version,
            config=config,
            model_path=source.path,
            version_path=source.path / str(version),
            repository_path=source.repository,
            extra={
                "summary_latencies": self.settings.metrics_config.get("summary_latencies", "").lower() == "true",
                "histogram_latencies": self.settings.metrics_config.get("histogram_latencies", "").lower() == "true",
                "backend_config": self.settings.backend_config,
            },
            server=self.server,
        )

    async def _load_locked(
        self, record: _ModelRecord, config_json: str | None, files: dict[str, bytes] | None, from_startup: bool
    ) -> None:
        name = record.name
        try:
            source = self._source_for(record, config_json, files)
            config, versions = await asyncio.to_thread(self._prepare, source, config_json)
        except NereidError as exc:
            if not record.serving:
                record.reason = exc.message
                self._rebuild_routes(record)
            raise
        except Exception as exc:  # auto-complete runs framework code that may raise anything
            message = f"failed to load '{name}': {type(exc).__name__}: {exc}"
            if not record.serving:
                record.reason = message
                self._rebuild_routes(record)
            raise NereidError.invalid(message) from None
        if config.platform == "ensemble":
            await self._prepare_ensemble(record, config)
        failures: dict[int, str] = {}
        backend = None
        if config.platform != "ensemble":
            try:
                backend = get_backend(config.backend)
            except NereidError as exc:
                failures = dict.fromkeys(versions, exc.message)
        new_versions: dict[int, ModelVersion] = {}
        for number in versions if not failures else ():
            context = self._context(source, _copy(config), number)
            new_versions[number] = ModelVersion(context, backend, self.rate_limiter)
        results = await asyncio.gather(*(mv.load() for mv in new_versions.values()), return_exceptions=True)
        for (number, mv), result in zip(new_versions.items(), results, strict=False):
            if isinstance(result, BaseException):
                reason = result.message if isinstance(result, NereidError) else f"{type(result).__name__}: {result}"
                mv.state = ModelState.UNAVAILABLE
                mv.reason = reason
                failures[number] = reason
        if failures:
            # Keep whatever served before: a failed reload must not take a working model down.
            for mv in new_versions.values():
                if mv.state is ModelState.READY:
                    await mv.unload()
            if not record.serving:
                record.retired = {n: reason for n, reason in failures.items()}
                record.reason = ""
                self._rebuild_routes(record)
            number, reason = next(iter(failures.items()))
            raise NereidError.invalid(
                f"load failed for model '{name}': version {number} is at UNAVAILABLE state: {reason}"
            )
        old = record.serving
        record.serving = new_versions
        record.retired = {}
        record.reason = ""
        record.fingerprint = fingerprint(source.path)
        self._rebuild_routes(record)
        if old:
            await asyncio.gather(*(mv.unload(self.settings.exit_timeout_secs) for mv in old.values()))

    # -- unload --------------------------------------------------------------------------------
    async def unload(self, name: str, timeout: float | None = None, unload_dependents: bool = False) -> None:
        """Unload a model, and first the ensembles that use it (they cannot run without it, and Triton
        unloads them too). With unload_dependents, unloading an ensemble also unloads the composing models
        that were loaded only for it and that no other ensemble uses."""
        record = self._records.get(name)
        if record is None:
            return
        for dependent in self._dependents(name):
            await self.unload(dependent, timeout)
        async with record.lock:
            old = record.serving
            record.serving = {}
            record.explicit = False
            for number, mv in old.items():
                mv.state = ModelState.UNLOADING
                record.retired[number] = mv
            self._rebuild_routes(record)
            await asyncio.gather(*(mv.unload(timeout) for mv in old.values()))
            self._drop_override_dir(record)
        if unload_dependents:
            composing = set().union(*(ensemble_dependencies(mv.config) for mv in old.values()))
            for dependency in sorted(composing):
                other = self._records.get(dependency)
                if other is not None and other.serving and not other.explicit and not self._dependents(dependency):
                    await self.unload(dependency, timeout, unload_dependents=True)

    async def unload_all(self, timeout: float | None) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
        await asyncio.gather(*(self.unload(name, timeout) for name in list(self._records)), return_exceptions=True)

    # -- ensembles -----------------------------------------------------------------------------
    async def _prepare_ensemble(self, record: _ModelRecord, config: ModelConfig) -> None:
        """Load the models the ensemble's steps name (Triton loads them with the ensemble), then check the
        steps against their configs; the ensemble is decoupled when a step it runs is."""
        name = record.name
        try:
            dependencies = ensemble_dependencies(config)
            self._ensemble_deps[name] = dependencies
            cycle = self._cycle_from(name)
            if cycle:
                raise NereidError.invalid("circular dependency between ensembles: " + " -> ".join(cycle))
            sources = scan_repositories(self.settings.model_repositories, self.settings.model_config_name)
            missing = sorted(d for d in dependencies if d not in sources and not self._ready_versions(d))
            if missing:
                raise NereidError.invalid(
                    f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}"
                )
            for dependency in sorted(dependencies):
                await self._ensure_loaded(name, dependency)
            decoupled = check_composing_models(config, partial(self._step_config, name))
            config.model_transaction_policy.decoupled = decoupled
        except NereidError as exc:
            if not record.serving:
                record.reason = exc.message
                self._rebuild_routes(record)
            raise NereidError.invalid(f"load failed for model '{name}': {exc.message}") from None

    def _cycle_from(self, name: str) -> list[str] | None:
        """A chain of ensembles leading from `name` back to itself, if the configs read so far make one."""
        path = [name]

        def visit(current: str) -> list[str] | None:
            for dependency in sorted(self._ensemble_deps.get(current, ())):
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

    def _ready_versions(self, name: str) -> dict[int, ModelVersion]:
        record = self._records.get(name)
        if record is None:
            return {}
        return {n: mv for n, mv in record.serving.items() if mv.state is ModelState.READY}

    async def _ensure_loaded(self, ensemble: str, name: str) -> None:
        startup = self._startup_loads.get(name)
        if startup is not None and not startup.done():
            await asyncio.wait([startup])
        record = self._records.get(name)
        if record is not None and record.lock.locked():
            async with record.lock:
                pass
        if self._ready_versions(name):
            return
        failed = record is not None and (bool(record.reason) or bool(record.retired))
        error = ""
        if self.settings.model_control_mode == "explicit" or not failed:
            try:
                await self.load(name, explicit=False)
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
        ready = self._ready_versions(step.model_name)
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

    def _dependents(self, name: str) -> list[str]:
        """The serving ensembles with a step that uses `name`."""
        return sorted(
            record.name
            for record in self._records.values()
            if record.name != name
            and any(
                mv.config.platform == "ensemble" and name in ensemble_dependencies(mv.config)
                for mv in record.serving.values()
            )
        )

    def _recheck_dependents(self, name: str) -> None:
        """After a composing model reloads, its ensembles keep serving (steps resolve the model per request);
        say so when the new config no longer fits one of them."""
        for dependent in self._dependents(name):
            for mv in self._records[dependent].serving.values():
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

    # -- polling -------------------------------------------------------------------------------
    async def poll_once(self) -> None:
        """Load new models, reload changed ones and unload removed ones."""
        sources = scan_repositories(self.settings.model_repositories, self.settings.model_config_name)
        for name in [n for n in self._records if n not in sources]:
            log.info("poll: '%s' was removed from the repository", name)
            await self.unload(name)
            # Gone from the repository, gone from the index and from routing, as Triton forgets it.
            self._records.pop(name, None)
            self._routes.pop(name, None)
        for name, source in sources.items():
            record = self._records.get(name)
            current = fingerprint(source.path)
            if record is not None and record.fingerprint == current:
                continue
            try:
                await self.load(name)
            except NereidError as exc:
                log.error("poll: failed to load '%s': %s", name, exc.message)
            record = self._records[name]
            record.fingerprint = current

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")


def check_version_string(version: str) -> None:
    """A requested version is empty (the latest) or a decimal number; anything else is an invalid argument."""
    if version and not version.isdigit():
        raise NereidError.invalid(
            f"failed to get model version from specified version string '{version}': version should be an "
            f"integral value > 0"
        )


def _copy(config: ModelConfig) -> ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    return copy
