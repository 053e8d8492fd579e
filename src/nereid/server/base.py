"""ServerBase: the answers every server the frontends talk to gives alike, written once over a few primitives (the
decoupled refusal, trace settings with their unknown-model check, shared-memory registration). The in-process
Server and the Ray ingress's RemoteServer both derive from it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.trace_settings import TraceSettings

__all__ = ["ServerBase", "decoupled_refusal"]


def decoupled_refusal(endpoint: str) -> NereidError:
    """Triton's refusal of a decoupled model by an endpoint that can send only one response."""
    return NereidError.unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")


class ServerBase:
    """Mixed into a server that has `shared_memory`, `trace_settings`, `wait_model` and `model_ready`."""

    shared_memory: SharedMemoryRegistry
    trace_settings: TraceSettings

    async def wait_model(self, name: str, version: str = "") -> Any:
        raise NotImplementedError

    def model_ready(self, name: str, version: str = "") -> bool:
        raise NotImplementedError

    async def model_for_infer(self, name: str, version: str = "", endpoint: str = "ModelInfer RPC") -> Any:
        """The version a one-response inference runs on (wait_model's), refused in Triton's words naming `endpoint`
        when the model is decoupled; asked before the request is decoded, so that these are the errors reported
        whatever the body holds."""
        mv = await self.wait_model(name, version)
        if mv.decoupled:
            raise decoupled_refusal(endpoint)
        return mv

    def trace_setting(self, model: str = "", read_changes: Callable[[], dict[str, Any] | None] | None = None) -> dict[str, Any]:
        """A model's trace settings (the global ones without a model), after `read_changes()`'s changes when it gives
        some. The model is checked first, as Triton checks it before it reads the changes."""
        if model and not self.model_ready(model):
            raise NereidError.invalid(f"Request for unknown model : {model}")
        changes = read_changes() if read_changes is not None else None
        return self.trace_settings.update(changes, model) if changes is not None else self.trace_settings.get(model)

    def shared_memory_status(self, kind: str, region: str = "") -> list[dict[str, Any]]:
        """The registered regions of `kind` ("system" or "cuda"), or the one named; CUDA has none here."""
        if kind == "system":
            return self.shared_memory.status(region)
        if region:
            raise NereidError.not_found(f"Unable to find cuda shared memory region: '{region}'")
        return []

    def register_shared_memory(
        self, kind: str, region: str, read_span: Callable[[], tuple[str, int, int]] | None = None
    ) -> None:
        """Register a system region from `read_span()`'s (key, offset, byte_size), read only once registering is
        allowed (--allow-client-shm); a CUDA region is refused, this server having no CUDA device."""
        self.shared_memory.check_allowed()
        if kind != "system" or read_span is None:
            raise NereidError.unsupported("CUDA shared memory is not supported: this server has no CUDA device")
        self.shared_memory.register(region, *read_span())

    def unregister_shared_memory(self, kind: str, region: str = "") -> None:
        """Unregister the region named, or every region of `kind` (nothing to do for CUDA)."""
        self.shared_memory.check_allowed()
        if kind == "system":
            self.shared_memory.unregister(region)

    # -- rollouts (the in-process Server and the Ray ingress have them; a server without says so) -------------
    async def start_rollout(self, model: str, version: str, steps: str, sticky_key: str = "") -> dict[str, Any]:
        raise _no_rollouts()

    def rollout_status(self, model: str = "") -> dict[str, Any]:
        raise _no_rollouts()

    async def rollout_action(self, model: str, action: str) -> dict[str, Any]:
        raise _no_rollouts()

    def rollout_history(self, model: str) -> dict[str, Any]:
        raise _no_rollouts()


def _no_rollouts() -> NereidError:
    return NereidError.unsupported("rollouts are not available through this server")
