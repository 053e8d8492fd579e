"""Differential tests of the SageMaker and Vertex AI endpoints: Nereid and real Triton 2.51 (built with both)
get the same requests, as Triton's QA (L0_sagemaker, L0_vertex_ai) sends them with `requests` and tritonclient's
body helpers, and must give the same status, Content-Type and body.

Real Triton listens for SageMaker and Vertex AI on 0.0.0.0 whatever its flags say (it has no address flag for
them); Nereid is bound to loopback with its --sagemaker-address / --vertex-ai-address."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.servers import RunningServer, free_port, start_nereid, start_real_triton

pytestmark = pytest.mark.differential

_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if float(a.reshape(-1)[0]) == -2:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("CUDA out of memory (pretend)")))
                continue
            if float(a.reshape(-1)[0]) < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

_ENSEMBLE_CONFIG = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "inner"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
      output_map { key: "OUTPUT1" value: "OUTPUT1" }
    }
  ]
}
"""

_MIME_SM = "application/vnd.sagemaker-triton.binary+json;json-header-size="
_MIME_VX = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
_REDIRECT = "X-Vertex-Ai-Triton-Redirect"


def _model(folder: Path, name: str) -> None:
    (folder / name / "1").mkdir(parents=True)
    (folder / name / "config.pbtxt").write_text(_CONFIG.format(name=name))
    (folder / name / "1" / "model.py").write_text(_ADD_SUB)


def _body(first: list[float], output_binary: bool | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": first},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]},
        ]
    }
    if output_binary is not None:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": output_binary}}]
    return body


def _binary_body(values: list[float]) -> tuple[bytes, int]:
    """A binary request body built as Triton's QA builds it, with tritonclient's helper."""
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([values], dtype=np.float32), binary_data=True)
    inputs[1].set_data_from_numpy(np.ones((1, 4), dtype=np.float32), binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True), httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body, int(json_size)


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: Any  # parsed JSON where the body is JSON, else the bytes


def _answer(response: requests.Response) -> Answer:
    try:
        body: Any = json.loads(response.content) if response.content else b""
    except (ValueError, UnicodeDecodeError):
        body = response.content
    return Answer(response.status_code, response.headers.get("content-type", ""), body)


@dataclass
class Endpoints:
    triton: RunningServer
    nereid: RunningServer
    ports: dict[str, dict[str, int]]  # server -> {"sagemaker": port, "vertex": port}

    def ask(self, endpoint: str, method: str, path: str, **kwargs: Any) -> tuple[Answer, Answer]:
        answers = []
        for name in ("triton", "nereid"):
            url = f"http://127.0.0.1:{self.ports[name][endpoint]}{path}"
            answers.append(_answer(requests.request(method, url, timeout=60, **kwargs)))
        return answers[0], answers[1]


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    root = tmp_path_factory.mktemp("cloud")
    repo = root / "repo"
    for name in ("add_sub", "add_sub2"):
        _model(repo, name)
    archive = root / "archive" / "model"  # a SageMaker model archive: one model folder inside
    _model(archive, "packaged")
    ensemble_archive = root / "ensemble_archive" / "model"  # an ensemble and the model it runs
    _model(ensemble_archive, "inner")
    (ensemble_archive / "pipeline" / "1").mkdir(parents=True)
    (ensemble_archive / "pipeline" / "config.pbtxt").write_text(_ENSEMBLE_CONFIG)
    environment = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub", "AIP_PREDICT_ROUTE": "/predict",
                   "AIP_HEALTH_ROUTE": "/health"}  # fmt: skip
    ports = {name: {"sagemaker": free_port(), "vertex": free_port()} for name in ("triton", "nereid")}
    common = ["--model-control-mode=explicit", "--load-model=add_sub", "--load-model=add_sub2", "--allow-sagemaker=true",
              "--allow-vertex-ai=true", "--vertex-ai-default-model=add_sub"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        triton = start_real_triton(repo, *common, f"--sagemaker-port={ports['triton']['sagemaker']}",
                                   f"--vertex-ai-port={ports['triton']['vertex']}")  # fmt: skip
        try:
            nereid = start_nereid(repo, *common, f"--sagemaker-port={ports['nereid']['sagemaker']}",
                                  f"--vertex-ai-port={ports['nereid']['vertex']}", "--sagemaker-address=127.0.0.1",
                                  "--vertex-ai-address=127.0.0.1")  # fmt: skip
        except BaseException:
            triton.stop()
            raise
    pair = Endpoints(triton, nereid, ports)
    pair.archive = archive  # type: ignore[attr-defined]
    pair.ensemble_archive = ensemble_archive  # type: ignore[attr-defined]
    try:
        yield pair
    finally:
        nereid.stop()
        triton.stop()


_SAGEMAKER_CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("ping", "GET", "/ping", {}),
    ("ping with POST", "POST", "/ping", {}),
    ("invocations", "POST", "/invocations", {"json": _body([1, 2, 3, 4])}),
    ("invocations with a binary output", "POST", "/invocations", {"json": _body([1, 2, 3, 4], output_binary=True)}),
    ("invocations with GET", "GET", "/invocations", {}),
    ("invocations with a trailing slash", "POST", "/invocations/", {"json": _body([1, 2, 3, 4])}),
    ("invocations with a bad shape", "POST", "/invocations",
     {"json": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                          {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}}),
    ("invocations that the model fails", "POST", "/invocations", {"json": _body([-1, 2, 3, 4])}),
    ("a binary MIME type not at the start", "POST", "/invocations",
     {"data": b"{}", "headers": {"content-type": "text/x; " + _MIME_SM + "2"}}),
    ("a JSON header size beyond the body", "POST", "/invocations", {"data": b"{}", "headers": {"content-type": _MIME_SM + "99"}}),
    ("a negative JSON header size", "POST", "/invocations", {"data": b"{}", "headers": {"content-type": _MIME_SM + "-1"}}),
    ("an unknown path", "GET", "/v2/health/ready", {}),
    ("models, none loaded", "GET", "/models", {}),
    ("an unknown model", "GET", "/models/nothing", {}),
    ("invoke of an unknown model", "POST", "/models/nothing/invoke", {"json": _body([1, 2, 3, 4])}),
    ("unload of an unknown model", "DELETE", "/models/nothing", {}),
    ("PUT on a model", "PUT", "/models/nothing", {}),
    ("load without a url", "POST", "/models", {"json": {"model_name": "x"}}),
    ("load from a folder that is not there", "POST", "/models", {"json": {"model_name": "x", "url": "/nonexistent/model"}}),
]  # fmt: skip


@pytest.mark.parametrize(("label", "method", "path", "kwargs"), _SAGEMAKER_CASES, ids=[case[0] for case in _SAGEMAKER_CASES])
def test_sagemaker_answers_as_triton_does(endpoints: Endpoints, label: str, method: str, path: str, kwargs: dict[str, Any]) -> None:
    triton, nereid = endpoints.ask("sagemaker", method, path, **kwargs)
    assert nereid == triton, label


def test_sagemaker_and_vertex_ai_answers_are_not_compressed(endpoints: Endpoints) -> None:
    for endpoint, path in (("sagemaker", "/invocations"), ("vertex", "/predict")):
        for name in ("triton", "nereid"):
            url = f"http://127.0.0.1:{endpoints.ports[name][endpoint]}{path}"
            answer = requests.post(url, json=_body([1, 2, 3, 4]), headers={"Accept-Encoding": "gzip"}, timeout=60)
            assert answer.status_code == 200 and "content-encoding" not in answer.headers, (name, endpoint)


def test_sagemaker_binary_request_and_response_as_tritons_qa_sends_them(endpoints: Endpoints) -> None:
    body, json_size = _binary_body([1, 2, 3, 4])
    headers = {"Content-Type": _MIME_SM + str(json_size)}
    triton, nereid = endpoints.ask("sagemaker", "POST", "/invocations", data=body, headers=headers)
    assert nereid == triton
    assert nereid.content_type.startswith(_MIME_SM)
    result = httpclient.InferenceServerClient.parse_response_body(nereid.body, header_length=int(nereid.content_type[len(_MIME_SM):]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2, 3, 4, 5]])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [[0, 1, 2, 3]])


def test_sagemaker_multi_model_endpoint_loads_invokes_and_unloads_as_triton_does(endpoints: Endpoints) -> None:
    url = str(endpoints.archive)  # type: ignore[attr-defined]
    steps: list[tuple[str, str, str, dict[str, Any]]] = [
        ("load", "POST", "/models", {"json": {"model_name": "mme", "url": url}}),
        ("load again", "POST", "/models", {"json": {"model_name": "mme", "url": url}}),
        ("load the same folder under another name", "POST", "/models", {"json": {"model_name": "other", "url": url}}),
        ("list", "GET", "/models", {}),
        ("describe", "GET", "/models/mme", {}),
        ("invoke", "POST", "/models/mme/invoke", {"json": _body([1, 2, 3, 4])}),
        ("invoke with a binary output", "POST", "/models/mme/invoke", {"json": _body([5, 6, 7, 8], output_binary=True)}),
        ("invoke that the model fails", "POST", "/models/mme/invoke", {"json": _body([-1, 2, 3, 4])}),
        ("invoke that runs out of memory", "POST", "/models/mme/invoke", {"json": _body([-2, 2, 3, 4])}),
        ("invoke naming an unknown target model", "POST", "/models/mme/invoke",
         {"json": _body([1, 2, 3, 4]), "headers": {"X-Amzn-SageMaker-Target-Model": "nothing"}}),
        ("unload", "DELETE", "/models/mme", {}),
        ("list after unload", "GET", "/models", {}),
        ("invoke after unload", "POST", "/models/mme/invoke", {"json": _body([1, 2, 3, 4])}),
    ]  # fmt: skip
    for label, method, path, kwargs in steps:
        triton, nereid = endpoints.ask("sagemaker", method, path, **kwargs)
        assert nereid == triton, label
        if label == "invoke":
            assert nereid.status == 200 and nereid.body["model_name"] == "mme"
        if label == "invoke that runs out of memory":
            assert nereid.status == 507  # SageMaker's cue to place the model on another instance


_VERTEX_CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("health", "GET", "/health", {}),
    ("health with POST", "POST", "/health", {}),
    ("predict on the default model", "POST", "/predict", {"json": _body([1, 2, 3, 4])}),
    ("predict with GET", "GET", "/predict", {}),
    ("predict that the model fails", "POST", "/predict", {"json": _body([-1, 2, 3, 4])}),
    ("a v2 path is not served", "POST", "/v2/models/add_sub/infer", {"json": _body([1, 2, 3, 4])}),
    ("an unknown path", "GET", "/other", {}),
    ("redirect to another model's infer", "POST", "/predict", {"json": _body([1, 2, 3, 4]), "headers": {_REDIRECT: "v2/models/add_sub2/infer"}}),
    ("redirect to a version's infer", "POST", "/predict",
     {"json": _body([1, 2, 3, 4]), "headers": {_REDIRECT: "v2/models/add_sub2/versions/1/infer"}}),
    ("redirect to an unknown model", "POST", "/predict", {"json": _body([1, 2, 3, 4]), "headers": {_REDIRECT: "v2/models/nope/infer"}}),
    ("redirect with GET", "GET", "/predict", {"headers": {_REDIRECT: "v2/models/add_sub2/infer"}}),
    ("redirect to health", "POST", "/predict", {"headers": {_REDIRECT: "v2/health/ready"}}),
    ("redirect to model readiness", "POST", "/predict", {"headers": {_REDIRECT: "v2/models/add_sub/ready"}}),
    ("redirect to model metadata", "POST", "/predict", {"headers": {_REDIRECT: "v2/models/add_sub2"}}),
    ("redirect to shared-memory status", "POST", "/predict", {"headers": {_REDIRECT: "v2/systemsharedmemory/status"}}),
    ("redirect to a route it does not serve", "POST", "/predict", {"headers": {_REDIRECT: "v2/logging"}}),
    ("redirect with a leading slash", "POST", "/predict", {"headers": {_REDIRECT: "/v2/health/ready"}}),
    ("a JSON header size beyond the body", "POST", "/predict", {"data": b"{}", "headers": {"content-type": _MIME_VX + "99"}}),
]  # fmt: skip


@pytest.mark.parametrize(("label", "method", "path", "kwargs"), _VERTEX_CASES, ids=[case[0] for case in _VERTEX_CASES])
def test_vertex_ai_answers_as_triton_does(endpoints: Endpoints, label: str, method: str, path: str, kwargs: dict[str, Any]) -> None:
    triton, nereid = endpoints.ask("vertex", method, path, **kwargs)
    assert nereid == triton, label


def test_vertex_ai_binary_request_and_response_as_tritons_qa_sends_them(endpoints: Endpoints) -> None:
    body, json_size = _binary_body([4, 3, 2, 1])
    for headers in ({}, {_REDIRECT: "v2/models/add_sub2/infer"}):
        triton, nereid = endpoints.ask("vertex", "POST", "/predict", data=body, headers={"Content-Type": _MIME_VX + str(json_size), **headers})
        assert nereid == triton
        assert nereid.status == 200 and nereid.content_type == "application/octet-stream"


def test_vertex_ai_redirect_to_metrics_serves_the_prometheus_text(endpoints: Endpoints) -> None:
    triton, nereid = endpoints.ask("vertex", "POST", "/predict", headers={_REDIRECT: "metrics"})
    assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "text/plain")
    assert b"nv_inference_request_success" in nereid.body


def test_vertex_ai_redirect_to_model_config_and_statistics(endpoints: Endpoints) -> None:
    for route in ("v2/models/add_sub/config", "v2/models/add_sub/stats"):
        triton, nereid = endpoints.ask("vertex", "POST", "/predict", headers={_REDIRECT: route})
        assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "application/json")
        assert nereid.body.get("name", "add_sub") == "add_sub"
        assert [s["name"] for s in nereid.body.get("model_stats", [])] == [s["name"] for s in triton.body.get("model_stats", [])]


def test_vertex_ai_redirect_to_the_repository_index(endpoints: Endpoints) -> None:
    triton, nereid = endpoints.ask("vertex", "POST", "/predict", headers={_REDIRECT: "v2/repository/index"})
    assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "application/json")

    # A model the multi-model endpoint unloaded stays in Nereid's index as UNAVAILABLE; Triton forgets it with
    # the repository it registered for it. The repository's own models are listed alike.
    def own(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [entry for entry in entries if entry["name"] in ("add_sub", "add_sub2")]

    assert own(nereid.body) == own(triton.body)


def test_sagemaker_multi_model_endpoint_serves_an_ensemble_archive_as_triton_does(endpoints: Endpoints) -> None:
    # Last in the file: after this unload real Triton 2.51 reports itself not ready (strict readiness), which
    # would change every later health answer; Nereid stays ready.
    url = str(endpoints.ensemble_archive)  # type: ignore[attr-defined]
    steps: list[tuple[str, str, str, dict[str, Any]]] = [
        ("load", "POST", "/models", {"json": {"model_name": "pipe", "url": url}}),
        ("describe", "GET", "/models/pipe", {}),
        ("invoke", "POST", "/models/pipe/invoke", {"json": _body([1, 2, 3, 4])}),
        ("unload", "DELETE", "/models/pipe", {}),
        ("list after unload", "GET", "/models", {}),
    ]
    for label, method, path, kwargs in steps:
        triton, nereid = endpoints.ask("sagemaker", method, path, **kwargs)
        if label == "invoke":
            # Triton's ensemble answers list the outputs in another order (and add sequence parameters).
            assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "application/json")
            assert nereid.body["model_name"] == triton.body["model_name"] == "pipe"
            outputs = {o["name"]: o for o in nereid.body["outputs"]}
            assert outputs == {o["name"]: o for o in triton.body["outputs"]}
            assert outputs["OUTPUT0"]["data"] == [2, 3, 4, 5]
        else:
            assert nereid == triton, label
