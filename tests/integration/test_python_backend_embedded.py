"""Two embedded Servers in one process, each serving the same Python model from a repository of its own: each has
its own worker processes and reports only its own models' custom metric families, and stopping one leaves the
other serving."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np

from nereid.core.settings import ServerSettings
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.server import Server

MODEL = Path(__file__).resolve().parents[1] / "models" / "python" / "custom_metrics"


def _request(value: float) -> InferenceRequest:
    return InferenceRequest("custom_metrics", "", [InputTensor("VALUE", "FP32", (1,), np.array([value], np.float32))])


async def _infer(server: Server, value: float) -> InferenceResponse:
    return await server.infer(_request(value))


def _requests_seen(server: Server) -> list[float]:
    return [
        sample.value
        for family in server.custom_metric_families()
        if family.name == "custom_requests_seen"
        for sample in family.samples
    ]


def test_two_embedded_servers_keep_their_workers_and_custom_metrics_apart(tmp_path: Path) -> None:
    async def main() -> None:
        servers = []
        for name in ("a", "b"):
            shutil.copytree(MODEL, tmp_path / name / "custom_metrics", ignore=shutil.ignore_patterns("__pycache__"))
            servers.append(Server(ServerSettings(model_repositories=[tmp_path / name])))
        first, second = servers
        running = []
        try:
            for server in servers:
                await server.start()
                running.append(server)
            for value in (1.0, 2.0, 3.0):
                await _infer(first, value)
            answer = await _infer(second, 7.0)
            assert answer.outputs[0].data.tolist() == [1.0]  # the second server's model counted only its request
            assert _requests_seen(first) == [3.0] and _requests_seen(second) == [1.0]
            first_pids = {i.pid for i in first.model("custom_metrics").instances}  # type: ignore[attr-defined]
            second_pids = {i.pid for i in second.model("custom_metrics").instances}  # type: ignore[attr-defined]
            assert first_pids and second_pids and not first_pids & second_pids
            running.remove(first)
            await first.stop()
            answer = await _infer(second, 8.0)  # the first server's end took nothing of the second's
            assert answer.outputs[0].data.tolist() == [2.0]
            assert _requests_seen(second) == [2.0]
        finally:
            for server in running:
                await server.stop()

    asyncio.run(asyncio.wait_for(main(), 120))
