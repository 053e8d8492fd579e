"""The monitor inside a real in-process Server: sampled requests reach drift windows, data-quality counts and the
payload log; the sampling stays within its rate; monitoring off touches nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from nereid.core.settings import ServerSettings
from nereid.core.types import InferenceRequest, InputTensor
from nereid.server import Server
from tests.unit.rollouts.versioned_backend import versioned_repository

T = TypeVar("T")


def _run(root: Path, body: Callable[[Server], Awaitable[T]], **settings: object) -> T:
    async def main() -> T:
        server = Server(ServerSettings(model_repositories=[root], exit_on_error=False, **settings))  # type: ignore[arg-type]
        await server.start()
        try:
            return await body(server)
        finally:
            await server.stop()

    return asyncio.run(main())


def _request(value: float, version: str = "1") -> InferenceRequest:
    data = np.full((1, 1), value, np.float32)
    return InferenceRequest("m", version, [InputTensor("IN", "FP32", (1, 1), data)], id=f"r{value}")


async def _settle(server: Server, until: Callable[[], bool]) -> None:
    for _ in range(1500):  # the monitor's thread works beside the loop; its snapshot refreshes every second
        if until():
            return
        await asyncio.sleep(0.01)


def test_sampled_requests_build_a_reference_then_a_shift_shows_as_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = versioned_repository(tmp_path, monkeypatch)
    rng = np.random.default_rng(0)

    async def body(server: Server) -> tuple[str, float | None, dict[tuple[str, str], int]]:
        for value in rng.normal(0, 1, 100):
            await server.infer(_request(float(value)))
        monitor = server.monitor
        await _settle(server, lambda: monitor.versions.get(("m", "1")) is not None and bool(monitor.versions[("m", "1")].profiles))
        for value in rng.normal(3, 1, 200):
            await server.infer(_request(float(value)))
            await asyncio.sleep(0)  # a client's pace: the monitor's queue is never the bottleneck here
        await server.infer(_request(float("nan")))
        await _settle(server, lambda: (monitor.input_drift("m", "1") or 0) > 0.25 and ("in:IN", "nan") in monitor.versions[("m", "1")].quality)
        version = monitor.versions[("m", "1")]
        return version.reference_source, monitor.input_drift("m", "1"), version.quality

    source, drift, quality = _run(root, body, monitoring_reference_requests=100, monitoring_samples_per_second=1_000_000)
    assert source == "the first 100 sampled requests"
    assert drift is not None and drift > 0.25
    assert quality[("in:IN", "nan")] == 1 and quality[("in:IN", "out_of_range")] > 0


def test_a_reference_file_in_the_version_folder_is_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = versioned_repository(tmp_path, monkeypatch)
    np.savez(root / "m" / "1" / "reference.npz", IN=np.linspace(0, 1, 500, dtype=np.float32).reshape(-1, 1),
             **{"output:OUT": np.linspace(1, 2, 500, dtype=np.float32).reshape(-1, 1)})  # fmt: skip

    async def body(server: Server) -> tuple[str, set[str]]:
        await server.infer(_request(0.5))
        # The monitor's thread reads the file beside the loop: wait until its profiles are in (or 15 s pass).
        await _settle(server, lambda: bool((v := server.monitor.versions.get(("m", "1"))) and v.profiles))
        version = server.monitor.versions[("m", "1")]
        return version.reference_source, set(version.profiles)

    source, profiled = _run(root, body)
    assert source.endswith("reference.npz") and profiled == {"in:IN", "out:OUT"}


def test_the_payload_log_holds_the_sampled_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = versioned_repository(tmp_path, monkeypatch)
    logs = tmp_path / "payloads"

    async def body(server: Server) -> None:
        for i in range(20):
            await server.infer(_request(float(i), version="2"))
        await _settle(server, lambda: server.monitor.payload is not None and server.monitor.payload.written >= 20)

    _run(root, body, payload_log_dir=str(logs), monitoring_samples_per_second=1_000_000)
    records = [json.loads(line) for line in (logs / "payload.jsonl").read_text().splitlines()]
    assert len(records) == 20 and {r["version"] for r in records} == {"2"}
    assert records[3]["inputs"]["IN"]["data"] == [3.0] and records[3]["outputs"]["OUT"]["data"] == [5.0]


def test_monitoring_off_samples_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = versioned_repository(tmp_path, monkeypatch)

    async def body(server: Server) -> tuple[bool, int]:
        for i in range(10):
            await server.infer(_request(float(i)))
        return server.monitor.active, server.monitor.sampled

    assert _run(root, body, monitoring_samples_per_second=0) == (False, 0)
