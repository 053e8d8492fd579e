"""The protocol every backend implements, the lookup that imports a backend by name (the backends themselves are
declared in core.backend_registry), and the set of backends one Server's models run on.

A backend turns a model version folder into instances; an instance executes a batch of requests.
Backends never see wire formats and never import frontends.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nereid.core.backend_registry import BACKENDS
from nereid.core.capabilities import ClosingBackend, MetricFamilySource
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
    "ServerBackends",
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
    # The Server's backends, for a backend whose models run on another's (nereid.pytriton's functions bound to run in
    # a process run on the Python backend's workers).
    backends: ServerBackends | None = None

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


def get_backend(name: str) -> Backend:
    """The backend `name`, its module imported now. A module's `new_backend()` makes a backend of its own for each
    call (a backend that keeps something for one Server); a module without it has one `BACKEND` for every Server."""
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
    new_backend = getattr(module, "new_backend", None)
    backend: Backend = new_backend() if new_backend is not None else module.BACKEND
    return backend


class ServerBackends:
    """The backends one Server's models run on, each got from `get_backend` when the first model needs it. What a
    backend keeps between models (the Python backend's spare workers, fork server and custom metric families) is
    therefore this Server's alone, and ends with `close` when the Server stops."""

    __slots__ = ("_backends", "_lock")

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        # Configs are prepared in threads, several at once: the first model of a backend makes it for all the others.
        self._lock = threading.Lock()

    def get(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            with self._lock:
                backend = self._backends.get(name)
                if backend is None:
                    backend = self._backends[name] = get_backend(name)
        return backend

    def metric_families(self) -> Iterator[Any]:
        """The metric families the backends report of their own (the Python models' pb_utils.MetricFamily
        families), for the metrics endpoint."""
        for backend in list(self._backends.values()):
            if isinstance(backend, MetricFamilySource):
                yield from backend.metric_families()

    async def close(self) -> None:
        """The server stops: end what the backends keep between models (a backend that is no ClosingBackend keeps
        nothing)."""
        for backend in list(self._backends.values()):
            if isinstance(backend, ClosingBackend):
                await backend.close()
