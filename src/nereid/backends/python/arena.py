"""Shared-memory arenas that carry tensor bytes between the server and a worker, growing on demand.

An arena is an anonymous memory file (memfd, so /dev/shm's size limit never applies) mapped by both processes.
One side owns it and writes (the server for inputs, the worker for outputs); the other side maps it read-mostly and
remaps when a message says the file grew. Space is handed out by a bump pointer that its owner rewinds once the
peer has consumed everything before it; `read_array` reads a tensor laid out in one. The worker imports this
module: keep it free of server imports.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import numpy as np

from nereid.core.dtypes import deserialize_bytes, numpy_dtype

__all__ = ["Arena", "create_arena_fd", "read_array", "ALIGN"]

ALIGN = 64
_MIN_SIZE = 1 << 20
_GROW_STEP = 1 << 20


def create_arena_fd(name: str, size: int = _MIN_SIZE) -> int:
    """A new shared-memory file of `size` bytes; memfd where the kernel has it, else an unlinked temp file."""
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix=f"{name}-", dir=directory)
        os.unlink(path)
    os.ftruncate(fd, max(size, mmap.PAGESIZE))
    return fd


class Arena:
    """One mapping of an arena file. `head` is the owner's bump pointer."""

    __slots__ = ("fd", "size", "mm", "head", "_owns_fd")

    def __init__(self, fd: int, owns_fd: bool = True) -> None:
        self.fd = fd
        self._owns_fd = owns_fd
        self.size = os.fstat(fd).st_size
        self.mm = mmap.mmap(fd, self.size)
        self.head = 0

    # -- the owner ------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        """Reserve `nbytes` at the bump pointer (64-byte aligned), growing the file if needed; returns the offset."""
        offset = self.head
        end = offset + nbytes
        if end > self.size:
            self.grow(end)
        self.head = (end + ALIGN - 1) & ~(ALIGN - 1)
        return offset

    def grow(self, needed: int) -> None:
        size = max(needed, self.size * 2)
        size = (size + _GROW_STEP - 1) // _GROW_STEP * _GROW_STEP
        os.ftruncate(self.fd, size)
        self._remap(size)

    # -- the peer -------------------------------------------------------------------------------
    def ensure(self, size: int) -> None:
        """Map at least `size` bytes: the owner grew the file."""
        if size > self.size:
            self._remap(size)

    def _remap(self, size: int) -> None:
        # The old mapping stays valid for arrays that still view it; dropping our reference lets it go with them.
        self.mm = mmap.mmap(self.fd, size)
        self.size = size

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # arrays still view it; it is unmapped when they are gone
        if self._owns_fd:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self._owns_fd = False


def read_array(buffer: Any, datatype: str, shape: Any, offset: int, nbytes: int, copy: bool) -> np.ndarray:
    """One tensor laid out in an arena: a view, or a copy when the writer will reuse the space (BYTES elements are
    always copied out, into an object array); ValueError when the bytes do not match the shape."""
    if datatype == "BYTES":
        count = 1
        for dim in shape:
            count *= dim
        view = memoryview(buffer)[offset : offset + nbytes]
        try:
            items = deserialize_bytes(view, count)
        finally:
            view.release()
        if len(items) != count:
            raise ValueError(f"a BYTES tensor of shape {list(shape)} holds {len(items)} elements")
        return items.reshape(shape)
    np_dtype = numpy_dtype(datatype)
    if nbytes == 0:
        return np.empty(shape, np_dtype)
    array = np.frombuffer(buffer, np_dtype, nbytes // np_dtype.itemsize, offset).reshape(shape)
    return array.copy() if copy else array
