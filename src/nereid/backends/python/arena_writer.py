"""Writing tensors into a shared-memory arena: the server's writer of its input arena (a batch's inputs and the
outputs of BLS responses, one code path for both), and the per-tensor copy the worker's output writer shares.

A tensor goes in as its raw bytes (BYTES as Triton's length-prefixed form), each one 64-byte aligned, and is
described by a `TensorMeta`. The worker imports this module: keep it free of server imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nereid.backends.python.arena import ALIGN, Arena
from nereid.backends.python.protocol import CONTROL_BYTES, REPLIES_TAKEN, TensorMeta
from nereid.core.dtypes import serialize_bytes

if TYPE_CHECKING:  # the worker imports this module without the server's request types
    from nereid.core.types import InputTensor, OutputTensor

__all__ = ["InputArenaWriter", "tensor_bytes", "copy_into"]

_MASK = ~(ALIGN - 1)


def tensor_bytes(datatype: str, array: Any) -> tuple[Any, int]:
    """What to copy for one tensor and its size: BYTES serialized, anything else the array itself."""
    if datatype == "BYTES":
        data = serialize_bytes(array)
        return data, len(data)
    return array, array.nbytes


def copy_into(mm: Any, offset: int, data: Any, nbytes: int) -> None:
    """Copy a tensor's bytes to `offset`; arrays that expose no contiguous buffer go through a C-ordered copy."""
    if nbytes:
        try:
            mm[offset : offset + nbytes] = data
        except (BufferError, TypeError, ValueError):
            mm[offset : offset + nbytes] = np.ascontiguousarray(data).tobytes()


class InputArenaWriter:
    """The server's input arena of one worker: where each batch's inputs and each BLS response's outputs go.

    Regions stay in use while a batch is in flight (by its seq) or a BLS response has not been taken by the worker
    (by -reply_no, until the worker's REPLIES_TAKEN word passes it). With batches pipelined some batch always is in
    flight, so new tensors go before the oldest region in use when they fit, else after the last one (growing the
    arena), instead of growing without end."""

    __slots__ = ("arena", "outputs", "live", "replies")

    def __init__(self, arena: Arena, outputs: Arena) -> None:
        self.arena = arena
        self.outputs = outputs  # the worker's output arena, whose control block says which replies it took
        self.live: dict[int, tuple[int, int]] = {}
        self.replies: list[int] = []

    def _reserve(self, nbytes: int) -> int:
        live = self.live
        if self.replies:
            taken = REPLIES_TAKEN.unpack_from(self.outputs.mm, 0)[0]
            for reply in [r for r in self.replies if r <= taken]:
                del live[-reply]
                self.replies.remove(reply)
        start = CONTROL_BYTES
        if live:
            regions = live.values()
            if CONTROL_BYTES + nbytes > min(r[0] for r in regions):
                start = (max(r[1] for r in regions) + ALIGN - 1) & _MASK
        arena = self.arena
        if start + nbytes > arena.size:
            arena.grow(start + nbytes)
        return start

    def write(
        self, groups: Sequence[Sequence[InputTensor] | Sequence[OutputTensor]], data_shapes: bool = False
    ) -> tuple[list[tuple[TensorMeta, ...]], int, int]:
        """Copy groups of tensors (each request's inputs, or one response's outputs) into one free region; the
        metadata of each group and the region they took (start, end). `data_shapes`: describe each tensor by its
        array's shape (a response's outputs) rather than its declared shape (a request's inputs)."""
        payloads = []
        total = 0
        for tensors in groups:
            for tensor in tensors:
                data = tensor.data
                # tensor_bytes, written out for the common case: this runs for every tensor of every batch.
                payload = tensor_bytes("BYTES", data) if tensor.datatype == "BYTES" else (data, data.nbytes)
                payloads.append(payload)
                total += (payload[1] + ALIGN - 1) & _MASK
        start = head = self._reserve(total)
        mm: Any = self.arena.mm  # slices take any buffer (numpy arrays too)
        described: list[tuple[TensorMeta, ...]] = []
        position = 0
        for tensors in groups:
            metas: list[TensorMeta] = []
            for tensor in tensors:
                data, nbytes = payloads[position]
                position += 1
                try:
                    mm[head : head + nbytes] = data
                except (BufferError, TypeError, ValueError):
                    copy_into(mm, head, data, nbytes)  # an array without a contiguous buffer
                shape = tuple(int(d) for d in tensor.data.shape) if data_shapes else tensor.shape
                metas.append((tensor.name, tensor.datatype, shape, head, nbytes))
                head = (head + nbytes + ALIGN - 1) & _MASK
            described.append(tuple(metas))
        return described, start, head

    def hold_batch(self, seq: int, region: tuple[int, int]) -> None:
        self.live[seq] = region

    def release_batch(self, seq: int) -> None:
        self.live.pop(seq, None)

    def hold_reply(self, reply_no: int, region: tuple[int, int]) -> None:
        """A BLS response's outputs, in use until the worker says it took them."""
        self.live[-reply_no] = region
        self.replies.append(reply_no)
