"""The rate limiter: --rate-limit-resource parsing, resource pools sized as Triton sizes them, instances that wait
for units and are woken in priority-weighted order when units come back, and cancellation that returns units."""

from __future__ import annotations

import asyncio

import pytest

from nereid.core.errors import NereidError
from nereid.scheduling.rate_limiter import InstanceLimits, RateLimiter, parse_resource_flags


def test_resource_flags_are_name_count_and_optional_device() -> None:
    assert parse_resource_flags(["R1:4", "R2:2:0"]) == {"R1": 4, "R2@0": 2}
    for bad in ["R1", "R1:x", "R1:1:2:3"]:
        with pytest.raises(NereidError, match=f"expects <name>:<count>\\[:<device>\\], got '{bad}'"):
            parse_resource_flags([bad])


def test_pool_defaults_to_the_largest_single_need_and_an_explicit_size_below_a_need_is_refused() -> None:
    limiter = RateLimiter(True, {})
    limiter.register(InstanceLimits({"R": 2}))
    limiter.register(InstanceLimits({"R": 3}))
    assert limiter._capacity == {"R": 3} and limiter._available == {"R": 3}
    small = RateLimiter(True, {"R": 1})
    with pytest.raises(NereidError, match=r"rate limiter resource 'R' has 1 units \(--rate-limit-resource\) but an instance needs 2"):
        small.register(InstanceLimits({"R": 2}))


def test_an_instance_waits_for_units_and_runs_when_they_are_released() -> None:
    async def scenario() -> None:
        limiter = RateLimiter(True, {"R": 2})
        a, b = InstanceLimits({"R": 2}), InstanceLimits({"R": 1})
        limiter.register(a)
        limiter.register(b)
        await limiter.acquire(a)
        waiting = asyncio.ensure_future(limiter.acquire(b))
        await asyncio.sleep(0)  # let it queue
        assert not waiting.done()
        limiter.release(a)
        await asyncio.wait_for(waiting, 5)
        assert limiter._available == {"R": 1}
        limiter.release(b)
        assert limiter._available == {"R": 2}

    asyncio.run(scenario())


def test_waiters_are_woken_by_fewest_priority_weighted_grants() -> None:
    async def scenario() -> None:
        limiter = RateLimiter(True, {"R": 1})
        holder = InstanceLimits({"R": 1})
        busy = InstanceLimits({"R": 1}, priority=1, grants=5)
        idle = InstanceLimits({"R": 1}, priority=1, grants=0)
        for limits in (holder, busy, idle):
            limiter.register(limits)
        await limiter.acquire(holder)
        order: list[str] = []

        async def run(name: str, limits: InstanceLimits) -> None:
            await limiter.acquire(limits)
            order.append(name)
            limiter.release(limits)

        tasks = [asyncio.ensure_future(run("busy", busy)), asyncio.ensure_future(run("idle", idle))]
        await asyncio.sleep(0)
        limiter.release(holder)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == ["idle", "busy"]  # queued second, but served fewer times

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_back_nothing_it_never_got_and_does_not_block_others() -> None:
    async def scenario() -> None:
        limiter = RateLimiter(True, {"R": 1})
        holder, quitter, patient = InstanceLimits({"R": 1}), InstanceLimits({"R": 1}), InstanceLimits({"R": 1})
        for limits in (holder, quitter, patient):
            limiter.register(limits)
        await limiter.acquire(holder)
        gone = asyncio.ensure_future(limiter.acquire(quitter))
        stays = asyncio.ensure_future(limiter.acquire(patient))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        limiter.release(holder)
        await asyncio.wait_for(stays, 5)
        assert limiter._available == {"R": 0}  # the patient one holds the only unit

    asyncio.run(scenario())


def test_disabled_or_resource_free_instances_never_wait() -> None:
    async def scenario() -> None:
        off = RateLimiter(False, {})
        needy = InstanceLimits({"R": 100})
        await asyncio.wait_for(off.acquire(needy), 1)
        on = RateLimiter(True, {})
        await asyncio.wait_for(on.acquire(InstanceLimits()), 1)

    asyncio.run(scenario())


def test_a_resource_no_flag_sized_shrinks_when_the_instance_that_needed_most_is_gone() -> None:
    limiter = RateLimiter(True, {})
    big, small = InstanceLimits({"R": 4}), InstanceLimits({"R": 3})
    limiter.register(big)
    limiter.register(small)
    limiter.unregister(big)
    assert limiter._capacity == {"R": 3} and limiter._available == {"R": 3}
    limiter.unregister(small)
    assert limiter._capacity == {"R": 0}
    sized = RateLimiter(True, {"R": 10})
    sized.register(big)
    sized.unregister(big)
    assert sized._capacity == {"R": 10}  # a flag's size stays
    with pytest.raises(NereidError, match="has 10 units"):
        sized.check(InstanceLimits({"R": 32}))
