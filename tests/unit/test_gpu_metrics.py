"""The GPU metric families read through NVML, with a stand-in pynvml: Triton's names, and the energy counter that
counts from the server's start."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from nereid import metrics


class _NvmlError(Exception):
    pass


class _FakeNvml:
    """Two devices; the second has no energy counter (as GPUs before Volta)."""

    NVMLError = _NvmlError

    def __init__(self) -> None:
        self.energy_mj = 1_000_000

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's names
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # noqa: N802
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(used=1024, total=4096)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=25)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        return 150_000

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:  # noqa: N802
        return 300_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        if handle == 1:
            raise _NvmlError("Not Supported")
        return self.energy_mj


def test_energy_counts_joules_from_the_servers_start_and_devices_without_a_counter_have_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _FakeNvml()
    monkeypatch.setattr(metrics, "_nvml", nvml)
    start = metrics._energy_readings()
    assert start == {"GPU-0": 1_000_000}
    nvml.energy_mj += 4_500  # 4.5 J used since the start
    samples = {(m.name, s.labels["gpu_uuid"]): (m.type, s.value) for m in metrics._gpu_metrics(start) for s in m.samples}
    assert samples[("nv_energy_consumption", "GPU-0")] == ("counter", 4.5)
    assert ("nv_energy_consumption", "GPU-1") not in samples
    assert samples[("nv_gpu_utilization", "GPU-1")] == ("gauge", 0.25)
    assert samples[("nv_gpu_power_usage", "GPU-0")] == ("gauge", 150.0)
    assert {name for name, _ in samples} >= {"nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_limit"}


def test_the_energy_counter_is_written_with_tritons_name_and_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_nvml", _FakeNvml())

    class _Collector:
        def collect(self) -> Any:
            return metrics._gpu_metrics({"GPU-0": 999_000})

    registry = CollectorRegistry()
    registry.register(_Collector())  # type: ignore[arg-type]
    text = metrics.render(registry).decode()
    assert "# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started" in text
    assert "# TYPE nv_energy_consumption counter" in text
    assert 'nv_energy_consumption{gpu_uuid="GPU-0"} 1' in text
