"""Large batches split by rows across the machine's cores, one single-threaded engine call per part.

Why threads and not the engine's own OpenMP threads: on a shared machine a 2-thread OpenMP call stalls ~24 ms
whenever another process holds a core (benchmarks/results/fil_engines.md), while the engines' ctypes calls
release the GIL, so plain threads each running a 1-thread call scale without that stall. Each row's answer is
computed on its own, so the split changes no number.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["MIN_ROWS_PER_PART", "in_parts"]

_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
# Each part pays XGBoost's ~0.2 ms fixed cost per call, and the second core is often busy with HTTP work, so
# split only where it clearly pays (500 trees, 2 cores, whole vs split, ms: 64 rows 0.87 vs 0.99; 256 rows
# 2.2 vs 1.4-2.3, a coin flip; 512 rows 4.2 vs 3.3-4.0; 1024 rows 7.9 vs 4.9; benchmarks/results/fil_engines.md).
MIN_ROWS_PER_PART = 256
# Shared by every fil instance, so instances x parts never exceeds what the cores can run at once by much.
_HELPERS = ThreadPoolExecutor(max_workers=max(_CORES - 1, 1), thread_name_prefix="fil-part")


def in_parts(predict: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, cores: int = _CORES) -> np.ndarray:
    """`predict(rows)`, computed in up to `cores` row ranges at once (the calling thread runs the first)."""
    parts = min(cores, len(rows) // MIN_ROWS_PER_PART)
    if parts < 2:
        return predict(rows)
    bounds = [len(rows) * i // parts for i in range(parts + 1)]
    ranges = list(zip(bounds[1:-1], bounds[2:], strict=True))
    futures = [_HELPERS.submit(predict, rows[start:end]) for start, end in ranges]
    results = [predict(rows[: bounds[1]])]
    for (start, end), future in zip(ranges, futures, strict=True):
        # A part still queued (the helpers are busy with another instance's batch) runs here instead of waiting.
        results.append(predict(rows[start:end]) if future.cancel() else future.result())
    return np.concatenate(results)
