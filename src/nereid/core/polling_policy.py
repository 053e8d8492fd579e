"""When the event loop polls instead of sleeping (HotLoop): one policy object per Server, told when requests start
and end, and asked by the dynamic batcher and the Python instances before a short wait. It knows nothing of
models; it keeps the in-flight count and the recent idle gaps that the decision needs."""

from __future__ import annotations

import time

from nereid.core.hot_loop import HOT_WAIT_NS, HotLoop

__all__ = ["PollingPolicy"]

# The longest idle gap the average of gaps between requests takes in: a long pause is soon forgotten.
_LONG_GAP_NS = 10 * HOT_WAIT_NS


class PollingPolicy:
    __slots__ = ("hot_loop", "_inflight", "_idle_gap_ns", "_idle_since_ns")

    def __init__(self, hot_loop: HotLoop | None = None) -> None:
        self.hot_loop = hot_loop if hot_loop is not None else HotLoop()
        self._inflight = 0
        # How long the server has recently stayed without a request between two (an average): short, the loop
        # polls for the next request once the last is answered.
        self._idle_gap_ns = float(_LONG_GAP_NS)
        self._idle_since_ns = time.monotonic_ns()

    def request_started(self) -> None:
        if not self._inflight:
            self.hot_loop.release()  # the request a hold waited for has come
            gap = min(time.monotonic_ns() - self._idle_since_ns, _LONG_GAP_NS)
            self._idle_gap_ns = 0.8 * self._idle_gap_ns + 0.2 * gap
        self._inflight += 1

    def request_ended(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle_since_ns = time.monotonic_ns()
            if self._idle_gap_ns < HOT_WAIT_NS:
                # A client that sends its next request as soon as it has the answer (concurrency 1): poll for
                # it instead of sleeping, so that its arrival need not wake the loop.
                self.hot_loop.hold(HOT_WAIT_NS)

    def hold_for_batch(self, delay_ns: int, deadline_ns: int) -> None:
        """A dynamic batcher is about to wait `delay_ns` (until `deadline_ns`) for its batch to fill: a lone
        request's short wait is polled through rather than slept."""
        if self._inflight == 1 and delay_ns <= HOT_WAIT_NS:
            self.hot_loop.hold(deadline_ns - time.monotonic_ns())

    def hold_for_worker(self, round_trip_ns: float) -> HotLoop | None:
        """A Python instance hands a batch to its worker, whose round trips take `round_trip_ns`: for a lone request
        with a quick worker, the loop polls meanwhile; the HotLoop that holds, or None (the worker then need not
        poll for the next request either)."""
        if self._inflight == 1 and round_trip_ns < HOT_WAIT_NS and self.hot_loop.hold(HOT_WAIT_NS):
            return self.hot_loop
        return None
