"""The optional capabilities a backend or one of its instances may have, declared as typed protocols that the
server, the schedulers and the metrics check with isinstance. Declarations only: nothing here runs a model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = [
    "MetricSample",
    "MetricSource",
    "MetricFamilySource",
    "PipelinedInstance",
    "GroupInstance",
    "ReadinessCheck",
    "ClosingBackend",
]

# (family, type, help, sample name, labels, value): one sample an instance reports for the metrics endpoint to
# render next to Triton's metrics.
MetricSample = tuple[str, str, str, str, dict[str, str], float]


@runtime_checkable
class ReadinessCheck(Protocol):
    """An instance with a readiness check of its own (a Python model's is_ready()): the model-ready endpoints
    answer false while it does."""

    async def ready(self) -> bool: ...


@runtime_checkable
class PipelinedInstance(Protocol):
    """An instance that may hold more than one batch at once (the Python backend queues the next batch in its
    worker while it runs one), so that it never idles while the server prepares the next."""

    pipelined_batches: int


@runtime_checkable
class GroupInstance(Protocol):
    """A pipelined instance of a model without batching that can be handed the requests queued behind a running one
    together and still execute each on its own (the Python backend's ExecuteGroup): one hand-over, and one answer,
    for the group instead of one per request."""

    name: str

    @property
    def group_limit(self) -> int:
        """How many requests it takes at once now (1: one at a time). The first of a group is answered with the
        last, so an instance whose executions are slow keeps its groups small."""
        ...

    async def execute_group(self, requests: list[InferenceRequest]) -> list[tuple[InferenceResponse, Any]]:
        """Each request's response and its execution's times (the backend's ExecutionTimes)."""
        ...


@runtime_checkable
class MetricSource(Protocol):
    """An instance that reports metric families of its own (the LLM engine's vllm:* figures)."""

    def metric_samples(self) -> Iterable[MetricSample]: ...


@runtime_checkable
class MetricFamilySource(Protocol):
    """A backend that reports metric families of its own, ready to render (the Python backend's custom families that
    models create with pb_utils.MetricFamily), gathered by the Server for the metrics endpoint."""

    def metric_families(self) -> Iterable[Any]: ...


@runtime_checkable
class ClosingBackend(Protocol):
    """A backend that keeps something between models (the Python backend's spare workers), to end when the
    server stops."""

    async def close(self) -> None: ...
