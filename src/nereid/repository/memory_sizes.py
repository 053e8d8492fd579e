"""Parsing the orchestration flags' values (memory sizes, the budget, group limits) into settings, with messages
that name the flag and the expected form. Pure functions: they read no machine state except total RAM for `N%`."""

from __future__ import annotations

import re

import psutil

from nereid.core.settings import MemoryBudget

__all__ = ["parse_memory_size", "parse_memory_budget", "parse_group_limit", "format_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
    # Kubernetes' spelling of the binary units.
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory_size(text: str, what: str, total: int | None = None) -> int:
    """Bytes from `1073741824`, `512MiB`, `1.5GiB`, `2GB`, or `N%` of `total` (the machine's RAM by default)."""
    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise ValueError(f"{what}: '{text}' is not a percentage in (0, 100]")
        base = total if total is not None else psutil.virtual_memory().total
        return int(base * percent / 100)
    match = _SIZE.match(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{what}: '{text}' is not a size (bytes, or a number with KiB/MiB/GiB/TiB or KB/MB/GB/TB, or N%)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{what}: '{text}' must be more than 0 bytes")
    return size


def parse_memory_budget(values: list[str], gpu_count: int | None = None) -> MemoryBudget:
    """--model-memory-budget, given once or more: a host size (`8GiB`, `50%`) and/or per-device GPU sizes
    (`gpu0:20GiB`, `gpu:*:80%` for every device). `gpu_count` None: GPU forms are refused (no NVML here)."""
    host = 0
    gpus: dict[int, int] = {}
    for raw in values:
        for item in (part for part in raw.split(",") if part.strip()):
            match = re.match(r"^\s*gpu(\*|\d+)?:(.+)$", item)
            if match is None:
                if host:
                    raise ValueError(f"--model-memory-budget: the host budget is given twice ('{item}')")
                host = parse_memory_size(item, "--model-memory-budget")
                continue
            if gpu_count is None or gpu_count == 0:
                raise ValueError(
                    f"--model-memory-budget: '{item}' is a GPU budget, but no GPU is visible through NVML on this machine"
                )
            device = match.group(1) or "*"
            spec = match.group(2)
            if spec.startswith("*:"):
                device, spec = "*", spec[2:]
            indices = range(gpu_count) if device == "*" else [int(device)]
            for index in indices:
                if index >= gpu_count:
                    raise ValueError(f"--model-memory-budget: '{item}' names GPU {index}, but {gpu_count} are visible")
                if spec.strip().endswith("%"):
                    raise ValueError(f"--model-memory-budget: '{item}': give GPU budgets in bytes or MiB/GiB")
                gpus[index] = parse_memory_size(spec, "--model-memory-budget")
    return MemoryBudget(host, gpus)


def parse_group_limit(values: list[str]) -> dict[str, int]:
    """--model-group-limit NAME:N (repeatable): at most N models of group NAME resident at once."""
    limits: dict[str, int] = {}
    for item in values:
        name, _, count = item.rpartition(":")
        if not name or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"--model-group-limit: '{item}' must be NAME:N with N a whole number of at least 1")
        limits[name.strip()] = int(count)
    return limits


def format_bytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
