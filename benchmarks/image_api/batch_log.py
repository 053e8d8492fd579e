"""The peers' batch sizes, for the benchmark's table: each batch appends its size to the file named by
BENCH_BATCH_LOG (their servers expose no batch statistics; Nereid's come from its statistics API)."""

from __future__ import annotations

import os
from pathlib import Path


def record_batch(size: int) -> None:
    path = os.environ.get("BENCH_BATCH_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{size}\n")


def mean_batch(path: Path) -> float:
    sizes = [int(line) for line in path.read_text().split()] if path.exists() else []
    return sum(sizes) / len(sizes) if sizes else float("nan")
