"""Choose a model version's scheduler from its config: ensemble, sequence batcher or (dynamic) batcher."""

from __future__ import annotations

from nereid.backends.base import BackendInstance, ModelContext
from nereid.core.statistics import ModelStatistics
from nereid.scheduling.base import Scheduler
from nereid.scheduling.dynamic_batcher import BatchingScheduler
from nereid.scheduling.rate_limiter import InstanceLimits, RateLimiter

__all__ = ["create_scheduler", "is_ensemble"]


def is_ensemble(context: ModelContext) -> bool:
    return context.config.platform == "ensemble"


def create_scheduler(
    context: ModelContext,
    instances: list[BackendInstance],
    stats: ModelStatistics,
    rate_limiter: RateLimiter | None,
    limits: list[InstanceLimits],
) -> Scheduler:
    config = context.config
    if is_ensemble(context):
        from nereid.scheduling.ensemble import EnsembleScheduler

        return EnsembleScheduler(context, stats)
    if config.HasField("sequence_batching"):
        from nereid.scheduling.sequence_batcher import SequenceBatcher

        return SequenceBatcher(config, instances, stats, rate_limiter, limits, model_path=context.model_path,
                               delay=context.extra.get("scheduler_delay"))  # fmt: skip
    return BatchingScheduler(config, instances, stats, rate_limiter, limits, context.polling)
