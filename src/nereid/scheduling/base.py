"""What every scheduler offers the server: submit a request, drain in-flight work, stop."""

from __future__ import annotations

from typing import Protocol

from nereid.core.types import InferenceRequest

__all__ = ["Scheduler"]


class Scheduler(Protocol):
    def submit(self, request: InferenceRequest) -> None:
        """Queue a validated request; its responses go to `request.respond`."""
        ...

    async def drain(self) -> None:
        """Return once nothing is queued or executing."""
        ...

    async def close(self) -> None: ...
