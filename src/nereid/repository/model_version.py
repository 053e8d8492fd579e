"""One loaded version of a model: its config, instances, scheduler, validator and statistics."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Any

from nereid.backends.base import Backend, BackendInstance, InstanceSpec, ModelContext
from nereid.config.model_config import mc
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


def instance_specs(context: ModelContext) -> list[InstanceSpec]:
    """Expand instance_group into one spec per instance, per GPU for GPU groups, as Triton does."""
    specs: list[InstanceSpec] = []
    for group in context.config.instance_group:
        kind = _KIND_NAMES.get(group.kind, "CPU")
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        for device in devices:
            for index in range(group.count):
                name = f"{group.name}_{len(specs)}" if kind != "GPU" else f"{group.name}_{device}_{index}"
                specs.append(InstanceSpec(name, group.name, kind, device, index))
    return specs


def instance_limits(context: ModelContext, spec: InstanceSpec) -> InstanceLimits:
    """The rate_limiter resources of the spec's instance_group; non-global ones are per device."""
    for group in context.config.instance_group:
        if group.name == spec.group_name and group.HasField("rate_limiter"):
            device = f"gpu{spec.device_id}" if spec.kind == "GPU" else "cpu"
            resources = {
                (r.name if getattr(r, "global") else f"{r.name}@{device}"): r.count for r in group.rate_limiter.resources
            }
            return InstanceLimits(resources, max(group.rate_limiter.priority, 1))
    return InstanceLimits()


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
        specs = [] if self.backend is None else instance_specs(self.context)
        backend = self.backend
        results = await await_all(
            (backend.create_instance(self.context, spec) for spec in specs if backend is not None),
            return_exceptions=True,
        )
        created = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(i.close() for i in created), return_exceptions=True)
            raise errors[0]
        self.instances = created  # type: ignore[assignment]
        if len(self.config.model_warmup):
            try:
                await warm_up(self.name, self.version_str, self.config, self.context.model_path, self.instances)
            except BaseException:
                await asyncio.gather(*(i.close() for i in created), return_exceptions=True)
                self.instances = []
                raise
        limits = [instance_limits(self.context, spec) for spec in specs]
        if self.rate_limiter is not None:
            for item in limits:
                self.rate_limiter.register(item)
        try:
            self.scheduler = create_scheduler(self.context, self.instances, self.stats, self.rate_limiter, limits)
        except BaseException:
            # A scheduler that refuses the config (a bad sequence_batching control, say) fails the load cleanly.
            await asyncio.gather(*(i.close() for i in created), return_exceptions=True)
            self.instances = []
            raise
        self.load_seconds = time.monotonic() - start
        self.state = ModelState.READY
        log.info("successfully loaded '%s' version %d", self.name, self.version)

    async def unload(self, timeout: float | None = None, reason: str = "unloaded") -> None:
        self.state = ModelState.UNLOADING
        if self.scheduler is not None:
            try:
                # A timeout scope rather than wait_for: no task of its own, so no extra loop turns per unload.
                async with asyncio.timeout(timeout):
                    await self.scheduler.close()
            except TimeoutError:
                log.warning("'%s' version %d: in-flight requests did not finish in time", self.name, self.version)
        await await_all((instance.close() for instance in self.instances), return_exceptions=True)
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
