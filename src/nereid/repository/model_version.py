"""One loaded version of a model: its config, instances, scheduler, validator and statistics, and Triton's instance
update (instances added and removed in place when only instance_group changed)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nereid.backends.base import Backend, BackendInstance, InstanceSpec, ModelContext
from nereid.config.model_config import ModelConfig, mc
from nereid.config.model_metrics import FIRST_RESPONSE_HISTOGRAM, histogram_buckets
from nereid.core.await_all import await_all
from nereid.core.classification import read_labels
from nereid.core.errors import NereidError
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest
from nereid.repository.request_validation import RequestValidator
from nereid.repository.warmup import warm_up
from nereid.scheduling.base import Scheduler
from nereid.scheduling.factory import create_scheduler
from nereid.scheduling.rate_limiter import InstanceLimits, RateLimiter

__all__ = ["ModelState", "ModelVersion"]

log = logging.getLogger("nereid.repository")


class _ClosedScheduler:
    """What an unloaded version keeps in place of its scheduler: the real one, closed, may still reference its
    last batch's tensors, and a retired version stays in the index until the model loads again."""

    def submit(self, request: InferenceRequest) -> None:
        raise NereidError.unavailable(f"model '{request.model_name}' is unloading")

    def add_instance(self, instance: BackendInstance, limits: InstanceLimits) -> None:
        raise NereidError.unavailable("the model is unloading")

    def remove_instance(self, instance: BackendInstance) -> asyncio.Future[None]:
        raise NereidError.unavailable("the model is unloading")

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        return None


_CLOSED = _ClosedScheduler()


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


_KIND_NAMES = {mc.ModelInstanceGroup.KIND_CPU: "CPU", mc.ModelInstanceGroup.KIND_GPU: "GPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}


def _expand(config: ModelConfig) -> Iterator[tuple[InstanceSpec, Any]]:
    """Each instance instance_group asks for, per GPU for GPU groups as Triton does, with its group. Instances are named
    as Triton names them, '<group>_<index in the group>' ('m_0_0', 'm_0_1' for a config's unnamed first group)."""
    for group in config.instance_group:
        kind = _KIND_NAMES.get(group.kind, "CPU")
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        for device in devices:
            for index in range(group.count):
                name = f"{group.name}_{index}" if kind != "GPU" else f"{group.name}_{device}_{index}"
                yield InstanceSpec(name, group.name, kind, device, index), group


def instance_specs(context: ModelContext) -> list[InstanceSpec]:
    return [spec for spec, _ in _expand(context.config)]


def _limits(group: Any, spec: InstanceSpec) -> InstanceLimits:
    """The rate_limiter resources of the spec's instance_group; non-global ones are per device."""
    if not group.HasField("rate_limiter"):
        return InstanceLimits()
    device = f"gpu{spec.device_id}" if spec.kind == "GPU" else "cpu"
    resources = {(r.name if getattr(r, "global") else f"{r.name}@{device}"): r.count for r in group.rate_limiter.resources}
    return InstanceLimits(resources, max(group.rate_limiter.priority, 1))


def _signature(group: Any, spec: InstanceSpec) -> bytes:
    """What makes two instances interchangeable in an update: their group's settings but its name and count, and
    their device (Triton matches instances so; renaming or regrouping them changes nothing)."""
    settings = mc.ModelInstanceGroup()
    settings.CopyFrom(group)
    settings.ClearField("name")
    settings.ClearField("count")
    settings.ClearField("gpus")
    return settings.SerializeToString(deterministic=True) + f"@{spec.kind}{spec.device_id}".encode()


def same_but_instances(old: ModelConfig, new: ModelConfig) -> bool:
    """Whether two configs differ in instance_group at most: then a load updates the instances in place."""
    a, b = mc.ModelConfig(), mc.ModelConfig()
    a.CopyFrom(old)
    b.CopyFrom(new)
    a.ClearField("instance_group")
    b.ClearField("instance_group")
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


@dataclass(slots=True, eq=False)
class _Placed:
    """A created instance, what matches it in an update, and what it holds of the rate limiter."""

    instance: BackendInstance
    signature: bytes
    limits: InstanceLimits


class ModelVersion:
    """Created LOADING; `load` makes it READY or raises; `unload` drains then closes it."""

    def __init__(
        self, context: ModelContext, backend: Backend | None, rate_limiter: RateLimiter | None = None
    ) -> None:
        self.context = context
        self.name = context.name
        self.version = context.version
        self.version_str = str(context.version)
        self.config = context.config
        self.backend = backend
        self.state = ModelState.LOADING
        self.reason = ""
        self.stats = ModelStatistics(self.name, self.version_str)
        if context.extra.get("summary_latencies"):
            self.stats.enable_summaries()
        if context.extra.get("histogram_latencies") and self.config.model_transaction_policy.decoupled:
            self.stats.enable_first_response_histogram(histogram_buckets(self.config, FIRST_RESPONSE_HISTOGRAM))
        self.validator = RequestValidator(self.config)
        self.instances: list[BackendInstance] = []
        self._placed: list[_Placed] = []
        # Instances an update removed, each until its last work has ended and it is closed.
        self._leaving: dict[asyncio.Task[None], _Placed] = {}
        # Requests of this version the server has started and not yet answered (eviction never takes a busy one).
        self.inflight = 0
        # When the server last started a request of it, and how many it started: eviction's recency and frequency.
        self.last_used = 0.0
        self.requests = 0
        self.scheduler: Scheduler | None = None
        self.load_seconds = 0.0
        self.decoupled = self.config.model_transaction_policy.decoupled
        # As in Triton, the response cache serves the dynamic batcher only: a sequence's answers depend on its state.
        self.cache_enabled = self.config.response_cache.enable and not self.config.HasField("sequence_batching")
        self.rate_limiter = rate_limiter
        self.labels = {
            o.name: read_labels(context.model_path / o.label_filename) for o in self.config.output if o.label_filename
        }

    async def load(self) -> None:
        start = time.monotonic()
        # Ensembles have no backend and no instances: their scheduler calls the composing models.
        wanted = [] if self.backend is None else list(_expand(self.config))
        for spec, group in wanted:
            if self.rate_limiter is not None:
                self.rate_limiter.check(_limits(group, spec))
        placed = await self._create(wanted)
        self.instances = [p.instance for p in placed]
        self._register(placed)
        try:
            self.scheduler = create_scheduler(
                self.context, self.instances, self.stats, self.rate_limiter, [p.limits for p in placed]
            )
        except BaseException:
            # A scheduler that refuses the config (a bad sequence_batching control, say) fails the load cleanly.
            await self._close(placed)
            self.instances = []
            raise
        self._placed = placed
        self.load_seconds = time.monotonic() - start
        self.state = ModelState.READY
        log.info("successfully loaded '%s' version %d", self.name, self.version)

    async def _create(self, wanted: list[tuple[InstanceSpec, Any]]) -> list[_Placed]:
        """Create and warm up the instances `wanted` names, all or none."""
        backend = self.backend
        if backend is None or not wanted:
            return []
        results = await await_all(
            (backend.create_instance(self.context, spec) for spec, _ in wanted), return_exceptions=True
        )
        created = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(i.close() for i in created), return_exceptions=True)
            raise errors[0]
        if len(self.config.model_warmup):
            try:
                await warm_up(self.name, self.version_str, self.config, self.context.model_path, created)  # type: ignore[arg-type]
            except BaseException:
                await asyncio.gather(*(i.close() for i in created), return_exceptions=True)
                raise
        return [
            _Placed(instance, _signature(group, spec), _limits(group, spec))  # type: ignore[arg-type]
            for instance, (spec, group) in zip(created, wanted, strict=True)
        ]

    def _register(self, placed: list[_Placed]) -> None:
        if self.rate_limiter is not None:
            for item in placed:
                self.rate_limiter.register(item.limits)

    async def _close(self, placed: list[_Placed]) -> None:
        await await_all((p.instance.close() for p in placed), return_exceptions=True)
        if self.rate_limiter is not None:
            for item in placed:
                self.rate_limiter.unregister(item.limits)

    async def update_instances(self, config: ModelConfig) -> None:
        """Triton's instance update, for a config that differs from this version's in instance_group only:
        instances the new groups ask for that no current one matches are created (warmed up) and start taking
        requests; those no group asks for any more stop taking them, finish what they hold and close; the others
        serve on untouched. Requests in flight never fail. A sequence model's removed instances close once their
        sequences end, after this returns; others before."""
        wanted = list(_expand(config))
        current: dict[bytes, list[_Placed]] = {}
        for item in self._placed:
            current.setdefault(item.signature, []).append(item)
        added: list[tuple[InstanceSpec, Any]] = []
        for spec, group in wanted:
            matches = current.get(_signature(group, spec))
            if matches:
                matches.pop(0)
            else:
                added.append((spec, group))
        removed = [item for matches in current.values() for item in matches]
        for spec, group in added:
            if self.rate_limiter is not None:
                self.rate_limiter.check(_limits(group, spec))
        # The new instances are created with the new groups in the config they are given (a Python model's
        # initialize() sees them in args["model_config"]); the config endpoint shows them from now on.
        before = mc.ModelConfig()
        before.instance_group.extend(self.config.instance_group)
        self.config.ClearField("instance_group")
        self.config.instance_group.extend(config.instance_group)
        try:
            placed = await self._create(added)
        except BaseException:
            self.config.ClearField("instance_group")
            self.config.instance_group.extend(before.instance_group)
            raise
        scheduler = self.scheduler
        assert scheduler is not None
        self._register(placed)
        for item in placed:
            scheduler.add_instance(item.instance, item.limits)
        self._placed += placed
        self.instances += [item.instance for item in placed]
        retiring = []
        for item in removed:
            self._placed.remove(item)
            self.instances.remove(item.instance)
            task = asyncio.ensure_future(self._retire(item, scheduler.remove_instance(item.instance)))
            self._leaving[task] = item
            task.add_done_callback(self._left)
            retiring.append(task)
        log.info(
            "updated the instances of '%s' version %d: %d added, %d removed, %d kept",
            self.name, self.version, len(placed), len(removed), len(self._placed) - len(placed),
        )  # fmt: skip
        if not self.config.HasField("sequence_batching"):
            await asyncio.gather(*retiring)

    async def _retire(self, item: _Placed, gone: asyncio.Future[None]) -> None:
        await gone
        await self._close([item])
        log.info("'%s' version %d: removed instance %s", self.name, self.version, item.instance.name)

    def _left(self, task: asyncio.Task[None]) -> None:
        self._leaving.pop(task, None)

    async def unload(self, timeout: float | None = None, reason: str = "unloaded") -> None:
        self.state = ModelState.UNLOADING
        timed_out = False
        if self.scheduler is not None:
            try:
                # A timeout scope rather than wait_for: no task of its own, so no extra loop turns per unload.
                async with asyncio.timeout(timeout):
                    await self.scheduler.close()
            except TimeoutError:
                timed_out = True
                log.warning("'%s' version %d: in-flight requests did not finish in time", self.name, self.version)
        if self._leaving:
            # A closed scheduler has ended the work of the instances an update removed: they close now. After a
            # timeout, those still busy are closed here instead.
            leaving = dict(self._leaving)
            _, stuck = await asyncio.wait(leaving, timeout=0 if timed_out else None)
            for task in stuck:
                task.cancel()
            await self._close([leaving[task] for task in stuck])
        await self._close(self._placed)
        self._placed = []
        self.instances = []
        self.scheduler = _CLOSED  # the closed scheduler may still reference its last batch's tensors
        self.state = ModelState.UNAVAILABLE
        self.reason = reason
        log.info("successfully unloaded '%s' version %d", self.name, self.version)

    def index_entry(self) -> dict[str, Any]:
        entry = {"name": self.name, "version": self.version_str, "state": self.state.value}
        if self.reason:
            entry["reason"] = self.reason
        return entry
