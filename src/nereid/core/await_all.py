"""`asyncio.gather` without its cost for the common case of a single awaitable.

gather wraps each awaitable in a task: starting it and resuming the caller each take a turn of the event loop. On
a loaded loop a turn lasts milliseconds, and an eviction (one version, one instance) awaited three such layers
while it held the admission lock that every other load queues on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

__all__ = ["await_all"]


async def await_all(awaitables: Iterable[Awaitable[Any]], return_exceptions: bool = False) -> list[Any]:
    """The results of `awaitables`, run concurrently as by asyncio.gather; a single one is awaited in place.
    With `return_exceptions`, an awaitable's exception is its result (a cancellation of the caller still
    propagates)."""
    pending = list(awaitables)
    if len(pending) != 1:
        return await asyncio.gather(*pending, return_exceptions=return_exceptions)
    try:
        return [await pending[0]]
    except Exception as exc:
        if not return_exceptions:
            raise
        return [exc]
