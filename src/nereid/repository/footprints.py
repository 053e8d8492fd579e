"""Model footprints: measured (a worker's proportional memory with its shared-memory arenas, the server's RSS delta
across a load done alone, NVML's per-process GPU figure), declared in config, or estimated, and the state file that
remembers them across restarts.

It measures and remembers; deciding what stays resident is the residency policy's work.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "Footprint",
    "FootprintBook",
    "HeapRelease",
    "LoadProbe",
    "Nvml",
    "files_bytes",
    "process_memory",
    "release_freed_heap",
]

log = logging.getLogger("nereid.repository")

# A model of a backend nobody has measured yet: its files twice over (weights plus the framework's copies),
# and what one worker process or framework session costs before it holds a single weight.
# A TensorFlow session measured 1-7 MiB over its weights (tensorflow-cpu 2.21); TensorFlow's import (about 600 MiB,
# once per process, when the first TensorFlow model is prepared) is no one model's.
_UNMEASURED_BASE_BYTES = {"python": 48 << 20, "onnxruntime": 8 << 20, "tensorflow": 8 << 20}
_DEFAULT_BASE_BYTES = 16 << 20


@dataclass(slots=True)
class Footprint:
    """The memory a model holds: host bytes, GPU bytes per device, and where the figure came from
    (measured, remembered, declared or estimated)."""

    host_bytes: int
    gpu_bytes: dict[int, int] = field(default_factory=dict)
    source: str = "estimated"

    def as_dict(self) -> dict[str, Any]:
        return {"host_bytes": self.host_bytes, "gpu_bytes": {str(k): v for k, v in self.gpu_bytes.items()}}


def files_bytes(model_path: Path) -> int:
    """The size of a model folder's files (every version), the first hint of its footprint."""
    total = 0
    for root, _dirs, names in os.walk(model_path):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def process_memory(pid: int) -> int:
    """What a worker process really costs: its PSS (its own pages, plus its share of pages mapped by several
    processes such as the interpreter's libraries) plus its Pss_Shmem once more. The shared-memory arenas are mapped
    by the worker and the server, so PSS gives each half of them; counting the worker's half twice charges the whole
    arena to the model that owns it (USS, which leaves shared pages out, charged none of it). Falls back to psutil's
    figures where smaps_rollup is unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            fields = {}
            for line in rollup:
                key, _, rest = line.partition(b":")
                if key in (b"Pss", b"Pss_Shmem"):
                    fields[key] = int(rest.split()[0]) * 1024
        if b"Pss" in fields:
            return fields[b"Pss"] + fields.get(b"Pss_Shmem", 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        process = psutil.Process(pid)
        try:
            info = process.memory_full_info()
            return int(getattr(info, "pss", 0) or getattr(info, "uss", 0) or info.rss)
        except (psutil.AccessDenied, AttributeError):
            return int(process.memory_info().rss)
    except psutil.Error:
        return 0


_libc: Any = None


async def release_freed_heap() -> None:
    """Collect reference cycles now, then return freed heap to the system with glibc's malloc_trim (a no-op where
    the C library has none). The server raises the collector's thresholds for the hot path, so the cycles that an
    unloaded model leaves (its schedulers, instances and futures) would otherwise wait for a full collection that
    hardly ever comes.

    The collection runs here, on the event loop's thread: it holds the GIL throughout, so another thread would not
    make it cheaper, and a collection on another thread runs finalizers beside that thread's work (the server
    crashed with SIGSEGV in protobuf's parser while a collection ran on another thread, under a churn of ten loads a
    second). malloc_trim releases the GIL, so it goes to a thread."""
    global _libc
    gc.collect()
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        await asyncio.to_thread(_libc.malloc_trim, 0)


# How long after an unload the heap it freed goes back, at the latest: one release serves every unload meanwhile.
RELEASE_AFTER_UNLOAD_SECS = 1.0


class HeapRelease:
    """What unloads free goes back to the system within RELEASE_AFTER_UNLOAD_SECS, once for all of them: their
    reference cycles are collected, then malloc_trim returns the freed heap. An unload does not wait for it. A
    full collection scans every live object (a median of 27 ms on the event loop, up to 76, with 50 models
    loaded), and waiting for malloc_trim on its thread costs an eviction about 15 ms: under a churn of 15
    evictions a second, evictions that each waited for both would give a fifth of the loop's time to them.
    What a model holds that matters to the budget (its session, its worker and the worker's arenas) is freed
    explicitly as it unloads, and a load that follows reuses the heap its victim freed before any of it goes back."""

    def __init__(self) -> None:
        self._release: asyncio.TimerHandle | None = None

    def after_unload(self) -> None:
        if self._release is None:
            self._release = asyncio.get_running_loop().call_later(RELEASE_AFTER_UNLOAD_SECS, self._start)

    def _start(self) -> None:
        self._release = None  # an unload that ends from here on needs the next release
        task = asyncio.ensure_future(release_freed_heap())
        _background.add(task)
        task.add_done_callback(_background.discard)


_background: set[asyncio.Future[None]] = set()  # collections under way (a task nothing holds may vanish)


class Nvml:
    """NVML's per-process GPU memory, where an NVIDIA driver and the nvidia-ml-py package exist; everywhere else
    `available` is False and every figure is empty."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._lib = pynvml
        except Exception:  # no package, no driver, no device: a machine without GPUs
            self._lib = None

    @property
    def available(self) -> bool:
        return self._lib is not None and bool(self._handles)

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def used_by(self, pids: Iterable[int]) -> dict[int, int]:
        """GPU bytes the given processes hold, per device index."""
        if not self.available:
            return {}
        wanted = set(pids)
        used: dict[int, int] = {}
        for index, handle in enumerate(self._handles):
            try:
                processes = self._lib.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                continue
            total = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid in wanted)
            if total:
                used[index] = total
        return used


class LoadProbe:
    """The server process's memory around one load. The delta is the model's only when no other load overlapped
    it: concurrent loads share one process, so their deltas cannot be told apart."""

    _lock = threading.Lock()
    _active: set[LoadProbe] = set()

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self.overlapped = False  # another load ran meanwhile: this one's delta cannot be told from its
        with LoadProbe._lock:
            for other in LoadProbe._active:
                other.overlapped = True
            if LoadProbe._active:
                self.overlapped = True
            LoadProbe._active.add(self)
        self._rss = psutil.Process().memory_info().rss
        self._gpu = nvml.used_by([os.getpid()])

    def finish(self) -> tuple[int, dict[int, int]] | None:
        """The host and GPU deltas of a load done alone; None when another load overlapped it."""
        with LoadProbe._lock:
            LoadProbe._active.discard(self)
        if self.overlapped:
            return None
        rss = psutil.Process().memory_info().rss
        gpu = self._nvml.used_by([os.getpid()])
        gpu_delta = {d: max(0, b - self._gpu.get(d, 0)) for d, b in gpu.items() if b > self._gpu.get(d, 0)}
        return max(0, rss - self._rss), gpu_delta


class FootprintBook:
    """What each model measured (this run, or a previous one through the state file) and the estimates for
    models never measured. The state file is small JSON: model name -> host bytes, GPU bytes, file bytes, backend."""

    def __init__(self, state_file: str) -> None:
        self._path = Path(state_file) if state_file else None
        self._remembered: dict[str, dict[str, Any]] = {}
        self._dirty = False
        if self._path is not None and self._path.exists():
            try:
                data = json.loads(self._path.read_text())
                self._remembered = {str(k): v for k, v in data.get("models", {}).items() if isinstance(v, dict)}
            except (OSError, ValueError) as exc:
                log.warning("footprint state file '%s' is unreadable (%s); starting without it", self._path, exc)

    def remembered(self, name: str, files: int) -> Footprint | None:
        """A footprint measured before, as long as the model's files are still the size they were then."""
        entry = self._remembered.get(name)
        if entry is None or int(entry.get("files_bytes", -1)) != files:
            return None
        gpu = {int(k): int(v) for k, v in entry.get("gpu_bytes", {}).items()}
        return Footprint(int(entry.get("host_bytes", 0)), gpu, "remembered")

    def record(self, name: str, backend: str, files: int, footprint: Footprint) -> None:
        entry = {"backend": backend, "files_bytes": files, **footprint.as_dict()}
        if self._remembered.get(name) != entry:
            self._remembered[name] = entry
            self._dirty = True

    def estimate(self, backend: str, files: int, instances: int) -> Footprint:
        """A model never measured: its files plus what the same backend's measured models held beyond theirs, or,
        with none measured, its files twice plus a per-instance base."""
        overheads = [
            int(e.get("host_bytes", 0)) - int(e.get("files_bytes", 0))
            for e in self._remembered.values()
            if e.get("backend") == backend
        ]
        if overheads:
            return Footprint(files + max(0, sum(overheads) // len(overheads)), {}, "estimated")
        base = _UNMEASURED_BASE_BYTES.get(backend, _DEFAULT_BASE_BYTES)
        return Footprint(2 * files + base * max(1, instances), {}, "estimated")

    def save(self) -> None:
        """Write the state file if anything changed (atomically: a crash leaves the old file whole)."""
        if self._path is None or not self._dirty:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(self._path.suffix + ".tmp")
            temporary.write_text(json.dumps({"version": 1, "models": self._remembered}, indent=1, sort_keys=True))
            os.replace(temporary, self._path)
            self._dirty = False
        except OSError as exc:
            log.warning("could not write the footprint state file '%s': %s", self._path, exc)
