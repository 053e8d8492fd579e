"""A timer on the event loop that keeps microseconds, for the batchers' queue delays.

uvloop's timers (libuv's) count whole milliseconds. Measured here: `call_later` of 50-400 µs fires on the next loop
turn, of 600 µs and 1 ms after about 1.08 ms, of 1.5 ms after about 2.08 ms. Triton holds a batch open for exactly
`max_queue_delay_microseconds`, and configs commonly say 100 or 500. On Linux a timerfd that the loop watches fires
at its deadline (measured 20-30 µs late: the wake-up) and costs about a microsecond to arm; where there is no
timerfd, the loop's own timer stands in.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable

__all__ = ["PreciseTimer"]

_CLOCK_MONOTONIC = 1  # time.monotonic_ns reads this clock on Linux
_TFD_TIMER_ABSTIME = 1


class _TimerFd:
    """The three timerfd calls: os's own from Python 3.13, libc's through ctypes before."""

    def __init__(self) -> None:
        self._spec = (ctypes.c_int64 * 4)()  # struct itimerspec: interval (s, ns), value (s, ns)
        self._spec_ref = ctypes.byref(self._spec)
        self._libc_settime: Callable[..., int] | None = None
        if not hasattr(os, "timerfd_create"):
            libc = ctypes.CDLL(None, use_errno=True)
            self._libc_create = libc.timerfd_create
            self._libc_settime = libc.timerfd_settime

    def create(self) -> int:
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        if self._libc_settime is None:
            return os.timerfd_create(_CLOCK_MONOTONIC, flags=flags)  # type: ignore[attr-defined,unused-ignore]
        fd = self._libc_create(_CLOCK_MONOTONIC, flags)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return int(fd)

    def arm(self, fd: int, deadline_ns: int) -> None:
        """Fire once at `deadline_ns` on the monotonic clock; 0 disarms."""
        if self._libc_settime is None:
            flags = _TFD_TIMER_ABSTIME if deadline_ns else 0
            os.timerfd_settime_ns(fd, flags=flags, initial=deadline_ns)  # type: ignore[attr-defined,unused-ignore]
            return
        self._spec[2], self._spec[3] = divmod(deadline_ns, 1_000_000_000)
        if self._libc_settime(fd, _TFD_TIMER_ABSTIME if deadline_ns else 0, self._spec_ref, None) < 0:
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


class PreciseTimer:
    """One re-armable timer of the running loop: `start(deadline_ns, callback)` calls `callback` once at that
    monotonic deadline unless `cancel()` comes first. Its file descriptor is opened at the first start and freed by
    `close()`."""

    def __init__(self) -> None:
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[], object] | None = None
        self._fallback: asyncio.TimerHandle | None = None

    def start(self, deadline_ns: int, callback: Callable[[], object]) -> None:
        self.cancel()
        self._callback = callback
        if self._fd < 0 and _TIMERFD is not None:
            self._loop = asyncio.get_running_loop()
            self._fd = _TIMERFD.create()
            self._loop.add_reader(self._fd, self._fired)
        if self._fd >= 0:
            _TIMERFD.arm(self._fd, deadline_ns)  # type: ignore[union-attr]
        else:
            delay_s = max(deadline_ns - time.monotonic_ns(), 0) / 1e9
            self._fallback = asyncio.get_running_loop().call_later(delay_s, self._fired)

    def cancel(self) -> None:
        if self._callback is None:
            return
        self._callback = None
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        elif self._fd >= 0:
            _TIMERFD.arm(self._fd, 0)  # type: ignore[union-attr]

    def close(self) -> None:
        self.cancel()
        if self._fd >= 0:
            assert self._loop is not None
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _fired(self) -> None:
        if self._fd >= 0:
            try:
                os.read(self._fd, 8)
            except BlockingIOError:  # re-armed or disarmed since it became readable: arming clears the expiry
                return
        callback = self._callback
        if callback is None:
            return
        self._callback = None
        self._fallback = None
        callback()
