"""HotLoop: the event loop polls instead of sleeping while a hold lasts, and sleeps again after it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

from nereid.core.hot_loop import HotLoop
from nereid.core.settings import ServerSettings
from nereid.server import Server


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


def test_the_server_polls_for_the_next_request_of_a_client_that_sends_them_back_to_back_not_of_one_that_pauses(
    tmp_path: Path,
) -> None:
    async def run() -> list[bool]:
        server = Server(ServerSettings(model_repositories=[tmp_path]))
        mv = SimpleNamespace(inflight=0, requests=0, last_used=0.0)
        seen = []
        server._request_started(mv)  # type: ignore[arg-type]
        server._request_ended(mv)  # type: ignore[arg-type]
        seen.append(server.hot_loop.holding)  # one request: nothing known of this client yet
        for _ in range(200):  # each request as soon as the one before is answered (concurrency 1)
            server._request_started(mv)  # type: ignore[arg-type]
            server._request_ended(mv)  # type: ignore[arg-type]
            if server.hot_loop.holding:  # after a dozen, unless the machine stalls this test in between
                break
        seen.append(server.hot_loop.holding)
        server._request_started(mv)  # type: ignore[arg-type]
        seen.append(server.hot_loop.holding)  # the request came: the hold ends
        server._request_ended(mv)  # type: ignore[arg-type]
        for _ in range(10):  # 5 ms between requests: not worth polling for
            await asyncio.sleep(0.005)
            server._request_started(mv)  # type: ignore[arg-type]
            server._request_ended(mv)  # type: ignore[arg-type]
        seen.append(server.hot_loop.holding)
        return seen

    assert asyncio.run(run()) == [False, True, False, False]
