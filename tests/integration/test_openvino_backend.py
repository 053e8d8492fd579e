"""The openvino backend behind a real `nereid serve`: OpenVINO IR and ONNX files on the CPU, auto-complete,
Triton's OpenVINO parameters, batching on two instances. Answers are compared with OpenVINO called directly
on the same rows (rtol 1e-6: the same CPU plugin, only the batch composition differs)."""

from __future__ import annotations

import concurrent.futures
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.framework_models import openvino_ir
from tests.integration.onnx_builders import add_constant, write
from tests.servers import RunningServer, start_nereid

IO = ('input { name: "features" data_type: TYPE_FP32 dims: [8] }\n'
      'output { name: "scores" data_type: TYPE_FP32 dims: [4] }\n')


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ov_repo")
    openvino_ir(root / "ir_auto" / "1" / "model.xml")  # no config: found by model.xml, auto-completed
    openvino_ir(root / "ir_batched" / "1" / "model.xml")
    write(root / "ir_batched" / "config.pbtxt", 'backend: "openvino"\nmax_batch_size: 16\n' + IO
          + "dynamic_batching { max_queue_delay_microseconds: 20000 }\ninstance_group [{ count: 2 kind: KIND_CPU }]\n"
          + _param("NUM_STREAMS", "1") + _param("INFERENCE_NUM_THREADS", "1") + _param("PERFORMANCE_HINT", "LATENCY")
          + _param("NOT_AN_OPENVINO_PARAMETER", "1"))
    openvino_ir(root / "static_batch" / "1" / "model.xml", batch=1)
    write(root / "static_batch" / "config.pbtxt", 'backend: "openvino"\nmax_batch_size: 8\n' + IO)
    openvino_ir(root / "fixed_batch" / "1" / "model.xml", batch=1)
    write(root / "fixed_batch" / "config.pbtxt", 'backend: "openvino"\nmax_batch_size: 4\n' + IO
          + _param("SKIP_OV_DYNAMIC_BATCHSIZE", "YES") + _param("ENABLE_BATCH_PADDING", "YES"))
    add_constant(root / "onnx_file" / "1" / "model.onnx", 1.0)
    write(root / "onnx_file" / "config.pbtxt", 'backend: "openvino"\n')
    openvino_ir(root / "bad_hint" / "1" / "model.xml")
    write(root / "bad_hint" / "config.pbtxt", 'backend: "openvino"\nmax_batch_size: 4\n' + IO + _param("PERFORMANCE_HINT", "FASTEST"))
    openvino_ir(root / "wrong_input" / "1" / "model.xml")
    write(root / "wrong_input" / "config.pbtxt", 'backend: "openvino"\nmax_batch_size: 4\n'
          'input { name: "pixels" data_type: TYPE_FP32 dims: [8] }\noutput { name: "scores" data_type: TYPE_FP32 dims: [4] }\n')
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(repo, "--exit-on-error=false", "--strict-readiness=false", "--log-verbose=1",
                           log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def _direct(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """OpenVINO called in-process on the same file."""
    compiled = ov.Core().compile_model(str(path), "CPU")
    results = compiled.create_infer_request().infer(inputs)
    return [np.array(results[port]) for port in compiled.outputs]


def infer(http: httpclient.InferenceServerClient, model: str, name: str, rows: np.ndarray, output: str) -> np.ndarray:
    tensor = httpclient.InferInput(name, list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return http.infer(model, [tensor]).as_numpy(output)


def _rows(count: int, width: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def _reason(http: httpclient.InferenceServerClient, model: str) -> str:
    entries = [e for e in http.get_model_repository_index() if e["name"] == model]
    assert entries and all(e["state"] == "UNAVAILABLE" for e in entries), entries
    return " ".join(e.get("reason", "") for e in entries)


def test_ir_without_config_is_found_and_auto_completed(http: httpclient.InferenceServerClient, repo: Path) -> None:
    config = http.get_model_config("ir_auto")
    assert config["backend"] == "openvino"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("features", "TYPE_FP32", [8])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("scores", "TYPE_FP32", [4])]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    rows = _rows(3, seed=1)
    expected = _direct(repo / "ir_auto" / "1" / "model.xml", {"features": rows})[0]
    np.testing.assert_allclose(infer(http, "ir_auto", "features", rows, "scores"), expected, rtol=1e-6)


def test_onnx_file_runs_through_openvino(http: httpclient.InferenceServerClient, repo: Path) -> None:
    config = http.get_model_config("onnx_file")
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("INPUT0", [4])]
    rows = _rows(2, 4, seed=2)
    out = infer(http, "onnx_file", "INPUT0", rows, "OUTPUT0")
    np.testing.assert_allclose(out, _direct(repo / "onnx_file" / "1" / "model.onnx", {"INPUT0": rows})[0], rtol=1e-6)
    np.testing.assert_allclose(out, rows + 1.0, rtol=1e-6)


def test_static_batch_model_is_given_a_dynamic_batch(http: httpclient.InferenceServerClient, repo: Path) -> None:
    rows = _rows(5, seed=3)
    out = infer(http, "static_batch", "features", rows, "scores")
    assert out.shape == (5, 4)
    expected = np.concatenate([_direct(repo / "static_batch" / "1" / "model.xml", {"features": rows[i : i + 1]})[0] for i in range(5)])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_skip_dynamic_batch_size_pads_to_max_batch_size(http: httpclient.InferenceServerClient, repo: Path) -> None:
    rows = _rows(3, seed=4)
    out = infer(http, "fixed_batch", "features", rows, "scores")
    assert out.shape == (3, 4)
    expected = np.concatenate([_direct(repo / "fixed_batch" / "1" / "model.xml", {"features": rows[i : i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_batched_requests_on_two_instances_with_tritons_parameters(
    server: RunningServer, http: httpclient.InferenceServerClient, repo: Path
) -> None:
    rows = _rows(48, seed=5)
    expected = _direct(repo / "ir_batched" / "1" / "model.xml", {"features": rows})[0]
    before = http.get_inference_statistics("ir_batched")["model_stats"][0]
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(12)]

    def one(i: int) -> np.ndarray:
        inp = grpcclient.InferInput("features", [2, 8], "FP32")
        inp.set_data_from_numpy(rows[2 * i : 2 * i + 2])
        return clients[i % len(clients)].infer("ir_batched", [inp]).as_numpy("scores")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(24)))
    np.testing.assert_allclose(np.concatenate(answers), expected, rtol=1e-6, atol=1e-7)
    after = http.get_inference_statistics("ir_batched")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 48
    assert after["execution_count"] - before["execution_count"] < 24, "requests were never batched together"
    log = server.log()
    assert log.count("model 'ir_batched': instance") == 2
    assert "(streams 1, threads 1, hint LATENCY)" in log
    assert "unknown openvino parameter 'NOT_AN_OPENVINO_PARAMETER'" in log


def test_bad_parameters_and_contradicting_configs_are_unavailable_with_the_reason(http: httpclient.InferenceServerClient) -> None:
    assert "PERFORMANCE_HINT" in _reason(http, "bad_hint") and "FASTEST" in _reason(http, "bad_hint")
    reason = _reason(http, "wrong_input")
    assert "pixels" in reason and "features" in reason


def test_missing_openvino_makes_the_backend_unavailable_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from nereid.backends.base import get_backend
    from nereid.core.errors import NereidError

    monkeypatch.delitem(sys.modules, "nereid.backends.openvino_backend", raising=False)
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    with pytest.raises(NereidError) as caught:
        get_backend("openvino")
    assert caught.value.status.name == "UNAVAILABLE"
    assert "pip install nereid[openvino]" in caught.value.message
