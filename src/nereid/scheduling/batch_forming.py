"""The rules every batcher forms a batch by: how large the next batch may be (max_batch_size and the preferred
batch sizes) and which requests may share it (equal non-batch shapes). Rules only: it never queues, waits or
executes anything."""

from __future__ import annotations

from collections.abc import Iterable

from nereid.core.types import InferenceRequest

__all__ = ["BatchSizes", "ShapeKey", "shape_key"]

# What requests sharing a batch have in common: (input name, non-batch dims) of each input, in name order.
ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


def shape_key(request: InferenceRequest, ragged: frozenset[str]) -> ShapeKey:
    """Two requests can share a batch only when every input that is not ragged has the same non-batch shape
    (Triton's equal-shapes rule); inputs are compared by name, whatever order the client sent them in."""
    pairs = []
    for t in request.inputs:  # a plain loop: it runs for every request a batch considers
        if t.name not in ragged:
            pairs.append((t.name, t.shape[1:]))
    if len(pairs) > 1:
        pairs.sort()
    return tuple(pairs)


class BatchSizes:
    """max_batch_size with the preferred batch sizes that fit under it: the size a batcher waits for and the
    size it cuts a batch at."""

    __slots__ = ("max_batch", "preferred", "target")

    def __init__(self, max_batch: int, preferred: Iterable[int] = ()) -> None:
        self.max_batch = max_batch
        self.preferred = sorted(s for s in preferred if 0 < s <= max_batch)
        # A batch held open for max_queue_delay is complete once it reaches the largest preferred size.
        self.target = self.preferred[-1] if self.preferred else max_batch

    def cut(self, available: int) -> int:
        """The most items the next batch takes when `available` are waiting: the largest preferred size they
        fill when they are fewer than max_batch_size (as Triton cuts a batch), else max_batch_size."""
        if self.preferred and available < self.max_batch:
            limit = 0
            for size in self.preferred:
                if size > available:
                    break
                limit = size
            if limit:
                return limit
        return self.max_batch
