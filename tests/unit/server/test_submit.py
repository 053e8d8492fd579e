"""Server.submit, the callback entry point that BLS calls use: same answers as Server.infer, errors before
execution raised, execution errors inside the response, and no reference cycles left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.server import Server
from tests.unit.fakes.backend import cyclic_garbage, run_server, use_fake_backend, write_model


@pytest.fixture()
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_backend(monkeypatch)


def _request(model: str, value: float = 1.0) -> InferenceRequest:
    data = np.full((1, 4), value, dtype=np.float32)
    return InferenceRequest(model, "", [InputTensor("IN", "FP32", (1, 4), data)], id="r1")


async def _submit(server: Server, request: InferenceRequest) -> InferenceResponse:
    future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
    assert server.submit(request, future.set_result)
    return await future


def test_submit_answers_through_the_callback(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "add", "add", 2)

    async def body(server: Server) -> tuple[InferenceResponse, int]:
        response = await _submit(server, _request("add", 1.0))
        return response, server.model("add").stats.as_dict()["inference_stats"]["success"]["count"]

    response, successes = run_server(body, tmp_path)
    np.testing.assert_array_equal(response.outputs[0].data, np.full((1, 4), 3.0, np.float32))
    assert response.error is None and successes == 1


def test_submit_raises_before_execution_and_answers_execution_errors(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "fail", "fail")

    async def body(server: Server) -> tuple[InferenceResponse, NereidError, NereidError]:
        response = await _submit(server, _request("fail"))
        with pytest.raises(NereidError) as missing:
            server.submit(_request("nope"), lambda r: None)
        bad = InferenceRequest("fail", "", [InputTensor("IN", "FP32", (1, 3), np.zeros((1, 3), np.float32))])
        with pytest.raises(NereidError) as invalid:
            server.submit(bad, lambda r: None)
        return response, missing.value, invalid.value

    response, missing, invalid = run_server(body, tmp_path)
    assert response.error is not None and response.error.status == Status.INTERNAL and "it broke" in response.error.message
    assert missing.status in (Status.NOT_FOUND, Status.UNAVAILABLE)
    assert invalid.status == Status.INVALID_ARG and "'IN'" in invalid.message


def test_submitted_requests_leave_no_garbage_cycles(tmp_path: Path, fake_backend: None) -> None:
    write_model(tmp_path, "add", "add", 2)

    async def body(server: Server) -> list[str]:
        await _submit(server, _request("add"))
        return await cyclic_garbage(lambda: _submit(server, _request("add")))

    assert run_server(body, tmp_path) == []
