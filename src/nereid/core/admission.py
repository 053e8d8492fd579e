"""The server-wide bound on inference requests in flight (--max-inflight-requests), shared by both protocols:
past it a request is refused at once (HTTP 503, gRPC UNAVAILABLE) instead of queueing without end. It only
counts; the frontends take and give back a place where a request starts and ends."""

from __future__ import annotations

from nereid.core.errors import NereidError

__all__ = ["InflightLimit"]


class InflightLimit:
    __slots__ = ("limit", "count", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.refused = 0  # requests refused so far, for operators and tests

    def try_acquire(self) -> bool:
        if self.count >= self.limit:
            self.refused += 1
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1

    def error(self) -> NereidError:
        return NereidError.unavailable(
            f"the server has {self.limit} inference requests in flight, its limit (--max-inflight-requests); "
            f"retry later"
        )
