"""The lifecycle of every model: load, reload and unload, with the file overrides of the load API.

Reloads never fail requests in flight: new versions go live first, old ones drain before they close. A load that
changes instance_group only updates the serving versions' instances in place, as Triton does. Routing,
the index, backend guessing, ensemble dependencies, polling and residency live in modules of their own; the manager
owns them and hands each the narrow set of calls it may make back (`EnsembleCalls`, `PollingCalls`,
`ResidencyCalls`), so none of them imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Iterable
from typing import Any

from nereid.backends.base import ModelContext, ServerBackends
from nereid.config.model_config import (
    ModelConfig,
    config_from_json,
    mc,
    normalize,
    read_config_file,
    validate,
)
from nereid.core.await_all import await_all
from nereid.core.errors import NereidError
from nereid.core.polling_policy import PollingPolicy
from nereid.core.server_handle import ServerHandle
from nereid.core.settings import ServerSettings
from nereid.repository.agents import RepositoryAgents
from nereid.repository.backend_guess import guess_backend
from nereid.repository.ensemble_dependencies import EnsembleCalls, EnsembleDependencies
from nereid.repository.file_overrides import decode_file_overrides, write_file_overrides
from nereid.repository.footprints import HeapRelease
from nereid.repository.index import index_rows
from nereid.repository.layout import (
    ModelSource,
    fingerprints,
    scan_repositories,
    select_versions,
    version_folders,
)
from nereid.repository.model_version import ModelState, ModelVersion, instance_specs, same_but_instances
from nereid.repository.polling import PollingCalls, RepositoryPoller
from nereid.repository.records import ModelRecord
from nereid.repository.remote_repositories import RemoteRepositories
from nereid.repository.residency import Residency, ResidencyCalls
from nereid.repository.routing import VersionRoutes, check_version_string
from nereid.scheduling.ensemble_graph import check_ensemble_config, ensemble_dependencies
from nereid.scheduling.rate_limiter import RateLimiter, parse_resource_flags

__all__ = ["ModelRepositoryManager", "check_version_string", "decode_file_overrides"]

log = logging.getLogger("nereid.repository")


class ModelRepositoryManager:
    def __init__(self, settings: ServerSettings, polling: PollingPolicy | None = None) -> None:
        self.settings = settings
        self.agents = RepositoryAgents(settings.repoagent_directory)
        self.polling = polling  # the server's, handed to each version's scheduler and instances
        self.backends = ServerBackends()  # this server's own: what a backend keeps between models is not shared
        self.records: dict[str, ModelRecord] = {}
        self.routes = VersionRoutes(self.records)
        self.remote = RemoteRepositories(settings)  # local copies of s3://, gs:// and as:// repositories
        self._heap = HeapRelease()  # the collection and malloc_trim soon after unloads
        # The start-up loads still running: an ensemble waits for its composing models' own load.
        self._startup_loads: dict[str, asyncio.Future[None]] = {}
        self.ensembles = EnsembleDependencies(
            EnsembleCalls(
                records=self.records,
                repository_names=self._repository_names,
                load=self._load_for_ensemble,
                startup_load=self._startup_loads.get,
            ),
            explicit_control=settings.model_control_mode == "explicit",
        )
        self.poller = RepositoryPoller(
            settings,
            PollingCalls(
                records=self.records,
                refresh=self.remote.refresh,
                load=self._load_for_poll,
                unload=self.unload,
                forget=self.forget,
            ),
        )
        self.residency = Residency(
            settings,
            ResidencyCalls(
                records=self.records,
                routes=self.routes,
                in_repository=self.in_repository,
                load_on_demand=self._load_on_demand,
                evict=self.evict,
                ensembles_by_model=self.ensembles.dependents_by_model,
            ),
        )
        # Versions a rollout keeps loaded beside what the version policy loads (its primary and candidate), and those
        # it let go of that are still loaded: the next load or `apply_held` retires them unless the policy keeps them.
        self._held: dict[str, frozenset[int]] = {}
        self._released: dict[str, frozenset[int]] = {}
        self.server: ServerHandle | None = None  # the Server that owns this manager; set by it
        self.rate_limiter = RateLimiter(
            settings.rate_limit == "execution_count", parse_resource_flags(settings.rate_limit_resources)
        )

    # -- routing (hot path) ---------------------------------------------------------------------
    def resolve(self, name: str, version: str) -> ModelVersion:
        return self.routes.resolve(name, version)

    def resolve_versions(self, name: str) -> list[str]:
        return self.routes.versions(name)

    def find_any(self, name: str, version: str) -> ModelVersion | None:
        """The version for metadata/config/ready: ready or not."""
        if name not in self.records:
            return None
        try:
            return self.routes.resolve(name, version)
        except NereidError:
            return None

    def ready_versions(self) -> list[ModelVersion]:
        return self.routes.ready_versions()

    def all_ready(self) -> bool:
        """Strict readiness: no model that was asked to load has failed (lazy loads on demand do not count)."""
        return not any(
            not record.lazy and (record.reason or any(isinstance(v, str) for v in record.retired.values()))
            for record in self.records.values()
        )

    def in_repository(self, name: str) -> bool:
        return name in self._repository_names()

    def _repository_names(self) -> dict[str, ModelSource]:
        return scan_repositories(self.settings.model_repositories, self.settings.model_config_name)

    def forget(self, name: str) -> None:
        self.records.pop(name, None)
        self.routes.forget(name)

    # -- the repository index ---------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        try:
            names = list(scan_repositories(self.settings.model_repositories, self.settings.model_config_name))
        except NereidError:
            names = []
        footprints = self._footprint_bytes if self.residency.active else None
        return index_rows(self.records, names, ready_only, footprints)

    def _footprint_bytes(self, name: str) -> int | None:
        footprint = self.residency.footprint(name)
        return footprint.host_bytes if footprint is not None else None

    # -- load ----------------------------------------------------------------------------------
    async def load_initial(self) -> list[str]:
        """Load what the control mode says to load at start-up; return the failure messages."""
        settings = self.settings
        await self.remote.refresh()
        sources = scan_repositories(settings.model_repositories, settings.model_config_name)
        if settings.model_control_mode == "explicit":
            wanted = set(settings.load_models)
            names = sorted(sources) if "*" in wanted else sorted(wanted)
        elif settings.model_load_on_demand:
            names = []  # polling on demand: each model loads when a request first names it
        else:
            names = sorted(sources)
        self._startup_loads.update({n: asyncio.ensure_future(self.load(n, cause="startup")) for n in names})
        results = await asyncio.gather(*self._startup_loads.values(), return_exceptions=True)
        self._startup_loads.clear()
        failures = [str(r) for r in results if isinstance(r, BaseException)]
        if settings.model_control_mode == "poll":
            self.poller.start()
        if self.residency.active or settings.model_footprint_state_file:
            self.residency.start()
        return failures

    async def load(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
        explicit: bool = True,
        cause: str = "explicit",
        if_absent: bool = False,
    ) -> None:
        """Load (or reload) every version the config's policy names, and those a rollout holds. `cause` (startup,
        explicit, on_demand, poll, rollout) is what the load metrics count; with `if_absent` a model that is serving once the lock is ours is left as
        it is (the single flight of loads on demand)."""
        _check_model_name(name)
        if name not in self.records and not files:
            # A name the repository does not hold leaves no record behind (no index entry, no readiness change).
            if name not in scan_repositories(self.settings.model_repositories, self.settings.model_config_name):
                raise NereidError.internal(f"failed to load '{name}', failed to poll from model repository")
        record = self.records.setdefault(name, ModelRecord(name))
        if explicit:
            record.explicit = True
        async with record.lock:
            if if_absent and self.routes.has_ready(name):
                return
            reloading = bool(record.serving)
            previous_dir = record.override_dir
            record.lazy = cause == "on_demand" and not record.explicit
            record.loading = True
            try:
                await self._load_locked(record, config_json, files, cause)
            except BaseException:
                # A failed load keeps serving what served before, from the folder it came from.
                if record.override_dir is not None and record.override_dir != previous_dir:
                    shutil.rmtree(record.override_dir, ignore_errors=True)
                record.override_dir = previous_dir
                raise
            finally:
                record.loading = False
            if previous_dir is not None and previous_dir != record.override_dir:
                # The versions loaded from the earlier override folder have been unloaded by now.
                shutil.rmtree(previous_dir, ignore_errors=True)
        if reloading:
            self.ensembles.recheck_dependents(name)

    # -- versions a rollout holds ------------------------------------------------------------------
    def hold_versions(self, name: str, versions: Iterable[str], pin: bool) -> None:
        """Keep `versions` of `name` loaded beside what its version policy loads, from its next load on (or now,
        with `apply_held`); with `pin`, the model is never evicted or unloaded for idleness meanwhile. The first of
        them is the one requests naming no version get where nothing splits them (an ensemble's step, a BLS call
        on a replica behind the Ray ingress, metadata): the rollout's primary, or the version it settled on."""
        versions = list(versions)
        self.routes.prefer(name, versions[0] if versions else "")
        before = self._held.get(name, frozenset())
        held = frozenset(int(v) for v in versions)
        if held:
            self._held[name] = held
        else:
            self._held.pop(name, None)
        self._released[name] = (self._released.get(name, frozenset()) | before) - held
        self.residency.pin_for_rollout(name, pin)

    def version_folders(self, name: str) -> list[int]:
        """The versions the repository holds for `name` (loaded or not)."""
        source = self._repository_names().get(name)
        return version_folders(source.path) if source is not None else []

    async def apply_held(self, name: str) -> None:
        """Load the model again when a held version is not serving or a released one still is: the load takes the
        policy's versions and the held ones. A model whose versions already match is left as it is."""
        record = self.records.get(name)
        serving = set(record.serving) if record is not None else set()
        held = self._held.get(name, frozenset())
        retiring = self._released.get(name, frozenset()) & serving
        if held <= serving and not (retiring and retiring - self._policy_versions(record)):
            self._released.pop(name, None)
            return
        await self.load(name, explicit=False, cause="rollout")

    def _policy_versions(self, record: ModelRecord | None) -> set[int]:
        """The versions the serving config's version policy chooses among the folders now."""
        if record is None or not record.serving:
            return set()
        mv = next(iter(record.serving.values()))
        return set(select_versions(mv.config, version_folders(mv.context.model_path), record.name))

    def _with_held(self, name: str, source: ModelSource, versions: list[int]) -> list[int]:
        held = self._held.get(name)
        self._released.pop(name, None)  # this load retires them, unless the policy keeps them
        if not held:
            return versions
        return sorted(set(versions) | {v for v in held if (source.path / str(v)).is_dir()})

    async def _load_on_demand(self, name: str) -> None:
        await self.load(name, explicit=False, cause="on_demand", if_absent=True)

    async def _load_for_ensemble(self, name: str, cause: str) -> None:
        await self.load(name, explicit=False, cause=cause)

    async def _load_for_poll(self, name: str) -> None:
        await self.load(name, cause="poll")

    def _source_for(self, record: ModelRecord, config_json: str | None, files: dict[str, bytes] | None) -> ModelSource:
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

    def _drop_override_dir(self, record: ModelRecord) -> None:
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

    def _prepare_for_load(
        self, record: ModelRecord, source: ModelSource, config_json: str | None, cause: str
    ) -> tuple[ModelConfig, list[int], str, str]:
        """_prepare, and the folder's fingerprint as it was before (what the poller compares). A load on demand of
        a model whose folder is unchanged since its last prepare takes that config back from its binary form:
        re-parsing the same config.pbtxt under a churn of evictions crashed the server inside protobuf's upb
        text parser (docs/orchestration.md, "A reload on demand takes the config it had"). Explicit loads and
        polls prepare from the files every time, as Triton does. Last, the fingerprint of the files but the
        config (what tells an instance update from a reload)."""
        stamp, content = fingerprints(source.path, source.config_path)
        last = record.prepared
        if cause == "on_demand" and last is not None and last[0] == stamp:
            config = mc.ModelConfig()
            config.ParseFromString(last[1])
            return config, list(last[2]), stamp, content
        config, versions = self._prepare(source, config_json)
        if config_json is None:  # a config given with the load request is not the folder's
            record.prepared = (stamp, config.SerializeToString(), list(versions))
        return config, versions, stamp, content

    def _prepare(self, source: ModelSource, config_json: str | None) -> tuple[ModelConfig, list[int]]:
        """Read, auto-complete, normalise and validate the config; choose the versions to load."""
        config = self._read_config(source, config_json)
        self.agents.check(source.name, source.path, config)
        available = version_folders(source.path)
        if not config.backend and not config.platform:
            config.backend = guess_backend(source.path, available)
        normalize(config, source.name)
        check_ensemble_config(config, source.name)
        if config.platform == "ensemble":
            validate(config, source.name)
            return config, select_versions(config, available, source.name)
        try:
            backend = self.backends.get(config.backend)
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
                "load_on_demand": self.settings.model_load_on_demand,
                "scheduler_delay": self.settings.scheduler_delay,
            },
            server=self.server,
            polling=self.polling,
            backends=self.backends,
        )

    async def _load_locked(
        self, record: ModelRecord, config_json: str | None, files: dict[str, bytes] | None, cause: str
    ) -> None:
        name = record.name
        try:
            source = self._source_for(record, config_json, files)
            config, versions, stamp, content = await asyncio.to_thread(
                self._prepare_for_load, record, source, config_json, cause
            )
            versions = self._with_held(name, source, versions)
        except NereidError as exc:
            if not record.serving:
                record.reason = exc.message
                self.routes.rebuild(record)
            raise
        except Exception as exc:  # auto-complete runs framework code that may raise anything
            message = f"failed to load '{name}': {type(exc).__name__}: {exc}"
            if not record.serving:
                record.reason = message
                self.routes.rebuild(record)
            raise NereidError.invalid(message) from None
        if (stamp != record.fingerprint or config_json is not None) and self._instances_only(
            record, source, config, versions, content
        ):
            await self._update_instances(record, config)
            record.fingerprint = stamp
            return
        if config.platform == "ensemble":
            try:
                await self.ensembles.prepare(name, config, cause)
            except NereidError as exc:
                if not record.serving:
                    record.reason = exc.message
                    self.routes.rebuild(record)
                raise NereidError.invalid(f"load failed for model '{name}': {exc.message}") from None
        failures: dict[int, str] = {}
        backend = None
        if config.platform != "ensemble":
            try:
                backend = self.backends.get(config.backend)
            except NereidError as exc:
                failures = dict.fromkeys(versions, exc.message)
        new_versions: dict[int, ModelVersion] = {}
        for number in versions if not failures else ():
            context = self._context(source, _copy(config), number)
            new_versions[number] = ModelVersion(context, backend, self.rate_limiter)
        admission = None
        if backend is not None and new_versions:
            # Within the memory budget and the group's limit before anything is created (evicting idle models).
            instances = sum(len(instance_specs(mv.context)) for mv in new_versions.values())
            admission = await self.residency.admit(name, config, source.path, instances, cause)
        try:
            results = await await_all((mv.load() for mv in new_versions.values()), return_exceptions=True)
        except BaseException:
            self.residency.load_failed(admission)
            raise
        for (number, mv), result in zip(new_versions.items(), results, strict=False):
            if isinstance(result, BaseException):
                reason = result.message if isinstance(result, NereidError) else f"{type(result).__name__}: {result}"
                mv.state = ModelState.UNAVAILABLE
                mv.reason = reason
                failures[number] = reason
        if failures:
            self.residency.load_failed(admission)
            # Keep whatever served before: a failed reload must not take a working model down.
            for mv in new_versions.values():
                if mv.state is ModelState.READY:
                    await mv.unload()
            if not record.serving:
                record.retired = {n: reason for n, reason in failures.items()}
                record.reason = ""
                self.routes.rebuild(record)
            number, reason = next(iter(failures.items()))
            raise NereidError.invalid(
                f"load failed for model '{name}': version {number} is at UNAVAILABLE state: {reason}"
            )
        old = record.serving
        record.serving = new_versions
        record.retired = {}
        record.reason = ""
        record.fingerprint = stamp
        record.content = content
        self.residency.load_succeeded(admission, name, new_versions.values(), cause)
        self.routes.rebuild(record)
        if old:
            await asyncio.gather(*(mv.unload(self.settings.exit_timeout_secs) for mv in old.values()))

    def _instances_only(
        self, record: ModelRecord, source: ModelSource, config: ModelConfig, versions: list[int], content: str
    ) -> bool:
        """Whether this load only changes the serving versions' instances: the same versions from the same
        folder, its files but the config untouched since they loaded, and a config that differs in instance_group
        at most. The caller asks only when the config file changed or the load gives one: as in Triton, a load of
        a folder where nothing changed reloads the model. Under a memory budget a model is admitted whole, so
        there it reloads instead."""
        serving = record.serving
        if not serving or record.override_dir is not None or self.residency.active:
            return False
        if set(versions) != set(serving) or content != record.content:
            return False
        return all(
            mv.context.model_path == source.path and mv.state is ModelState.READY and same_but_instances(mv.config, config)
            for mv in serving.values()
        )

    async def _update_instances(self, record: ModelRecord, config: ModelConfig) -> None:
        try:
            await asyncio.gather(*(mv.update_instances(config) for mv in record.serving.values()))
        except NereidError as exc:
            raise NereidError.invalid(f"load failed for model '{record.name}': {exc.message}") from None
        except Exception as exc:  # a backend's instance creation may raise anything
            raise NereidError.invalid(f"load failed for model '{record.name}': {type(exc).__name__}: {exc}") from None

    # -- unload --------------------------------------------------------------------------------
    async def unload(self, name: str, timeout: float | None = None, unload_dependents: bool = False) -> None:
        """Unload a model, and first the ensembles that use it (they cannot run without it, and Triton
        unloads them too). With unload_dependents, unloading an ensemble also unloads the composing models
        that were loaded only for it and that no other ensemble uses."""
        record = self.records.get(name)
        if record is None:
            return
        for dependent in self.ensembles.dependents(name):
            await self.unload(dependent, timeout)
        async with record.lock:
            old = record.serving
            record.serving = {}
            record.explicit = False
            for number, mv in old.items():
                mv.state = ModelState.UNLOADING
                record.retired[number] = mv
            self.routes.rebuild(record)
            self.residency.before_unload(name, old.values())
            await asyncio.gather(*(mv.unload(timeout) for mv in old.values()))
            self.residency.unloaded(name, old.values())
            self._drop_override_dir(record)
        if old:
            self._heap.after_unload()
        if unload_dependents:
            composing = set().union(*(ensemble_dependencies(mv.config) for mv in old.values()))
            for dependency in sorted(composing):
                other = self.records.get(dependency)
                if other is not None and other.serving and not other.explicit and not self.ensembles.dependents(dependency):
                    await self.unload(dependency, timeout, unload_dependents=True)

    async def evict(self, name: str, reason: str, still_idle: Callable[[], bool]) -> bool:
        """Unload an idle model for the residency policy (`reason` shows in the index). `still_idle` is checked in
        the same step that takes the model's routes away, so no request can slip in between; False: it was busy.
        Its ensembles keep serving: their next request loads it again on demand."""
        record = self.records.get(name)
        if record is None or not record.serving or record.lock.locked() or not still_idle():
            return False
        async with record.lock:  # free (checked above), so taking it does not yield to another task
            old = record.serving
            record.serving = {}
            for number, mv in old.items():
                mv.state = ModelState.UNLOADING
                record.retired[number] = mv
            self.routes.rebuild(record)
            self.residency.before_unload(name, old.values())
            await await_all(mv.unload(self.settings.exit_timeout_secs, reason) for mv in old.values())
            self.residency.unloaded(name, old.values())
            self._drop_override_dir(record)
        self._heap.after_unload()
        return True

    async def unload_all(self, timeout: float | None) -> None:
        self.poller.stop()
        await self.residency.stop()
        await asyncio.gather(*(self.unload(name, timeout) for name in list(self.records)), return_exceptions=True)
        self.residency.book.save()  # the footprints measured as the models unloaded
        await self.backends.close()


def _copy(config: ModelConfig) -> ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    return copy


def _check_model_name(name: str) -> None:
    """A name to load is a folder of the repository: refused, in tritonserver's words, when it is blank or would
    leave the repository (a path separator, or `..` itself)."""
    if not name.strip():
        raise NereidError.invalid("Model name cannot be empty. Please enter a valid name to deploy.")
    if "/" in name or "\\" in name or name.strip() == "..":
        raise NereidError.invalid(f"failed to load '{name}': model name must not contain path traversal characters")
