"""HotLoop and the PollingPolicy over it: the event loop polls instead of sleeping while a hold lasts, and sleeps
again after it; the policy holds only for a lone request's short waits and a back-to-back client."""

from __future__ import annotations

import asyncio
import time

from nereid.core.hot_loop import HOT_WAIT_NS, HotLoop
from nereid.core.polling_policy import PollingPolicy


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


def test_the_policy_polls_for_the_next_request_of_a_client_that_sends_them_back_to_back_not_of_one_that_pauses() -> None:
    async def run() -> list[bool]:
        policy = PollingPolicy()
        seen = []
        policy.request_started()
        policy.request_ended()
        seen.append(policy.hot_loop.holding)  # one request: nothing known of this client yet
        for _ in range(200):  # each request as soon as the one before is answered (concurrency 1)
            policy.request_started()
            policy.request_ended()
            if policy.hot_loop.holding:  # after a dozen, unless the machine stalls this test in between
                break
        seen.append(policy.hot_loop.holding)
        policy.request_started()
        seen.append(policy.hot_loop.holding)  # the request came: the hold ends
        policy.request_ended()
        for _ in range(10):  # 5 ms between requests: not worth polling for
            await asyncio.sleep(0.005)
            policy.request_started()
            policy.request_ended()
        seen.append(policy.hot_loop.holding)
        return seen

    assert asyncio.run(run()) == [False, True, False, False]


def test_the_policy_holds_for_a_lone_requests_short_waits_only() -> None:
    async def run() -> list[object]:
        policy = PollingPolicy()
        seen: list[object] = []
        policy.request_started()  # alone
        seen.append(policy.hold_for_worker(HOT_WAIT_NS / 2) is policy.hot_loop)  # a quick worker: poll meanwhile
        policy.hot_loop.release()
        seen.append(policy.hold_for_worker(2 * HOT_WAIT_NS))  # a slow worker: sleep
        policy.hold_for_batch(HOT_WAIT_NS * 2, time.monotonic_ns() + HOT_WAIT_NS * 2)  # a long batch delay: sleep
        seen.append(policy.hot_loop.holding)
        policy.request_started()  # two in flight: nobody polls
        seen.append(policy.hold_for_worker(HOT_WAIT_NS / 2))
        policy.hold_for_batch(HOT_WAIT_NS // 2, time.monotonic_ns() + HOT_WAIT_NS // 2)
        seen.append(policy.hot_loop.holding)
        return seen

    assert asyncio.run(run()) == [True, None, False, None, False]
