"""Triton's rate limiter (--rate-limit=execution_count): an instance executes only after it holds the
resources its instance_group's rate_limiter names; waiting instances are served by priority weight."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

from nereid.core.errors import NereidError

__all__ = ["InstanceLimits", "RateLimiter", "parse_resource_flags"]


@dataclass(slots=True)
class InstanceLimits:
    """What one instance must hold to execute: (resource key -> count), and its priority weight."""

    resources: dict[str, int] = field(default_factory=dict)
    priority: int = 1
    grants: int = 0  # how often it was served; weighted by priority for fairness


def parse_resource_flags(values: list[str]) -> dict[str, int]:
    """--rate-limit-resource=<name>:<count>[:<device>] -> {"name" or "name@device": count}."""
    pool: dict[str, int] = {}
    for value in values:
        parts = value.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise NereidError.invalid(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{value}'")
        key = parts[0] if len(parts) == 2 else f"{parts[0]}@{parts[2]}"
        pool[key] = int(parts[1])
    return pool


class RateLimiter:
    """Shared by every model of a server. Disabled, `acquire` returns at once."""

    def __init__(self, enabled: bool, explicit: dict[str, int]) -> None:
        self.enabled = enabled
        self._explicit = explicit
        self._available: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._waiting: list[tuple[int, int, InstanceLimits, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def register(self, limits: InstanceLimits) -> None:
        """Size each resource to the largest single need unless a flag sized it (Triton's default)."""
        for key, count in limits.resources.items():
            name = key.split("@", 1)[0]
            capacity = self._explicit.get(key, self._explicit.get(name, 0))
            if not capacity:
                capacity = max(self._capacity.get(key, 0), count)
            if capacity < count:
                raise NereidError.invalid(
                    f"rate limiter resource '{key}' has {capacity} units but an instance needs {count}"
                )
            added = capacity - self._capacity.get(key, 0)
            self._capacity[key] = capacity
            self._available[key] = self._available.get(key, 0) + added

    def _fits(self, limits: InstanceLimits) -> bool:
        return all(self._available.get(k, 0) >= n for k, n in limits.resources.items())

    async def acquire(self, limits: InstanceLimits) -> None:
        if not self.enabled or not limits.resources:
            return
        if not self._waiting and self._fits(limits):
            self._take(limits)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (limits.grants * limits.priority, next(self._order), limits, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(limits)
            raise

    def _take(self, limits: InstanceLimits) -> None:
        for key, count in limits.resources.items():
            self._available[key] -= count
        limits.grants += 1

    def release(self, limits: InstanceLimits) -> None:
        if not self.enabled or not limits.resources:
            return
        for key, count in limits.resources.items():
            self._available[key] += count
        while self._waiting:
            _, _, waiter_limits, future = self._waiting[0]
            if future.done():
                heapq.heappop(self._waiting)
                continue
            if not self._fits(waiter_limits):
                break
            heapq.heappop(self._waiting)
            self._take(waiter_limits)
            future.set_result(None)
