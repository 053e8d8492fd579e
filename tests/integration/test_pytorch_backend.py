"""The pytorch backend behind a real `nereid serve`: TorchScript and torch.export models named as Triton's
PyTorch backend names them (INPUT__0 by position or forward()'s argument names; tuple, list and dict results),
compared with the same module called in-process. Outputs are equal within rtol 1e-6 (the same kernels on
the same rows; batching only changes which rows share a call)."""

from __future__ import annotations

import concurrent.futures
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.framework_models import (
    torch_dict_output,
    torch_exported,
    torch_linear,
    torch_named_args,
    torch_strings,
    torch_tuple_output,
)
from tests.integration.onnx_builders import write
from tests.servers import RunningServer, start_nereid

BATCHING = "dynamic_batching { max_queue_delay_microseconds: 20000 }\ninstance_group [{ count: 2 kind: KIND_CPU }]\n"


def _io(kind: str, name: str, dtype: str, dims: list[int]) -> str:
    return f'{kind} {{ name: "{name}" data_type: {dtype} dims: [{", ".join(map(str, dims))}] }}\n'


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("torch_repo")
    m: dict[str, Any] = {}
    linear_io = _io("input", "INPUT__0", "TYPE_FP32", [8]) + _io("output", "OUTPUT__0", "TYPE_FP32", [3])
    m["linear"] = torch_linear(root / "linear" / "1" / "model.pt")
    write(root / "linear" / "config.pbtxt", 'platform: "pytorch_libtorch"\nmax_batch_size: 16\n' + linear_io + BATCHING)
    torch_linear(root / "tuned" / "1" / "model.pt")
    write(root / "tuned" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 16\n' + linear_io
          + _param("INFERENCE_MODE", "false") + _param("DISABLE_OPTIMIZED_EXECUTION", "true")
          + _param("INTRA_OP_THREAD_COUNT", "1") + _param("ENABLE_WEIGHT_SHARING", "true")
          + _param("NOT_A_PYTORCH_PARAMETER", "1") + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    # forward(values, scale): the config lists them in the other order, by name.
    m["named_args"] = torch_named_args(root / "named_args" / "1" / "model.pt")
    write(root / "named_args" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 8\n'
          + _io("input", "scale", "TYPE_FP32", [3]) + _io("input", "values", "TYPE_FP32", [3])
          + _io("output", "OUTPUT__0", "TYPE_FP32", [3]) + _io("output", "OUTPUT__1", "TYPE_FP32", [1]))
    m["dict_output"] = torch_dict_output(root / "dict_output" / "1" / "model.pt")
    write(root / "dict_output" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 8\n'
          + _io("input", "INPUT__0", "TYPE_FP32", [4])
          + _io("output", "total", "TYPE_FP32", [1]) + _io("output", "doubled", "TYPE_FP32", [4]))
    # A list result: the config lists OUTPUT__1 first; the index, not the order, picks the result.
    m["list_output"] = torch_tuple_output(root / "list_output" / "1" / "model.pt")
    write(root / "list_output" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 8\n'
          + _io("input", "INPUT__0", "TYPE_FP32", [4])
          + _io("output", "OUTPUT__1", "TYPE_FP32", [4]) + _io("output", "OUTPUT__0", "TYPE_INT64", [1]))
    torch_tuple_output(root / "wrong_output_type" / "1" / "model.pt")
    write(root / "wrong_output_type" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 8\n'
          + _io("input", "INPUT__0", "TYPE_FP32", [4])
          + _io("output", "OUTPUT__0", "TYPE_FP32", [1]) + _io("output", "OUTPUT__1", "TYPE_FP32", [4]))
    m["strings"] = torch_strings(root / "strings" / "1" / "model.pt")
    write(root / "strings" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 0\n'
          + _io("input", "INPUT__0", "TYPE_STRING", [-1]) + _io("output", "OUTPUT__0", "TYPE_STRING", [-1]))
    # torch.export: no config at all (auto-completed from the program), and one with batching on two instances.
    m["exported_auto"] = torch_exported(root / "exported_auto" / "1" / "model.pt2")
    m["exported"] = torch_exported(root / "exported" / "1" / "model.pt2")
    write(root / "exported" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 32\n'
          + _io("input", "INPUT__0", "TYPE_FP32", [8]) + _io("output", "OUTPUT__0", "TYPE_FP32", [3]) + BATCHING)
    # Failures with a reason.
    torch_linear(root / "config_order" / "1" / "model.pt")
    write(root / "config_order" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 4\n'
          + _io("input", "features", "TYPE_FP32", [8]) + _io("output", "OUTPUT__0", "TYPE_FP32", [3]))
    torch_linear(root / "gpu_instance" / "1" / "model.pt")
    write(root / "gpu_instance" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 4\n' + linear_io
          + "instance_group [{ count: 1 kind: KIND_GPU }]\n")
    write(root / "not_torchscript" / "1" / "model.pt", "this is not a TorchScript archive")
    write(root / "not_torchscript" / "config.pbtxt", 'backend: "pytorch"\nmax_batch_size: 4\n' + linear_io)
    return root, m


@pytest.fixture(scope="module")
def server(models: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(models[0], "--exit-on-error=false", "--strict-readiness=false", "--log-verbose=1",
                           log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="module")
def modules(models: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    return models[1]


def infer(http: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = http.infer(model, tensors, outputs=[httpclient.InferRequestedOutput(o) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


def _rows(count: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def _reason(http: httpclient.InferenceServerClient, model: str) -> str:
    entries = [e for e in http.get_model_repository_index() if e["name"] == model]
    assert entries and all(e["state"] == "UNAVAILABLE" for e in entries), entries
    return " ".join(e.get("reason", "") for e in entries)


def test_torchscript_by_position_matches_torch(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    rows = _rows(5, 8)
    out = infer(http, "linear", {"INPUT__0": rows}, ["OUTPUT__0"])["OUTPUT__0"]
    with torch.no_grad():
        expected = modules["linear"](torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    config = http.get_model_config("linear")
    assert config["platform"] == "pytorch_libtorch" and config["backend"] == "pytorch"


def test_inputs_named_after_forward_arguments_in_any_order(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    values, scale = _rows(4, 3, 1), _rows(4, 3, 2)
    out = infer(http, "named_args", {"scale": scale, "values": values}, ["OUTPUT__0", "OUTPUT__1"])
    product, total = modules["named_args"](torch.from_numpy(values), torch.from_numpy(scale))
    np.testing.assert_allclose(out["OUTPUT__0"], product.numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], total.numpy(), rtol=1e-6)


def test_dict_result_is_matched_by_key(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    rows = _rows(3, 4, 3)
    out = infer(http, "dict_output", {"INPUT__0": rows}, ["total", "doubled"])
    expected = modules["dict_output"](torch.from_numpy(rows))
    np.testing.assert_allclose(out["doubled"], expected["doubled"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["total"], expected["total"].numpy(), rtol=1e-6)
    only = infer(http, "dict_output", {"INPUT__0": rows}, ["total"])  # one requested output of two
    assert list(only) == ["total"]


def test_list_result_is_matched_by_output_index_with_its_own_type(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    rows = _rows(6, 4, 4)
    out = infer(http, "list_output", {"INPUT__0": rows}, ["OUTPUT__0", "OUTPUT__1"])
    ids, probabilities = modules["list_output"](torch.from_numpy(rows))
    assert out["OUTPUT__0"].dtype == np.int64
    np.testing.assert_array_equal(out["OUTPUT__0"], ids.numpy())
    np.testing.assert_allclose(out["OUTPUT__1"], probabilities.numpy(), rtol=1e-6)


def test_output_of_another_type_than_configured_is_an_error_naming_both(http: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT__0", [2, 4], "FP32")
    tensor.set_data_from_numpy(_rows(2, 4))
    with pytest.raises(InferenceServerException) as caught:
        http.infer("wrong_output_type", [tensor])
    assert "OUTPUT__0" in str(caught.value) and "INT64" in str(caught.value) and "TYPE_FP32" in str(caught.value)


def test_string_lists_travel_as_bytes_tensors(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    words = ["tree", "torch", "\u00e9t\u00e9"]
    tensor = httpclient.InferInput("INPUT__0", [3], "BYTES")
    tensor.set_data_from_numpy(np.array([w.encode() for w in words], dtype=object))
    out = http.infer("strings", [tensor]).as_numpy("OUTPUT__0")
    assert out.tolist() == [w.encode() for w in modules["strings"](words)]
    assert out.tolist()[:2] == [b"TREE!", b"TORCH!"]


def test_exported_program_without_config_is_auto_completed(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    config = http.get_model_config("exported_auto")
    assert config["backend"] == "pytorch"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("features_in", "TYPE_FP32", [8])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("OUTPUT__0", "TYPE_FP32", [3])]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    rows = _rows(3, 8, 5)
    out = infer(http, "exported_auto", {"features_in": rows}, ["OUTPUT__0"])["OUTPUT__0"]
    with torch.no_grad():
        np.testing.assert_allclose(out, modules["exported_auto"](torch.from_numpy(rows)).numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("model", ["linear", "exported", "tuned"])
def test_concurrent_requests_on_two_instances_match_torch_row_for_row(
    server: RunningServer, http: httpclient.InferenceServerClient, modules: dict[str, Any], model: str
) -> None:
    rows = _rows(48, 8, 6)
    reference = modules["exported" if model == "exported" else "linear"]
    with torch.no_grad():
        expected = reference(torch.from_numpy(rows)).numpy()
    before = http.get_inference_statistics(model)["model_stats"][0]
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(12)]

    def one(i: int) -> np.ndarray:
        inp = grpcclient.InferInput("INPUT__0", [2, 8], "FP32")
        inp.set_data_from_numpy(rows[2 * i : 2 * i + 2])
        return clients[i % len(clients)].infer(model, [inp]).as_numpy("OUTPUT__0")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(24)))
    np.testing.assert_allclose(np.concatenate(answers), expected, rtol=1e-5, atol=1e-6)
    after = http.get_inference_statistics(model)["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 48
    if "dynamic_batching" in http.get_model_config(model):
        assert after["execution_count"] - before["execution_count"] < 24, "requests were never batched together"


def test_parameters_are_applied_and_unknown_ones_reported(http: httpclient.InferenceServerClient, server: RunningServer) -> None:
    assert http.is_model_ready("tuned")
    log = server.log()
    assert "pytorch INTRA_OP_THREAD_COUNT set to 1" in log
    assert "unknown pytorch parameter 'NOT_A_PYTORCH_PARAMETER'" in log


def test_an_input_named_neither_as_an_argument_nor_indexed_goes_in_config_order(http: httpclient.InferenceServerClient) -> None:
    """Triton's PyTorch backend takes such inputs in the configuration's order (qa/L0_input_validation counts on it)."""
    rows = _rows(3, 8)
    out = infer(http, "config_order", {"features": rows}, ["OUTPUT__0"])["OUTPUT__0"]
    assert out.shape == (3, 3)


def test_load_failures_are_unavailable_with_the_reason(http: httpclient.InferenceServerClient) -> None:
    assert "PyTorch could not load" in _reason(http, "not_torchscript")


def test_gpu_instance_needs_cuda(http: httpclient.InferenceServerClient, modules: dict[str, Any]) -> None:
    if torch.cuda.is_available():  # on a machine with a GPU the model runs there and gives the same numbers
        rows = _rows(4, 8, 7)
        out = infer(http, "gpu_instance", {"INPUT__0": rows}, ["OUTPUT__0"])["OUTPUT__0"]
        with torch.no_grad():
            np.testing.assert_allclose(out, modules["linear"](torch.from_numpy(rows)).numpy(), rtol=1e-4, atol=1e-5)
    else:
        assert "KIND_GPU" in _reason(http, "gpu_instance")


def test_missing_torch_makes_the_backend_unavailable_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from nereid.backends.base import get_backend
    from nereid.core.errors import NereidError

    monkeypatch.delitem(sys.modules, "nereid.backends.pytorch_backend", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(NereidError) as caught:
        get_backend("pytorch")
    assert caught.value.status.name == "UNAVAILABLE"
    assert "pip install nereid[pytorch]" in caught.value.message
