"""The optional capabilities a backend or one of its instances may have, declared as typed protocols that the
server, the schedulers and the metrics check with isinstance. Declarations only: nothing here runs a model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

__all__ = ["MetricSample", "MetricSource", "PipelinedInstance", "ReadinessCheck", "ClosingBackend"]

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
class MetricSource(Protocol):
    """An instance that reports metric families of its own (the LLM engine's vllm:* figures)."""

    def metric_samples(self) -> Iterable[MetricSample]: ...


@runtime_checkable
class ClosingBackend(Protocol):
    """A backend that keeps something between models (the Python backend's spare workers), to end when the
    server stops."""

    async def close(self) -> None: ...
