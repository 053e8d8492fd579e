"""Which version a request that names no version goes to during a rollout, and whether it is copied to the
candidate as a shadow: by weight, or by a sticky key so that one user always meets one version. Pure and cheap:
the Server asks it on the request path."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Route", "VersionSplit", "bucket_of"]

_BUCKETS = 10_000  # a share is resolved to 0.01%
# Successive requests without a key walk the buckets by the golden ratio: any run of them meets the candidate in
# close to its share (a low-discrepancy sequence), with no random numbers drawn.
_STRIDE = 6_180


def bucket_of(key: str) -> int:
    """A key's bucket, the same in every process and across restarts (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % _BUCKETS


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes: `version` answers it; `shadow` also gets a copy whose answer is only compared."""

    version: str
    shadow: str | None = None


class VersionSplit:
    """A rollout step's traffic: `canary_percent` of requests to the candidate for real, `shadow_percent` copied
    to it. A request with a sticky key falls in a fixed bucket; one without takes the next in the sequence."""

    __slots__ = (
        "primary", "candidate", "canary_percent", "shadow_percent", "_canary_buckets", "_shadow_buckets", "_next",
        "_to_candidate", "_copied", "_to_primary",
    )  # fmt: skip

    def __init__(self, primary: str, candidate: str, canary_percent: float = 0.0, shadow_percent: float = 0.0) -> None:
        self.primary = primary
        self.candidate = candidate
        self.canary_percent = canary_percent
        self.shadow_percent = shadow_percent
        self._canary_buckets = round(canary_percent * _BUCKETS / 100)
        self._shadow_buckets = round(shadow_percent * _BUCKETS / 100)
        self._next = 0
        # The three answers, made once: route() runs for every request.
        self._to_candidate = Route(candidate)
        self._copied = Route(primary, candidate)
        self._to_primary = Route(primary)

    def route(self, key: str | None = None) -> Route:
        if key is None:
            bucket = self._next
            self._next = (bucket + _STRIDE) % _BUCKETS
        else:
            bucket = bucket_of(key)
        if bucket < self._canary_buckets:
            return self._to_candidate
        if bucket < self._shadow_buckets:  # a shadow step copies; the primary still answers
            return self._copied
        return self._to_primary
