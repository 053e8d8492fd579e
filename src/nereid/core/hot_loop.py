"""Keep the event loop polling, instead of sleeping, for the short waits of a lone request.

With one request in flight, each hop (client to server, server to a Python worker and back) wakes a sleeping
CPU. On virtual machines a halted vCPU takes tens of microseconds to wake, which at concurrency 1 is most of a
Python-backend request's latency. While a wait this short is expected, the loop polls its sockets instead
(`call_soon` makes each iteration's poll non-blocking), as busy-polling network stacks do. It is bounded twice:
only while a single request is in flight (waiting for its worker) or none is (waiting for the next request of a
client whose requests have recently followed each other within the budget), when the machine has CPU to spare,
and only for a budget per hold.
"""

from __future__ import annotations

import asyncio
import time

from nereid.core.spare_cpu import SpareCpu

__all__ = ["HOT_WAIT_NS", "HotLoop"]

# The longest wait worth polling through; callers hold only when their waits are usually shorter.
HOT_WAIT_NS = 300_000


class HotLoop:
    def __init__(self) -> None:
        self._deadline = 0
        self._spinning = False
        self.spare_cpu = SpareCpu()

    def hold(self, budget_ns: int) -> bool:
        """Poll for up to `budget_ns` from now (extending a hold in progress), unless released earlier; not
        while the machine has no core to spare, when this returns False (and a Python worker is not asked to
        poll either)."""
        now = time.monotonic_ns()
        if not self.spare_cpu.allows(now):
            return False
        deadline = now + budget_ns
        if deadline > self._deadline:
            self._deadline = deadline
        if not self._spinning:
            self._spinning = True
            asyncio.get_running_loop().call_soon(self._spin)
        return True

    @property
    def holding(self) -> bool:
        return time.monotonic_ns() < self._deadline

    def release(self) -> None:
        """What the hold waited for has come: the loop may sleep again."""
        self._deadline = 0

    def _spin(self) -> None:
        if time.monotonic_ns() < self._deadline:
            asyncio.get_running_loop().call_soon(self._spin)
        else:
            self._spinning = False
