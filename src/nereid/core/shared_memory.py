"""The system shared-memory registry that both protocols share: register, status, unregister, and reading
inputs from and writing outputs into registered regions (zero-copy views on the mapping)."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereid.core.dtypes import deserialize_bytes, numpy_dtype, serialize_bytes
from nereid.core.errors import NereidError, Status

__all__ = ["SharedMemoryRegion", "SharedMemoryRegistry"]


@dataclass(slots=True)
class SharedMemoryRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    def __init__(self) -> None:
        self._regions: dict[str, SharedMemoryRegion] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self._regions:
            raise NereidError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        path = "/dev/shm/" + key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            raise NereidError.internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            size = os.fstat(fd).st_size
            if byte_size <= 0:
                raise NereidError.invalid(
                    f"failed to register shared memory region '{name}': unable to process address space: "
                    f"byte_size must be positive, got {byte_size}"
                )
            if offset < 0 or offset + byte_size > size:
                raise NereidError.invalid(
                    f"failed to register shared memory region '{name}': invalid args: offset {offset} + byte_size "
                    f"{byte_size} exceeds the {size} bytes of '{key}'"
                )
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._regions[name] = SharedMemoryRegion(name, key, offset, byte_size, mapping)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise NereidError.not_found(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [r.status() for r in self._regions.values()]

    def unregister(self, name: str = "") -> None:
        names = [name] if name else list(self._regions)
        for item in names:
            region = self._regions.pop(item, None)
            if region is not None:
                try:
                    region.mapping.close()
                except BufferError:
                    pass  # a response still holds a view; the mapping closes when it is collected

    def _span(self, name: str, offset: int, byte_size: int) -> tuple[SharedMemoryRegion, int]:
        region = self._regions.get(name)
        if region is None:
            raise NereidError.not_found(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise NereidError.invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset

    def read(self, name: str, offset: int, byte_size: int, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
        region, start = self._span(name, offset, byte_size)
        view = memoryview(region.mapping)[start : start + byte_size]
        if datatype == "BYTES":
            return deserialize_bytes(view).reshape(shape)
        return np.frombuffer(view, dtype=numpy_dtype(datatype)).reshape(shape)

    def write(self, name: str, offset: int, byte_size: int, output_name: str, array: np.ndarray, datatype: str) -> int:
        """Copy an output into a region; returns the bytes written."""
        region, start = self._span(name, offset, byte_size)
        payload = serialize_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
        if len(payload) > byte_size:
            raise NereidError.invalid(
                f"shared memory size specified with the request for output '{output_name}' should be at least "
                f"{len(payload)} bytes to hold the results"
            )
        region.mapping[start : start + len(payload)] = payload
        return len(payload)
