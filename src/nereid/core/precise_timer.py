"""A timer on the event loop that keeps microseconds, for the batchers' queue delays.

uvloop's timers (libuv's) count whole milliseconds. Measured here: `call_later` of 50-400 µs fires on the next loop
turn, of 600 µs and 1 ms after about 1.08 ms, of 1.5 ms after about 2.08 ms. Triton holds a batch open for exactly
`max_queue_delay_microseconds`, and configs commonly say 100 or 500. On Linux a timerfd that the loop watches fires
at its deadline (measured 20-30 µs late: the wake-up) and costs about a microsecond to arm. All the timers of a
loop share its one timerfd, so a repository of many batching models holds one file descriptor for them; where
there is no timerfd, the loop's own timer stands in.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable

__all__ = ["PreciseTimer"]

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1  # time.monotonic_ns reads this clock on Linux
_TFD_TIMER_ABSTIME = 1


class _TimerFd:
    """libc's timerfd_create and timerfd_settime through ctypes: one path for every Python (os has its own only from
    3.13)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._create = libc.timerfd_create
        self._settime = libc.timerfd_settime
        self._spec = (ctypes.c_int64 * 4)()  # struct itimerspec: interval (s, ns), value (s, ns)
        self._spec_ref = ctypes.byref(self._spec)

    def create(self) -> int:
        fd = self._create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return int(fd)

    def arm(self, fd: int, deadline_ns: int) -> None:
        """Fire once at `deadline_ns` on the monotonic clock (at once if that has passed)."""
        self._spec[2], self._spec[3] = divmod(deadline_ns, 1_000_000_000)
        if self._settime(fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")


def _timerfd_or_none() -> _TimerFd | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        api = _TimerFd()
        os.close(api.create())
    except (OSError, AttributeError):
        return None
    return api


_TIMERFD = _timerfd_or_none()


class _LoopClock:
    """A loop's one timerfd, armed for the earliest deadline of the loop's timers. A cancelled timer's entry stays
    in the heap until its deadline (at most one queue delay) and is skipped then."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._fd = fd
        self._heap: list[tuple[int, int, PreciseTimer, int]] = []  # deadline, order, timer, the timer's start
        self._armed_ns = 0
        self._order = itertools.count()
        loop.add_reader(fd, self._fired)
        weakref.finalize(loop, os.close, fd)

    def schedule(self, deadline_ns: int, timer: PreciseTimer, start: int) -> None:
        heapq.heappush(self._heap, (deadline_ns, next(self._order), timer, start))
        if not self._armed_ns or deadline_ns < self._armed_ns:
            self._arm(deadline_ns)

    def _arm(self, deadline_ns: int) -> None:
        deadline_ns = max(deadline_ns, 1)  # 0 would disarm it
        _TIMERFD.arm(self._fd, deadline_ns)  # type: ignore[union-attr]
        self._armed_ns = deadline_ns

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed since it became readable: arming clears the expiry
            return
        self._armed_ns = 0
        heap = self._heap
        now = time.monotonic_ns()
        try:
            while heap and heap[0][0] <= now:
                _, _, timer, start = heapq.heappop(heap)
                timer._due(start)
        finally:  # a callback that raised must not leave the later timers unarmed
            if heap:
                self._arm(heap[0][0])


# Each loop's clock; None for a loop that could not have one (no timerfd, or no file descriptor left).
_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClock | None] = weakref.WeakKeyDictionary()


def _clock_of(loop: asyncio.AbstractEventLoop) -> _LoopClock | None:
    try:
        return _CLOCKS[loop]
    except KeyError:
        pass
    clock = None
    if _TIMERFD is not None:
        try:
            clock = _LoopClock(loop, _TIMERFD.create())
        except OSError as exc:
            log.warning("no timerfd for the event loop (%s): queue delays are kept to the millisecond", exc)
    _CLOCKS[loop] = clock
    return clock


class PreciseTimer:
    """A re-armable one-shot timer of the running loop: `start(deadline_ns, callback)` calls `callback` once at that
    monotonic deadline unless `cancel()` or another start comes first."""

    __slots__ = ("_callback", "_starts", "_fallback")

    def __init__(self) -> None:
        self._callback: Callable[[], object] | None = None
        self._starts = 0  # which start a due entry belongs to: only the latest may call back
        self._fallback: asyncio.TimerHandle | None = None

    def start(self, deadline_ns: int, callback: Callable[[], object]) -> None:
        self.cancel()
        self._callback = callback
        loop = asyncio.get_running_loop()
        clock = _clock_of(loop)
        if clock is not None:
            clock.schedule(deadline_ns, self, self._starts)
        else:
            delay_s = max(deadline_ns - time.monotonic_ns(), 0) / 1e9
            self._fallback = loop.call_later(delay_s, self._due, self._starts)

    def cancel(self) -> None:
        if self._callback is None:
            return
        self._callback = None
        self._starts += 1
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None

    def _due(self, start: int) -> None:
        callback = self._callback
        if callback is None or start != self._starts:
            return
        self._callback = None
        self._fallback = None
        self._starts += 1
        callback()
