"""The order a gRPC stream writes its responses in: those of a model that is not decoupled leave in the order their
requests came on the stream, as Triton 2.51 writes them (asked: a slow request's answer goes before a later fast
one's, even on two instances); a decoupled model's go as they come. It only holds and releases what a stream
writes; the requests still run concurrently."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["StreamOrder"]


class StreamOrder:
    """Turns in request order: the head turn's items pass straight to `put`, a later turn's wait until every earlier
    turn is done."""

    __slots__ = ("_put", "_next", "_head", "_held", "_done")

    def __init__(self, put: Callable[[Any], None]) -> None:
        self._put = put
        self._next = 0
        self._head = 0
        self._held: dict[int, list[Any]] = {}
        self._done: set[int] = set()

    def take(self) -> int:
        turn = self._next
        self._next += 1
        return turn

    def put(self, turn: int, item: Any) -> None:
        if turn == self._head:
            self._put(item)
        else:
            self._held.setdefault(turn, []).append(item)

    def done(self, turn: int) -> None:
        """The turn's request has written all it will write (or turned out to be a decoupled model's)."""
        if turn != self._head:
            self._done.add(turn)
            return
        while True:
            self._head += 1
            for item in self._held.pop(self._head, ()):
                self._put(item)
            if self._head not in self._done:
                return
            self._done.discard(self._head)
