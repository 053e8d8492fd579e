"""HotLoop: the event loop polls instead of sleeping while a hold lasts, and sleeps again after it."""

from __future__ import annotations

import asyncio
import time

from nereid.core.hot_loop import HotLoop


def test_a_hold_keeps_the_loop_polling_until_released_then_it_sleeps() -> None:
    async def run() -> tuple[float, float, bool]:
        hot = HotLoop()
        hot.hold(10_000_000_000)  # 10 s: only release ends it
        start = time.process_time()
        await asyncio.sleep(0.2)  # the loop would sleep here; held, it polls
        held = time.process_time() - start
        hot.release()
        await asyncio.sleep(0.01)
        start = time.process_time()
        await asyncio.sleep(0.2)
        return held, time.process_time() - start, hot._spinning

    held, released, spinning = asyncio.run(run())
    assert held > 0.05, held  # on the CPU, not asleep (most of the 0.2 s on an idle machine)
    assert released < 0.05, released  # asleep again
    assert not spinning


def test_a_hold_ends_by_itself_at_its_budget() -> None:
    async def run() -> float:
        hot = HotLoop()
        hot.hold(20_000_000)  # 20 ms
        await asyncio.sleep(0.1)
        start = time.process_time()
        await asyncio.sleep(0.2)
        return time.process_time() - start

    assert asyncio.run(run()) < 0.05
