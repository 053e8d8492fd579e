"""The places a sequence's requests wait in the sequence batcher: a slot of one instance while the sequence
holds it, a backlog while every slot is taken, and the reaper's release marker. Containers only: the
sequence batcher decides what moves between them."""

from __future__ import annotations

import collections
from typing import Protocol

from nereid.core.types import InferenceRequest
from nereid.scheduling.sequence_state import State

__all__ = ["CorrelationId", "Slot", "SlotInstance", "Backlog", "Release", "RELEASE"]

CorrelationId = int | str


class Release:
    """Queued by the reaper behind a sequence's last request: release the slot once it gets here."""


RELEASE = Release()


class SlotInstance(Protocol):
    """What a slot needs of the instance it belongs to (the sequence batcher's per-instance runner): its name, for
    logs; its place among the instances and whether an instance update removed it, to choose free slots; how to
    hand it a request for the slot, or tell it the slot has work or was freed."""

    @property
    def name(self) -> str: ...

    @property
    def order(self) -> int: ...

    @property
    def retiring(self) -> bool: ...

    def wake(self) -> None: ...

    def enqueue(self, slot: Slot, request: InferenceRequest | Release) -> None: ...

    def notify(self, slot: Slot) -> None: ...


class Slot:
    """One batch slot of one instance; while `corrid` is set it belongs to that sequence."""

    __slots__ = ("batcher", "index", "corrid", "queue", "state", "in_flight")

    def __init__(self, batcher: SlotInstance, index: int) -> None:
        self.batcher = batcher
        self.index = index
        self.corrid: CorrelationId | None = None
        self.queue: collections.deque[InferenceRequest | Release] = collections.deque()
        self.state: State = {}
        self.in_flight = False


class Backlog:
    """The requests of a sequence that started while every slot was taken."""

    __slots__ = ("corrid", "queue", "expires_ns")

    def __init__(self, corrid: CorrelationId) -> None:
        self.corrid = corrid
        self.queue: collections.deque[InferenceRequest | Release] = collections.deque()
        self.expires_ns = 0

    def add(self, request: InferenceRequest, now_ns: int) -> None:
        self.queue.append(request)
        if request.timeout_us:
            deadline = now_ns + request.timeout_us * 1000
            self.expires_ns = min(self.expires_ns, deadline) if self.expires_ns else deadline
