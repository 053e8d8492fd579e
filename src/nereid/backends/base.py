"""The protocol every backend implements, and the lookup that imports a backend by name (the backends
themselves are declared in core.backend_registry).

A backend turns a model version folder into instances; an instance executes a batch of requests.
Backends never see wire formats and never import frontends.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nereid.core.backend_registry import BACKENDS
from nereid.core.capabilities import ClosingBackend
from nereid.core.errors import NereidError
from nereid.core.polling_policy import PollingPolicy
from nereid.core.server_handle import ServerHandle
from nereid.core.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from nereid.config.model_config import ModelConfig

__all__ = [
    "ExecutionTimes",
    "InstanceSpec",
    "ModelContext",
    "BackendInstance",
    "Backend",
    "get_backend",
    "BACKEND_MODULES",
    "close_backends",
]


@dataclass(slots=True)
class ExecutionTimes:
    """Nanoseconds spent by one batch execution, as Triton splits them in statistics."""

    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # Time the batch waited inside the instance behind the batch before it (a pipelined batch handed over early):
    # queue time, as Triton counts it, not compute input.
    waited_ns: int = 0


@dataclass(slots=True)
class InstanceSpec:
    """One instance to create: the instance_group it comes from, its index and device."""

    name: str
    group_name: str
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int
    index: int


@dataclass(slots=True)
class ModelContext:
    """Everything a backend needs to load one model version."""

    name: str
    version: int
    config: ModelConfig
    model_path: Path  # <repo>/<model>
    version_path: Path  # <repo>/<model>/<version>
    repository_path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    # The in-process Server, for BLS calls and ensembles, through its typed handle (backends never import it).
    server: ServerHandle | None = None
    # When the event loop polls through a short wait rather than sleep (None: never).
    polling: PollingPolicy | None = None

    def model_file(self, default: str) -> Path:
        return self.version_path / (self.config.default_model_filename or default)


class BackendInstance(Protocol):
    """A loaded copy of a model that executes one batch at a time."""

    name: str

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        """One response per request, in order; an error for one request must not fail the others."""
        ...

    async def close(self) -> None: ...


class Backend(Protocol):
    """A framework adapter. `auto_complete` fills a partial config from the model file."""

    name: str

    def auto_complete(self, context: ModelContext) -> None: ...

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> BackendInstance: ...


# Backend name -> (module path, pip extra that installs its framework), from the registry.
BACKEND_MODULES: dict[str, tuple[str, str | None]] = {name: (e.module, e.extra) for name, e in BACKENDS.items()}


async def close_backends() -> None:
    """End what backends keep between models (the Python backend's spare workers): the server stops. Only backends
    already imported are asked; a backend that is no ClosingBackend keeps nothing."""
    for module_name, _extra in BACKEND_MODULES.values():
        module = sys.modules.get(module_name)
        backend = getattr(module, "BACKEND", None)  # every backend module's entry point, as get_backend reads it
        if isinstance(backend, ClosingBackend):
            await backend.close()


def get_backend(name: str) -> Backend:
    entry = BACKEND_MODULES.get(name)
    if entry is None:
        # Triton's reason, word for word (its status name included, as Triton's reason carries it), then ours.
        raise NereidError.invalid(
            f"Invalid argument: unable to find backend library for backend '{name}', try specifying runtime on the "
            f"model configuration. Nereid serves {sorted(BACKEND_MODULES)}"
        )
    module_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with `pip install nereid[{extra}]`" if extra else ""
        raise NereidError.unavailable(f"backend '{name}' is not available: {exc}{hint}") from None
    backend: Backend = module.BACKEND
    return backend
