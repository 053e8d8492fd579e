"""The system shared-memory registry that both protocols share: register, status, unregister, and reading
inputs from and writing outputs into registered regions (zero-copy views on the mapping).

Clients may register regions only with --allow-client-shm (off by default, as in Triton); a key names one object
in /dev/shm (no folders, no symlinks, as shm_open takes it), and reads and writes stay inside the registered span."""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereid.core.dtypes import deserialize_bytes, numpy_dtype
from nereid.core.errors import NereidError, Status
from nereid.core.tensor_codec import array_from_buffer, tensor_bytes
from nereid.core.types import InferenceRequest, OutputTensor

__all__ = ["CLIENT_SHM_DISABLED", "RESERVED_KEY_PREFIX", "SharedMemoryRegion", "SharedMemoryRegistry"]

# Triton's words (tritonserver since 26.04) for a register or unregister while client shared memory is off.
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"  # keys a client may not register, as in Triton
CLIENT_SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


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
    def __init__(self, allow_client: bool = False) -> None:
        self._regions: dict[str, SharedMemoryRegion] = {}
        self.allow_client = allow_client  # --allow-client-shm
        # As in Triton, a region unregistered while requests in flight read from or write to it stays registered
        # (listed, and usable by new requests) until the last of them ends.
        self._in_use: dict[str, int] = {}
        self._unregistered: set[str] = set()

    def check_allowed(self) -> None:
        """Registering and unregistering (system or CUDA) need --allow-client-shm; status is always allowed."""
        if not self.allow_client:
            raise NereidError.unsupported(CLIENT_SHM_DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_allowed()
        if name in self._regions:
            raise NereidError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        bare = key.lstrip("/")
        if not bare:
            raise NereidError.invalid(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
        if bare.startswith(RESERVED_KEY_PREFIX):  # the Python backend's own regions, in Triton
            raise NereidError.invalid(
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved "
                f"prefix '{RESERVED_KEY_PREFIX}'"
            )
        object_name = key[1:] if key.startswith("/") else key
        # One object in /dev/shm, as shm_open names it: a key with a folder in it ('../etc/passwd') is refused.
        if not object_name or "/" in object_name or object_name in (".", "..") or "\0" in object_name:
            raise NereidError.internal(f"Unable to open shared memory region: '{key}'")
        try:
            fd = os.open("/dev/shm/" + object_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise NereidError.internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NereidError.internal(f"Unable to open shared memory region: '{key}'")
            size = info.st_size
            if byte_size <= 0:
                raise NereidError.invalid(
                    f"failed to register shared memory region '{name}': invalid args: byte_size must be positive, "
                    f"got {byte_size}"
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
        """Unmap regions (a client's unregister calls check_allowed first; shutting down unmaps all); one a request
        in flight uses goes when the last such request ends (see `hold`)."""
        names = [name] if name else list(self._regions)
        for item in names:
            if item in self._in_use:
                self._unregistered.add(item)
            else:
                self._remove(item)

    def _remove(self, name: str) -> None:
        self._unregistered.discard(name)
        region = self._regions.pop(name, None)
        if region is not None:
            try:
                region.mapping.close()
            except BufferError:
                pass  # a response still holds a view; the mapping closes when it is collected

    def hold(self, request: InferenceRequest) -> tuple[str, ...]:
        """The regions `request` reads its inputs from or writes its outputs to, kept registered until `release`
        (nothing to do, and no scan, while no region is registered)."""
        if not self._regions:
            return ()
        names = [str(t.parameters["shared_memory_region"]) for t in request.inputs if "shared_memory_region" in t.parameters]
        names += [str(o.parameters["shared_memory_region"]) for o in request.outputs or () if o.parameters.get("shared_memory_region")]
        for name in names:
            self._in_use[name] = self._in_use.get(name, 0) + 1
        return tuple(names)

    def release(self, names: tuple[str, ...]) -> None:
        """The request that `hold` gave `names` has ended: unregister what was unregistered while it ran."""
        for name in names:
            left = self._in_use[name] - 1
            if left:
                self._in_use[name] = left
                continue
            del self._in_use[name]
            if name in self._unregistered:
                self._remove(name)

    def _span(self, name: str, offset: int, byte_size: int) -> tuple[SharedMemoryRegion, int]:
        region = self._regions.get(name)
        if region is None:
            raise NereidError.not_found(f"Unable to find shared memory region: '{name}'")
        if offset < 0 or offset >= region.byte_size:
            raise NereidError.invalid(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > 2**64 - 1:  # only JSON can carry such sizes; Triton names the overflow
            raise NereidError.invalid(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds 2^64 - 1 for shared "
                f"memory region: '{name}'"
            )
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise NereidError.invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset

    def read(self, name: str, offset: int, byte_size: int, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
        region, start = self._span(name, offset, byte_size)
        view = memoryview(region.mapping)[start : start + byte_size]
        if datatype == "BYTES":
            return deserialize_bytes(view).reshape(shape)
        return np.frombuffer(view, dtype=numpy_dtype(datatype)).reshape(shape)

    def input_array(
        self, params: dict[str, Any], datatype: str, shape: tuple[int, ...], input_name: str, model: str, request_id: str
    ) -> np.ndarray:
        """The data of an input whose parameters name a region (`shared_memory_region`, with the optional
        `shared_memory_byte_size` and `shared_memory_offset`), checked against its datatype and shape: the one
        reading of a shared-memory input, whatever protocol carried the request."""
        try:
            byte_size = int(params.get("shared_memory_byte_size", 0))
            offset = int(params.get("shared_memory_offset", 0))
        except (TypeError, ValueError):
            raise NereidError.invalid(
                f"input '{input_name}' for model '{model}': shared_memory_byte_size and shared_memory_offset must be "
                f"integers"
            ) from None
        view = self.read(str(params["shared_memory_region"]), offset, byte_size, "UINT8", (byte_size,))
        return array_from_buffer(view.data, datatype, shape, input_name, model, request_id)

    def write(self, name: str, offset: int, byte_size: int, output_name: str, array: np.ndarray, datatype: str) -> int:
        """Copy an output into a region; returns the bytes written."""
        region, start = self._span(name, offset, byte_size)
        payload = tensor_bytes(array, datatype)
        if len(payload) > byte_size:
            raise NereidError.invalid(
                f"shared memory size specified with the request for output '{output_name}' should be at least "
                f"{len(payload)} bytes to hold the results"
            )
        region.mapping[start : start + len(payload)] = payload
        return len(payload)

    def write_output(self, output: OutputTensor, params: dict[str, Any]) -> None:
        """Copy an output into the region its requested-output `params` name, and leave on it the parameters
        that tell the frontends to send no data for it (the region, the bytes written, the offset asked)."""
        region = str(params["shared_memory_region"])
        written = self.write(region, int(params.get("shared_memory_offset", 0)),
                             int(params.get("shared_memory_byte_size", 0)), output.name, output.data, output.datatype)  # fmt: skip
        output.parameters = {"shared_memory_region": region, "shared_memory_byte_size": written}
        if "shared_memory_offset" in params:
            output.parameters["shared_memory_offset"] = params["shared_memory_offset"]
