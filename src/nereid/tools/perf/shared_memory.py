"""`--shared-memory system`: put every request's input tensors in one POSIX shared-memory region, give outputs a
region of their own, register both with the server and unregister and unlink them afterwards."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

from nereid.tools.perf.config import PerfConfig, PerfError
from nereid.tools.perf.control_client import ControlClient, ModelInfo
from nereid.tools.perf.input_data import InputSet

__all__ = ["ShmPlacement", "SystemSharedMemory"]

_ITEM_SIZE = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4, "INT32": 4, "FP32": 4}


@dataclass(slots=True)
class ShmPlacement:
    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        return {
            "shared_memory_region": self.region,
            "shared_memory_offset": self.offset,
            "shared_memory_byte_size": self.byte_size,
        }


@dataclass
class SystemSharedMemory:
    """Regions for one run. `inputs[stream][step][input name]` and `outputs[output name]` say where tensors live."""

    client: ControlClient
    inputs: list[list[dict[str, ShmPlacement]]] = field(default_factory=list)
    outputs: dict[str, ShmPlacement] = field(default_factory=dict)
    _segments: list[shared_memory.SharedMemory] = field(default_factory=list)
    _registered: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, client: ControlClient, model: ModelInfo, inputs: InputSet, config: PerfConfig) -> SystemSharedMemory:
        shm = cls(client)
        try:
            shm._place(model, inputs, config)
        except BaseException:
            shm.close()
            raise
        return shm

    def _region(self, suffix: str, size: int) -> tuple[str, shared_memory.SharedMemory]:
        name = f"nereid_perf_{os.getpid()}_{suffix}"
        try:
            segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        except OSError as exc:
            raise PerfError(f"--shared-memory: cannot create /dev/shm/{name}: {exc.strerror}") from None
        self._segments.append(segment)
        return name, segment

    def _place(self, model: ModelInfo, inputs: InputSet, config: PerfConfig) -> None:
        total = sum(len(t.raw) for stream in inputs.streams for sample in stream for t in sample)
        name, segment = self._region("input", total)
        buffer = segment.buf
        assert buffer is not None
        offset = 0
        for stream in inputs.streams:
            placed_stream = []
            for sample in stream:
                placed = {}
                for tensor in sample:
                    buffer[offset : offset + len(tensor.raw)] = tensor.raw
                    placed[tensor.name] = ShmPlacement(name, offset, len(tensor.raw))
                    offset += len(tensor.raw)
                placed_stream.append(placed)
            self.inputs.append(placed_stream)
        self._register(name, total)
        sizes = {}
        for spec in model.outputs:
            item = _ITEM_SIZE.get(spec.datatype, 8)
            if spec.datatype != "BYTES" and all(d >= 0 for d in spec.dims):
                size = math.prod(spec.dims) * item * (config.batch_size if model.max_batch_size > 0 else 1)
            else:
                size = config.output_shared_memory_size * (config.batch_size if model.max_batch_size > 0 else 1)
            sizes[spec.name] = size
        out_name, _ = self._region("output", sum(sizes.values()))
        offset = 0
        for output, size in sizes.items():
            self.outputs[output] = ShmPlacement(out_name, offset, size)
            offset += size
        self._register(out_name, sum(sizes.values()))

    def _register(self, name: str, size: int) -> None:
        self.client.register_system_shm(name, "/" + name, max(size, 1))
        self._registered.append(name)

    def close(self) -> None:
        for name in self._registered:
            try:
                self.client.unregister_system_shm(name)
            except PerfError:
                pass
        self._registered.clear()
        for segment in self._segments:
            segment.close()
            try:
                segment.unlink()
            except FileNotFoundError:
                pass
        self._segments.clear()
