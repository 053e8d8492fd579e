"""BLS response parameters: what a called model puts in its response's `parameters` reaches the calling model.

A target model answers with response parameters (int, bool and string values); a caller runs it through BLS and
returns `response.parameters()` as its output. Response parameters came to python_backend after Triton 2.51 (whose
`InferenceResponse` takes no `parameters` and whose BLS responses have no `parameters()`, so it cannot be the oracle
here); Nereid follows the later python_backend, where the caller reads the target's parameters as a JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.servers import RunningServer, start_nereid

_TARGET_CONFIG = """
name: "param_target"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_TARGET = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            parameters = {"count": int(x.size), "doubled": True, "label": "from-target"}
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x * 2)], parameters=parameters)
            )
        return responses
"""

_PLAIN_CONFIG = _TARGET_CONFIG.replace("param_target", "plain_target")

_PLAIN = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

_CALLER_CONFIG = """
name: "param_caller"
backend: "python"
max_batch_size: 0
input [ { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] }, { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            x = pb_utils.Tensor("INPUT0", np.array([1.0, 2.0, 3.0], np.float32))
            answer = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["OUTPUT0"], inputs=[x]
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            text = answer.parameters()
            outputs = [
                pb_utils.Tensor("PARAMETERS", np.array([text.encode()], np.object_)),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


def _repository(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    _write(repo, "param_target", _TARGET_CONFIG, _TARGET)
    _write(repo, "plain_target", _PLAIN_CONFIG, _PLAIN)
    _write(repo, "param_caller", _CALLER_CONFIG, _CALLER)
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("bls_parameters"))


@pytest.fixture(scope="module")
def nereid(repo: Path) -> Iterator[RunningServer]:
    running = start_nereid(repo, log_dir=repo.parent)
    yield running
    running.stop()


def _ask(server: RunningServer, target: str) -> tuple[str, list[float]]:
    """The caller's answer: the BLS response's parameters() text and the target's output."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("TARGET", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([target.encode()], dtype=np.object_))
    result = client.infer("param_caller", [tensor])
    text = result.as_numpy("PARAMETERS")[0]
    return (text.decode() if isinstance(text, bytes) else str(text)), result.as_numpy("OUTPUT0").tolist()


def test_bls_caller_reads_the_response_parameters_its_target_set(nereid: RunningServer) -> None:
    text, output = _ask(nereid, "param_target")
    assert output == [2.0, 4.0, 6.0]
    assert json.loads(text) == {"count": 3, "doubled": True, "label": "from-target"}


def test_bls_response_without_parameters_reads_as_an_empty_object(nereid: RunningServer) -> None:
    text, output = _ask(nereid, "plain_target")
    assert output == [1.0, 2.0, 3.0]
    assert json.loads(text) == {}
