"""What every scheduler offers the server: submit a request, drain in-flight work, stop, and add or remove an
instance while serving (Triton's instance update)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from nereid.backends.base import BackendInstance
from nereid.core.types import InferenceRequest
from nereid.scheduling.rate_limiter import InstanceLimits

__all__ = ["Scheduler"]


class Scheduler(Protocol):
    def submit(self, request: InferenceRequest) -> None:
        """Queue a validated request; its responses go to `request.respond`."""
        ...

    async def drain(self) -> None:
        """Return once nothing is queued or executing."""
        ...

    async def close(self) -> None: ...

    def add_instance(self, instance: BackendInstance, limits: InstanceLimits) -> None:
        """Start giving work to `instance`."""
        ...

    def remove_instance(self, instance: BackendInstance) -> asyncio.Future[None]:
        """Give `instance` no new work; resolved once the work it holds has ended (the caller closes it)."""
        ...
