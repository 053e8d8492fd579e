"""Shadow copies' answers, compared with the primary's off the request path: each pair waits for both answers,
then goes through a bounded queue to a thread of its own; a full queue drops the comparison (counted), so the
request path never waits on it."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from nereid.core.types import InferenceResponse
from nereid.rollouts.compare import compare_responses, divergence
from nereid.rollouts.rollout import Rollout

__all__ = ["ShadowComparisons", "ShadowPair"]

log = logging.getLogger("nereid.rollouts")

_QUEUE_CAPACITY = 256


class ShadowComparisons:
    def __init__(self, capacity: int = _QUEUE_CAPACITY) -> None:
        self._queue: queue.Queue[tuple[Rollout, InferenceResponse, InferenceResponse] | None] = queue.Queue(capacity)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self.compared = 0

    def submit(self, rollout: Rollout, primary: InferenceResponse, shadow: InferenceResponse) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name="nereid-shadow-compare", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((rollout, primary, shadow))
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            rollout, primary, shadow = item
            try:
                value = divergence(compare_responses(primary, shadow))
            except Exception:  # a comparison must never take the thread down
                log.exception("comparing the shadow answer of model '%s' failed", rollout.model)
                continue
            self.compared += 1
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(rollout.record_comparison, value)
            except RuntimeError:  # the loop closed with the server
                return


class ShadowPair:
    """A request and its shadow copy: compared once both have answered, if both succeeded (a failed shadow counts in
    the candidate's window as an error, and never reaches the client)."""

    __slots__ = ("rollout", "comparisons", "primary", "shadow")

    def __init__(self, rollout: Rollout, comparisons: ShadowComparisons) -> None:
        self.rollout = rollout
        self.comparisons = comparisons
        self.primary: InferenceResponse | None = None
        self.shadow: InferenceResponse | None = None

    def primary_answered(self, response: InferenceResponse) -> None:
        self.primary = response
        self._maybe_compare()

    def shadow_answered(self, response: InferenceResponse) -> None:
        self.shadow = response
        self._maybe_compare()

    def _maybe_compare(self) -> None:
        primary, shadow = self.primary, self.shadow
        if primary is None or shadow is None:
            return
        if primary.error is None and shadow.error is None:
            self.comparisons.submit(self.rollout, primary, shadow)
