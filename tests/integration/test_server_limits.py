"""Server-wide limits through the official clients: a bounded number of inference requests in flight (503 /
UNAVAILABLE at once past it), the server's default deadline for unary requests, and client shared memory off
unless --allow-client-shm (Triton's words and status codes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.gate_model import GATE_BODY, gate_repository
from tests.integration.orchestration_models import metric_value
from tests.servers import RunningServer, start_nereid


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    repo, gate, _ = gate_repository(tmp_path_factory.mktemp("inflight"))
    running = start_nereid(repo, "--max-inflight-requests=2", log_dir=repo.parent)
    yield running, gate
    gate.touch()
    assert running.stop() == 0, running.log()


def _infer(server: RunningServer) -> requests.Response:
    return requests.post(f"{server.base}/v2/models/gate/infer", json=GATE_BODY, timeout=60)


def _grpc_infer(server: RunningServer, timeout: float = 60) -> None:
    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("gate", [tensor], client_timeout=timeout)


def _grpc_refusal(server: RunningServer) -> InferenceServerException:
    """A gRPC request's error while the places are held. One that slips into a place an HTTP probe has just given
    back waits behind the gate until its client gives up (which gives the place back again), and is tried again."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the limit never refused a gRPC request"
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as excinfo:
            _grpc_infer(server, timeout=2)
        if excinfo.value.status() != "StatusCode.DEADLINE_EXCEEDED":
            assert time.monotonic() - started < 2  # refused at once, not queued
            return excinfo.value


def test_requests_past_the_inflight_limit_are_refused_at_once(bounded: tuple[RunningServer, Path]) -> None:
    server, gate = bounded
    held: list[int] = []
    threads = [threading.Thread(target=lambda: held.append(_infer(server).status_code)) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Both places are taken once one request runs (the model holds it until the gate opens) and the other waits
    # behind it: one pending request.
    deadline = time.monotonic() + 60
    while metric_value(server.metrics_port, "nv_inference_pending_request_count", model="gate") != 1:
        assert time.monotonic() < deadline, "the two held requests never reached the model"
        time.sleep(0.05)
    started = time.monotonic()
    answer = requests.post(f"{server.base}/v2/models/gate/infer", json=GATE_BODY, timeout=10)
    assert answer.status_code == 503, answer.text
    assert time.monotonic() - started < 2  # not queued behind the held requests (they wait up to 60 s)
    assert "--max-inflight-requests" in answer.json()["error"]
    refusal = _grpc_refusal(server)
    assert refusal.status() == "StatusCode.UNAVAILABLE" and "--max-inflight-requests" in str(refusal)
    # Health and metadata are not inference: they are served while the limit is reached.
    assert requests.get(f"{server.base}/v2/health/ready", timeout=10).status_code == 200
    gate.touch()
    for thread in threads:
        thread.join(60)
    assert held == [200, 200]
    assert _infer(server).status_code == 200  # the places were given back
    _grpc_infer(server)


def test_client_shared_memory_is_off_without_the_flag(bounded: tuple[RunningServer, Path]) -> None:
    server, _ = bounded
    disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    with httpclient.InferenceServerClient(server.http_url) as http:
        for attempt in (lambda: http.register_system_shared_memory("r", "/r", 8), lambda: http.unregister_system_shared_memory("r")):
            with pytest.raises(InferenceServerException) as excinfo:
                attempt()
            assert disabled in str(excinfo.value)
        assert http.get_system_shared_memory_status() == []
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        for attempt in (lambda: grpc.register_system_shared_memory("r", "/r", 8), lambda: grpc.unregister_cuda_shared_memory("r")):
            with pytest.raises(InferenceServerException) as excinfo:
                attempt()
            assert disabled in str(excinfo.value) and excinfo.value.status() == "StatusCode.UNIMPLEMENTED"
        assert list(grpc.get_system_shared_memory_status().regions) == []


def test_a_request_past_the_default_deadline_ends_with_unavailable(tmp_path: Path) -> None:
    repo, gate, _ = gate_repository(tmp_path)
    server = start_nereid(repo, "--default-request-timeout-secs=1", log_dir=tmp_path)
    try:
        started = time.monotonic()
        answer = _infer(server)
        assert answer.status_code == 503 and "Request timeout expired" in answer.json()["error"]
        assert time.monotonic() - started < 30  # the model would have held it 60 s
        with pytest.raises(InferenceServerException) as excinfo:
            _grpc_infer(server)
        assert excinfo.value.status() == "StatusCode.UNAVAILABLE" and "Request timeout expired" in str(excinfo.value)
        # A stream that has not started by the deadline ends too (one that streams is not cut short).
        stream = requests.post(f"{server.base}/v2/models/gate/generate_stream", json={"INPUT0": [1.0, 2.0]}, timeout=30)
        assert stream.status_code == 503 and "Request timeout expired" in stream.json()["error"]
        gate.touch()
        assert _infer(server).status_code == 200  # still serving
    finally:
        gate.touch()
        assert server.stop() == 0, server.log()


def _stream_results(server: RunningServer, ids: list[str], until: int, after_first: Any = None) -> dict[str, Any]:
    """Send requests `ids` on one ModelStreamInfer stream; what came back for each (a result or an error), once
    `until` answers arrived. `after_first` runs once the first answer arrived."""
    answers: dict[str, Any] = {}
    lock = threading.Condition()

    def callback(result: Any, error: Any) -> None:
        with lock:
            if error is not None:
                answers[error.message().rpartition("id: ")[2] or f"error{len(answers)}"] = error
            else:
                answers[result.get_response().id] = result
            lock.notify_all()

    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=callback)
        for request_id in ids:
            client.async_stream_infer("gate", [tensor], request_id=request_id)
        deadline = time.monotonic() + 60
        with lock:
            while len(answers) < until:
                assert time.monotonic() < deadline, answers
                lock.wait(0.1)
                if after_first is not None and answers:
                    after_first()
                    after_first = None
        client.stop_stream()
    return answers


def test_each_request_on_a_stream_counts_against_the_inflight_limit(tmp_path: Path) -> None:
    repo, gate, _ = gate_repository(tmp_path)
    server = start_nereid(repo, "--max-inflight-requests=2", log_dir=tmp_path)
    try:
        # The first two hold both places behind the gate; the third is refused at once, on the same stream.
        answers = _stream_results(server, ["r0", "r1", "r2"], until=3, after_first=gate.touch)
        errors = [a for a in answers.values() if isinstance(a, InferenceServerException)]
        assert len(errors) == 1 and "--max-inflight-requests" in str(errors[0]), answers
        assert len(answers) == 3 and sum(not isinstance(a, InferenceServerException) for a in answers.values()) == 2
        _grpc_infer(server)  # the places were given back
    finally:
        gate.touch()
        assert server.stop() == 0, server.log()


def test_a_stream_request_without_a_response_by_the_default_deadline_is_ended(tmp_path: Path) -> None:
    repo, gate, _ = gate_repository(tmp_path)
    server = start_nereid(repo, "--default-request-timeout-secs=1", log_dir=tmp_path)
    try:
        started = time.monotonic()
        answers = _stream_results(server, ["late"], until=1)
        (error,) = answers.values()
        assert isinstance(error, InferenceServerException) and "Request timeout expired" in str(error), answers
        assert time.monotonic() - started < 30  # the model would have held it 60 s
        gate.touch()
        answers = _stream_results(server, ["r1"], until=1)
        assert not isinstance(answers["r1"], InferenceServerException)  # still serving streams
    finally:
        gate.touch()
        assert server.stop() == 0, server.log()
