"""PreciseTimer on the server's own event loop (uvloop, whose timers count whole milliseconds): it calls back at its
deadline, never before it, to well under a millisecond; it calls back once, not at all when cancelled; the timers
of a loop share one file descriptor, freed with the loop."""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import time

import pytest
import uvloop

from nereid.core import precise_timer
from nereid.core.precise_timer import PreciseTimer

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


async def _lateness_us(timer: PreciseTimer, delay_us: int) -> float:
    """How long after its deadline the timer called back; negative if before it."""
    loop = asyncio.get_running_loop()
    called: asyncio.Future[int] = loop.create_future()
    deadline = time.monotonic_ns() + delay_us * 1000
    timer.start(deadline, lambda: called.set_result(time.monotonic_ns()))
    return (await called - deadline) / 1000


@linux_only
def test_the_timer_calls_back_at_its_deadline_to_well_under_a_millisecond() -> None:
    async def scenario() -> dict[int, list[float]]:
        timer = PreciseTimer()
        return {delay: [await _lateness_us(timer, delay) for _ in range(15)] for delay in (100, 300, 600, 1500)}

    lateness = uvloop.run(scenario())
    # uvloop's call_later fires 100 and 300 µs on the next loop turn (early) and 600/1500 µs about 0.5 ms late.
    assert min(min(late) for late in lateness.values()) >= 0, lateness
    assert all(statistics.median(late) < 400 for late in lateness.values()), lateness


def test_a_cancelled_timer_never_calls_back_and_a_restarted_one_calls_back_once() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        timer = PreciseTimer()
        timer.start(time.monotonic_ns() + 200_000, lambda: calls.append("cancelled"))
        timer.cancel()
        timer.start(time.monotonic_ns() + 200_000, lambda: calls.append("replaced"))
        timer.start(time.monotonic_ns() + 300_000, lambda: calls.append("last"))
        await asyncio.sleep(0.02)
        return calls

    assert uvloop.run(scenario()) == ["last"]


def test_without_a_timerfd_the_loops_own_timer_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precise_timer, "_TIMERFD", None)

    async def scenario() -> tuple[float, object]:
        late = await _lateness_us(PreciseTimer(), 5000)
        return late, precise_timer._CLOCKS[asyncio.get_running_loop()]

    late, clock = uvloop.run(scenario())
    assert clock is None and late > -1000  # the loop's timer: within its millisecond


@linux_only
def test_the_timers_of_a_loop_share_one_file_descriptor_freed_with_the_loop() -> None:
    def open_timer_fds() -> set[str]:
        # Only this loop's timerfds are followed: threads left by other tests in this worker open and
        # close descriptors at any moment, which made a count of every descriptor flaky.
        fds = "/proc/self/fd"
        timer_fds = set()
        for name in os.listdir(fds):
            try:
                if os.readlink(f"{fds}/{name}") == "anon_inode:[timerfd]":
                    timer_fds.add(name)
            except FileNotFoundError:  # closed between the listing and the read
                pass
        return timer_fds

    async def scenario() -> tuple[set[str], set[str]]:
        loops_own = open_timer_fds()
        timers = [PreciseTimer() for _ in range(50)]
        laters = [asyncio.ensure_future(_lateness_us(timer, 200 + 10 * i)) for i, timer in enumerate(timers)]
        lateness = await asyncio.gather(*laters)
        assert min(lateness) >= 0, lateness  # each at its own deadline
        return loops_own, open_timer_fds()

    loops_own, with_timers = uvloop.run(scenario())
    gc.collect()
    opened = with_timers - loops_own
    assert len(opened) == 1 and not opened & open_timer_fds()  # one for all 50, closed with the loop


def test_a_callback_that_raises_leaves_the_later_timers_armed() -> None:
    async def scenario() -> list[str]:
        calls: list[str] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: calls.append("raised"))

        def fail() -> None:
            raise RuntimeError("a broken callback")

        now = time.monotonic_ns()
        PreciseTimer().start(now + 100_000, fail)
        PreciseTimer().start(now + 2_000_000, lambda: calls.append("later"))
        await asyncio.sleep(0.05)
        return calls

    assert uvloop.run(scenario()) == ["raised", "later"]
