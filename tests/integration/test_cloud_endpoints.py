"""The SageMaker and Vertex AI endpoints as a container starts them: `nereid sagemaker-serve` with the SAGEMAKER_*
variables Triton's `serve` script reads, Vertex AI's AIP_* variables, the start-up checks tritonserver makes,
and the restricted model-repository API on the multi-model routes. (Answers themselves are compared with real
Triton in tests/differential/test_cloud_endpoints.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.servers import ROOT, free_port

_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
"""

_DOUBLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests
        ]
"""

_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}]}


def _model(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(_DOUBLE)


class _Process:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "nereid", *args], stdout=out, stderr=subprocess.STDOUT,
                                            cwd=ROOT, env={**os.environ, **env})  # fmt: skip

    def wait_for(self, url: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                if requests.get(url, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{url} did not answer 200 in {timeout}s:\n{self.log.read_text()}")

    def exit_code(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[_Process]]:
    processes: list[_Process] = []
    yield processes
    for process in processes:
        process.stop()


def _loopback_ports() -> list[str]:
    """The other services on free loopback ports, so a test never listens beyond this machine."""
    return [f"--http-port={free_port()}", f"--grpc-port={free_port()}", f"--metrics-port={free_port()}", "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]  # fmt: skip


def test_sagemaker_serve_serves_the_only_model_of_the_repository(tmp_path: Path, started: list[_Process]) -> None:
    repo = tmp_path / "model"
    _model(repo, "doubler")
    port = free_port()
    process = _Process(["sagemaker-serve", "--model-repository", str(repo), "--sagemaker-address=127.0.0.1"],
                       {"SAGEMAKER_BIND_TO_PORT": str(port), "SAGEMAKER_TRITON_LOG_VERBOSE": "0"}, tmp_path / "log")  # fmt: skip
    started.append(process)
    process.wait_for(f"http://127.0.0.1:{port}/ping")
    answer = requests.post(f"http://127.0.0.1:{port}/invocations", json=_BODY, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_name"] == "doubler" and answer.json()["outputs"][0]["data"] == [3.0, 4.0]
    assert f"Started Sagemaker HTTPService at 127.0.0.1:{port}" in process.log.read_text()
    assert "Started HTTPService" not in process.log.read_text()  # the script turns HTTP, gRPC and metrics off


def test_sagemaker_serve_refuses_a_repository_with_two_models_and_no_default(tmp_path: Path) -> None:
    repo = tmp_path / "model"
    _model(repo, "a")
    _model(repo, "b")
    process = _Process(["sagemaker-serve", "--model-repository", str(repo)], {}, tmp_path / "log")
    assert process.exit_code() == 1
    assert "More than 1 model directory found in model repository" in process.log.read_text()


def test_sagemaker_ping_follows_the_ping_mode(tmp_path: Path, started: list[_Process]) -> None:
    repo = tmp_path / "repo"
    _model(repo, "doubler")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such_backend"\n')
    ports = {"ready": free_port(), "live": free_port()}
    for mode, port in ports.items():
        process = _Process(["serve", "--model-repository", str(repo), "--allow-sagemaker", f"--sagemaker-port={port}",
                            "--sagemaker-address=127.0.0.1", "--exit-on-error=false", *_loopback_ports()],
                           {"SAGEMAKER_TRITON_PING_MODE": mode}, tmp_path / f"{mode}.log")  # fmt: skip
        started.append(process)
    started[1].wait_for(f"http://127.0.0.1:{ports['live']}/ping")  # live: the server runs
    # ready (the default): a model failed to load, so with --strict-readiness the server is not ready
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            assert requests.get(f"http://127.0.0.1:{ports['ready']}/ping", timeout=1).status_code == 400
            break
        except requests.ConnectionError:
            time.sleep(0.1)
    else:
        raise AssertionError(started[0].log.read_text())


def test_vertex_ai_without_a_default_model_fails_to_start_as_triton_does(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _model(repo, "a")
    _model(repo, "b")
    process = _Process(["serve", "--model-repository", str(repo), "--allow-vertex-ai", f"--vertex-ai-port={free_port()}",
                        "--vertex-ai-address=127.0.0.1", *_loopback_ports()],
                       {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}, tmp_path / "log")  # fmt: skip
    assert process.exit_code() == 1
    assert (
        "failed to start Vertex AI service: Invalid argument - Expect the model repository contains only a single "
        "model if default model is not specified" in process.log.read_text()
    )


def test_inside_vertex_ai_the_aip_variables_configure_the_server(tmp_path: Path, started: list[_Process]) -> None:
    repo = tmp_path / "gcs"
    _model(repo, "doubler")
    port, http_port = free_port(), free_port()
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_STORAGE_URI": str(repo),
           "AIP_PREDICT_ROUTE": "/v1/endpoints/123/deployedModels/456:predict", "AIP_HEALTH_ROUTE": "/health"}  # fmt: skip
    process = _Process(["serve", "--vertex-ai-address=127.0.0.1", f"--http-port={http_port}", f"--metrics-port={free_port()}",
                        "--metrics-address=127.0.0.1"], env, tmp_path / "log")  # fmt: skip
    started.append(process)
    process.wait_for(f"http://127.0.0.1:{port}/health")
    answer = requests.post(f"http://127.0.0.1:{port}/v1/endpoints/123/deployedModels/456:predict", json=_BODY, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_name"] == "doubler" and answer.json()["outputs"][0]["data"] == [3.0, 4.0]
    with pytest.raises(requests.ConnectionError):  # AIP_MODE=PREDICTION turns the HTTP port off
        requests.get(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=2)


def test_restricted_model_repository_api_covers_the_multi_model_routes(tmp_path: Path, started: list[_Process]) -> None:
    repo = tmp_path / "repo"
    _model(repo, "doubler")
    archive = tmp_path / "archive"
    _model(archive, "packaged")
    port = free_port()
    process = _Process(["serve", "--model-repository", str(repo), "--model-control-mode=explicit", "--allow-sagemaker",
                        f"--sagemaker-port={port}", "--sagemaker-address=127.0.0.1",
                        "--http-restricted-api=model-repository:admin-key=secret", *_loopback_ports()], {}, tmp_path / "log")  # fmt: skip
    started.append(process)
    process.wait_for(f"http://127.0.0.1:{port}/ping")
    base = f"http://127.0.0.1:{port}"
    load = {"model_name": "m", "url": str(archive)}
    denied = requests.post(base + "/models", json=load, timeout=30)
    assert denied.status_code == 403 and "This API is restricted, expecting header 'admin-key'" in denied.text
    assert requests.get(base + "/models", timeout=30).status_code == 403
    allowed = requests.post(base + "/models", json=load, headers={"admin-key": "secret"}, timeout=60)
    assert allowed.status_code == 200, allowed.text
    invoked = requests.post(base + "/models/m/invoke", json=_BODY, timeout=30)  # inference is not restricted here
    assert invoked.status_code == 200 and invoked.json()["outputs"][0]["data"] == [3.0, 4.0]
    assert requests.delete(base + "/models/m", timeout=60).status_code == 403
    assert requests.delete(base + "/models/m", headers={"admin-key": "secret"}, timeout=60).status_code == 200


# -- the requests Triton's QA sends (L0_sagemaker/sagemaker_test.py, L0_vertex_ai), against Nereid alone ------
_SM_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
_VX_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
_EXPECTED = {"model_name": "doubler", "model_version": "1",
             "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 2], "data": [3.0, 4.0]}]}  # fmt: skip


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("cloud_nereid")
    _model(root / "repo", "doubler")
    _model(root / "repo", "other")
    sagemaker, vertex = free_port(), free_port()
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "doubler", "AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}
    process = _Process(["serve", "--model-repository", str(root / "repo"), "--allow-sagemaker", f"--sagemaker-port={sagemaker}",
                        "--sagemaker-address=127.0.0.1", "--allow-vertex-ai", f"--vertex-ai-port={vertex}",
                        "--vertex-ai-address=127.0.0.1", "--vertex-ai-default-model=doubler", *_loopback_ports()],
                       env, root / "log")  # fmt: skip
    try:
        process.wait_for(f"http://127.0.0.1:{sagemaker}/ping")
        process.wait_for(f"http://127.0.0.1:{vertex}/health")
        yield {"invocations": f"http://127.0.0.1:{sagemaker}/invocations", "predict": f"http://127.0.0.1:{vertex}/predict"}
    finally:
        process.stop()


def _client_body(binary_input: bool, binary_output: bool) -> tuple[bytes, int | None]:
    infer_input = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    infer_input.set_data_from_numpy(np.array([[1.5, 2.0]], dtype=np.float32), binary_data=binary_input)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)
    return httpclient.InferenceServerClient.generate_request_body([infer_input], outputs=[output])


@pytest.mark.parametrize("endpoint", ["invocations", "predict"])
def test_json_inference_returns_the_models_answer(cloud: dict[str, str], endpoint: str) -> None:
    answer = requests.post(cloud[endpoint], json=_BODY, headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == _EXPECTED


@pytest.mark.parametrize(("endpoint", "mime"), [("invocations", _SM_MIME), ("predict", _VX_MIME)])
def test_tritonclient_binary_request_and_response(cloud: dict[str, str], endpoint: str, mime: str) -> None:
    body, json_size = _client_body(binary_input=True, binary_output=True)
    answer = requests.post(cloud[endpoint], data=body, headers={"Content-Type": f"{mime}{json_size}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    if endpoint == "invocations":  # SageMaker names the JSON size in its own MIME type
        length = int(answer.headers["content-type"][len(_SM_MIME):])
    else:  # Vertex AI answers as the HTTP port does
        assert answer.headers["content-type"] == "application/octet-stream"
        length = int(answer.headers["inference-header-content-length"])
    result = httpclient.InferenceServerClient.parse_response_body(answer.content, header_length=length)
    assert result.as_numpy("OUTPUT0").tolist() == [[3.0, 4.0]]


@pytest.mark.parametrize(
    "content_type",
    [f"additional-string/{_SM_MIME}{{n}}", f"{_SM_MIME}additional-string{{n}}", f"{_SM_MIME}-123", f"{_SM_MIME}12345"],
    ids=["not at the start", "not a number", "negative", "beyond the body"],
)
def test_malformed_binary_header_is_a_400(cloud: dict[str, str], content_type: str) -> None:
    body, json_size = _client_body(binary_input=True, binary_output=False)
    answer = requests.post(cloud["invocations"], data=body, headers={"Content-Type": content_type.format(n=json_size)}, timeout=30)
    assert answer.status_code == 400


def test_vertex_ai_redirect_header_reaches_another_model(cloud: dict[str, str]) -> None:
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/other/infer"}
    answer = requests.post(cloud["predict"], json=_BODY, headers=redirect, timeout=30)
    assert answer.status_code == 200 and answer.json()["model_name"] == "other"
    ready = requests.post(cloud["predict"], headers={"X-Vertex-Ai-Triton-Redirect": "v2/models/other/ready"}, timeout=30)
    assert ready.status_code == 200
    assert requests.get(cloud["predict"], headers=redirect, timeout=30).status_code == 405
    assert requests.post(cloud["predict"], headers={"X-Vertex-Ai-Triton-Redirect": "v2/logging"}, timeout=30).status_code == 400


@pytest.mark.parametrize("inference_type", ["generate", "generate_stream"])
def test_sagemaker_inference_type_makes_invocations_the_generate_extension(tmp_path: Path, started: list[_Process], inference_type: str) -> None:
    repo = tmp_path / "repo"
    _model(repo, "doubler")
    port = free_port()
    process = _Process(["serve", "--model-repository", str(repo), "--allow-sagemaker", f"--sagemaker-port={port}",
                        "--sagemaker-address=127.0.0.1", *_loopback_ports()],
                       {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "doubler", "SAGEMAKER_TRITON_INFERENCE_TYPE": inference_type},
                       tmp_path / "log")  # fmt: skip
    started.append(process)
    process.wait_for(f"http://127.0.0.1:{port}/ping")
    answer = requests.post(f"http://127.0.0.1:{port}/invocations", json={"INPUT0": [1.5, 2.0]}, timeout=30)
    assert answer.status_code == 200, answer.text
    if inference_type == "generate":
        assert answer.json() == {"model_name": "doubler", "model_version": "1", "OUTPUT0": [3.0, 4.0]}
    else:
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.text.startswith("data: ") and '"OUTPUT0":[3.0,4.0]' in answer.text


def test_an_unknown_sagemaker_inference_type_is_refused(tmp_path: Path) -> None:
    process = _Process(["serve", "--model-repository", str(tmp_path), "--allow-sagemaker"],
                       {"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"}, tmp_path / "log")  # fmt: skip
    assert process.exit_code() == 2
    assert "SAGEMAKER_TRITON_INFERENCE_TYPE 'predict' is invalid. Must be one of: infer, generate, generate_stream." in process.log.read_text()
