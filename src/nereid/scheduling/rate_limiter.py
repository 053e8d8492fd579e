"""Triton's rate limiter (--rate-limit=execution_count): an instance executes only after it holds the
resources its instance_group's rate_limiter names; waiting instances are served by priority weight."""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
from dataclasses import dataclass, field

from nereid.core.errors import NereidError

__all__ = ["InstanceLimits", "RateLimiter", "parse_resource_flags"]

log = logging.getLogger("nereid.rate_limiter")


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
        # Resource key -> how many registered instances need each count: without a flag sizing it, a resource is
        # as large as the largest need of the instances loaded now, so it shrinks again when they go.
        self._needs: dict[str, collections.Counter[int]] = {}
        self._waiting: list[tuple[int, int, InstanceLimits, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def check(self, limits: InstanceLimits) -> None:
        """Refuse an instance that needs more of a resource than a --rate-limit-resource flag gives it."""
        for key, count in limits.resources.items():
            explicit = self._explicit_capacity(key)
            if explicit and explicit < count:
                raise NereidError.invalid(
                    f"rate limiter resource '{key}' has {explicit} units (--rate-limit-resource) but an instance "
                    f"needs {count}"
                )

    def register(self, limits: InstanceLimits) -> None:
        """Count an instance's needs in the resource sizes (Triton's default: the largest single need)."""
        self.check(limits)
        for key, count in limits.resources.items():
            self._needs.setdefault(key, collections.Counter())[count] += 1
        self._resize(limits.resources)

    def unregister(self, limits: InstanceLimits) -> None:
        """An instance is gone: resources no flag sized shrink to the largest need of those left."""
        for key, count in limits.resources.items():
            needs = self._needs.get(key)
            if needs is None or not needs[count]:
                continue
            needs[count] -= 1
            if not needs[count]:
                del needs[count]
        self._resize(limits.resources)

    def _explicit_capacity(self, key: str) -> int:
        return self._explicit.get(key, self._explicit.get(key.split("@", 1)[0], 0))

    def _resize(self, keys: dict[str, int]) -> None:
        for key in keys:
            needs = self._needs.get(key)
            capacity = self._explicit_capacity(key) or (max(needs) if needs else 0)
            before = self._capacity.get(key, 0)
            if capacity == before:
                continue
            self._capacity[key] = capacity
            # Units held now come back through release(): available may dip below zero until they do.
            self._available[key] = self._available.get(key, 0) + capacity - before
            name, _, device = key.partition("@")
            log.debug("Resource: %s\t Count: %d\t Device: %s", name, capacity, device or "global")
        self._grant_waiting()

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
        self._grant_waiting()

    def _grant_waiting(self) -> None:
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
