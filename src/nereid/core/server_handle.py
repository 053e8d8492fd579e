"""The typed handle through which backends and schedulers call back into the server (BLS calls, ensemble steps,
the model-repository API of pb_utils). It names only core types, so the layers below the server never import it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from nereid.core.tracing import Tracer
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["RequestChecker", "RequestSink", "ServedModel", "ServerHandle"]


class RequestChecker(Protocol):
    """A model version's check of a request against its config (raises NereidError with Triton's words)."""

    def validate(self, request: InferenceRequest) -> None: ...


class RequestSink(Protocol):
    """What a step or a BLS call hands a request to: a model version's scheduler."""

    def submit(self, request: InferenceRequest) -> None: ...


class ServedModel(Protocol):
    """A ready model version as a caller inside the server sees it."""

    @property
    def name(self) -> str: ...

    @property
    def version_str(self) -> str: ...

    @property
    def decoupled(self) -> bool: ...

    @property
    def labels(self) -> dict[str, list[str]]: ...  # an output's classification labels, by output name

    @property
    def config(self) -> Any: ...  # a ModelConfig protobuf (core imports no config package)

    @property
    def validator(self) -> RequestChecker: ...

    @property
    def scheduler(self) -> Any: ...  # a RequestSink once ready; None before

    @property
    def inflight(self) -> int: ...


class ServerHandle(Protocol):
    """The part of the in-process Server that backends and schedulers use."""

    @property
    def tracer(self) -> Tracer: ...

    @property
    def loads_on_demand(self) -> bool: ...

    def model(self, name: str, version: str = "") -> ServedModel: ...

    async def wait_model(self, name: str, version: str = "") -> ServedModel:
        """The ready version, loading it first where loading on demand is on."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def submit(self, request: InferenceRequest, done: Callable[[InferenceResponse], None]) -> bool: ...

    async def infer(self, request: InferenceRequest, *, raise_error: bool = True) -> InferenceResponse: ...

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]: ...

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...
