"""The TensorFlow backend behind a real `nereid serve`: SavedModels completed from their signature (a dense model,
string tensors, a second signature picked with TF_SIGNATURE_DEF, a Keras 3 export), a GraphDef with an explicit
config, reshape and its init ops, batching over the first dimension, sessions shared between instances, and the
GPU-only options on CPU. Every answer, over HTTP and gRPC, is compared with the same model run by TensorFlow in
this process (same kernels, so within float rounding: rtol 1e-5)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration import tensorflow_models as tfm
from tests.integration.onnx_builders import write
from tests.servers import RunningServer, start_nereid

# Checked without importing it: every worker collects this module, and TensorFlow's import costs seconds. `make`
# installs the extra, so a missing one fails the module rather than skip it.
if importlib.util.find_spec("tensorflow") is None:
    raise ImportError("the tensorflow extra (tensorflow-cpu) is not installed: make installs it")

RTOL = 1e-5
SAVEDMODEL = "model.savedmodel"


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def _copy_model(root: Path, source: str, name: str, config: str) -> None:
    shutil.copytree(root / source / "1", root / name / "1")
    write(root / name / "config.pbtxt", config)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("tf_repo")
    m: dict[str, Any] = {}
    # SavedModels without a config: everything from the signature.
    m["dense"] = tfm.dense_savedmodel(root / "dense" / "1" / SAVEDMODEL)
    m["strings"] = tfm.string_savedmodel(root / "strings" / "1" / SAVEDMODEL)
    m["keras"] = tfm.keras_export(root / "keras" / "1" / SAVEDMODEL)
    m["two_signatures"], m["scaled"] = tfm.two_signature_savedmodel(root / "two_signatures" / "1" / SAVEDMODEL)
    _copy_model(root, "two_signatures", "scaled", 'backend: "tensorflow"\n' + _param("TF_SIGNATURE_DEF", "scaled"))
    # Batching: a queue that waits for the preferred batch of 8 rows.
    _copy_model(root, "dense", "batched", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'
                "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 2000000 }\n")
    # Three instances, at most two on one session: two sessions.
    _copy_model(root, "dense", "shared", 'backend: "tensorflow"\ninstance_group [{ count: 3 kind: KIND_CPU }]\n'
                + _param("MAX_SESSION_SHARE_COUNT", "2"))
    # The GPU-only accelerator on a CPU instance, and the thread parameters.
    _copy_model(root, "dense", "trt_on_cpu", 'backend: "tensorflow"\n' + _param("TF_NUM_INTRA_THREADS", "1")
                + "optimization { execution_accelerators { gpu_execution_accelerator [{ name: \"tensorrt\" }] } }\n")
    # A GraphDef: an explicit config, reshape [2,3] -> [6], and the init op that sets its bias.
    m["graphdef"] = tfm.graphdef(root / "graphdef" / "1" / "model.graphdef")
    write(root / "graphdef" / "config.pbtxt", 'platform: "tensorflow_graphdef"\nmax_batch_size: 8\n'
          'input [{ name: "x" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [6] } }]\n'
          'output [{ name: "out" data_type: TYPE_FP32 dims: [4] }]\n' + _param("TF_INIT_OPS_FILE", "init_ops.json"))
    write(root / "graphdef" / "1" / "init_ops.json", '{"init_ops": ["init"]}')
    # Configs the model contradicts.
    _copy_model(root, "dense", "wrong_dtype", 'backend: "tensorflow"\ninput [{ name: "x" data_type: TYPE_INT32 }]\n')
    _copy_model(root, "dense", "no_such_signature", 'backend: "tensorflow"\n' + _param("TF_SIGNATURE_DEF", "nope"))
    _copy_model(root, "dense", "no_such_tag", 'backend: "tensorflow"\n' + _param("TF_GRAPH_TAG", "gpu"))
    return root, m


@pytest.fixture(scope="module")
def server(models: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(
        models[0], "--exit-on-error=false", "--strict-readiness=false", "--log-verbose=1",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="module")
def grpc(server: RunningServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer_both(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, model: str,
    inputs: dict[str, np.ndarray], outputs: list[str],
) -> list[dict[str, np.ndarray]]:
    """The model's answer over HTTP (binary tensors) and over gRPC."""
    answers = []
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        tensors = []
        for name, array in inputs.items():
            datatype = "BYTES" if array.dtype == object else {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
            tensor = module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors)  # type: ignore[attr-defined]
        answers.append({name: result.as_numpy(name) for name in outputs})
    return answers


def _reason(http: httpclient.InferenceServerClient, model: str) -> str:
    entries = [e for e in http.get_model_repository_index() if e["name"] == model]
    assert entries and all(e["state"] == "UNAVAILABLE" for e in entries), entries
    return " ".join(e.get("reason", "") for e in entries)


# ============================================ SavedModel auto-complete ============================================
def test_savedmodel_without_config_is_completed_from_its_signature(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("dense")
    assert (config["backend"], config["platform"]) == ("tensorflow", "tensorflow_savedmodel")
    assert config["default_model_filename"] == SAVEDMODEL
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("x", "TYPE_FP32", [8])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("y", "TYPE_FP32", [3])]
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size: the signature's first dims are variable
    assert "dynamic_batching" in config
    assert http.get_model_metadata("dense")["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]


def test_dense_savedmodel_answers_as_tensorflow_does(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    expected = models[1]["dense"](x=x)["y"]
    for answer in _infer_both(http, grpc, "dense", {"x": x}, ["y"]):
        np.testing.assert_allclose(answer["y"], expected, rtol=RTOL, atol=1e-6)


def test_string_tensors_travel_as_bytes(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    config = http.get_model_config("strings")
    # One string per batch item: the signature's [-1] shows as dims [1] reshaped to nothing, as Triton shows it.
    assert [(i["name"], i["data_type"], i["dims"], i["reshape"]) for i in config["input"]] == [
        ("text", "TYPE_STRING", [1], {"shape": []})
    ]
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [("length", "TYPE_INT32"), ("upper", "TYPE_STRING")]
    text = np.array([[b"nereid"], ["h\u00e9llo w\u00f6rld".encode()], [b""]], dtype=object)
    expected = models[1]["strings"](text=text.reshape(-1))
    for answer in _infer_both(http, grpc, "strings", {"text": text}, ["upper", "length"]):
        assert answer["upper"].reshape(-1).tolist() == expected["upper"].tolist() == [b"NEREID", "H\u00e9LLO W\u00f6RLD".encode(), b""]  # ASCII case only
        assert answer["length"].reshape(-1).tolist() == expected["length"].tolist() == [6, 11, 0]


def test_tf_signature_def_picks_another_signature(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    default = http.get_model_config("two_signatures")
    assert [i["name"] for i in default["input"]] == ["x"]
    scaled = http.get_model_config("scaled")
    assert [(i["name"], i["data_type"], i["dims"]) for i in scaled["input"]] == [
        ("factor", "TYPE_INT64", [1]), ("values", "TYPE_FP32", [4])
    ]
    assert [(o["name"], o["dims"]) for o in scaled["output"]] == [("product", [4]), ("total", [1])]
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    factor = np.array([[3], [-2]], dtype=np.int64)
    expected = models[1]["scaled"](values=values, factor=factor)
    for answer in _infer_both(http, grpc, "scaled", {"values": values, "factor": factor}, ["product", "total"]):
        np.testing.assert_allclose(answer["product"], expected["product"], rtol=RTOL)
        np.testing.assert_allclose(answer["total"], expected["total"], rtol=RTOL)
    # One output asked for: the session fetches that one alone.
    tensors = [grpcclient.InferInput("values", [2, 4], "FP32"), grpcclient.InferInput("factor", [2, 1], "INT64")]
    tensors[0].set_data_from_numpy(values)
    tensors[1].set_data_from_numpy(factor)
    only_total = grpc.infer("scaled", tensors, outputs=[grpcclient.InferRequestedOutput("total")])
    assert only_total.as_numpy("product") is None
    np.testing.assert_allclose(only_total.as_numpy("total"), expected["total"], rtol=RTOL)
    doubled = _infer_both(http, grpc, "two_signatures", {"x": values}, ["doubled"])
    assert all(np.array_equal(a["doubled"], models[1]["two_signatures"](x=values)["doubled"]) for a in doubled)


def test_keras_3_export_serves_as_the_keras_model_answers(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    config = http.get_model_config("keras")
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("features", [6])]
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("output_0", [3])]
    features = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    expected = models[1]["keras"](features=features)["output_0"]
    for answer in _infer_both(http, grpc, "keras", {"features": features}, ["output_0"]):
        np.testing.assert_allclose(answer["output_0"], expected, rtol=RTOL, atol=1e-6)


# ================================================== GraphDef ==================================================
def test_graphdef_with_an_explicit_config_reshapes_and_runs_its_init_ops(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    config = http.get_model_config("graphdef")
    assert (config["backend"], config["default_model_filename"]) == ("tensorflow", "model.graphdef")
    x = np.random.default_rng(2).standard_normal((3, 2, 3)).astype(np.float32)  # the client's [2,3] is the model's [6]
    expected = models[1]["graphdef"](x=x.reshape(3, 6))["out"]
    for answer in _infer_both(http, grpc, "graphdef", {"x": x}, ["out"]):
        np.testing.assert_allclose(answer["out"], expected, rtol=RTOL, atol=1e-6)


# ============================================ batching and instances ============================================
def test_concurrent_requests_are_batched_over_the_first_dimension(
    server: RunningServer, http: httpclient.InferenceServerClient, models: tuple[Path, dict[str, Any]]
) -> None:
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((rows, 8)).astype(np.float32) for rows in (1, 2, 3, 2)]  # 8 rows: one batch

    def infer(x: np.ndarray) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("batched", [tensor]).as_numpy("y")  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        answers = list(pool.map(infer, batches))
    for x, answer in zip(batches, answers, strict=True):
        np.testing.assert_allclose(answer, models[1]["dense"](x=x)["y"], rtol=RTOL, atol=1e-6)
    stats = http.get_inference_statistics("batched")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (8, 1)


def test_instances_share_sessions_up_to_max_session_share_count(
    server: RunningServer, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient,
    models: tuple[Path, dict[str, Any]]
) -> None:
    x = np.ones((2, 8), dtype=np.float32)
    for answer in _infer_both(http, grpc, "shared", {"x": x}, ["y"]):
        np.testing.assert_allclose(answer["y"], models[1]["dense"](x=x)["y"], rtol=RTOL)
    lines = [line for line in server.log().splitlines() if "[model 'shared' version 1]: instance" in line]
    assert sum("opened a TensorFlow session" in line for line in lines) == 2, lines
    assert sum("shares a TensorFlow session (2 of MAX_SESSION_SHARE_COUNT 2)" in line for line in lines) == 1, lines


def test_gpu_only_accelerator_and_process_wide_threads_are_said_not_to_apply(
    server: RunningServer, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient,
    models: tuple[Path, dict[str, Any]]
) -> None:
    x = np.full((1, 8), 0.5, dtype=np.float32)
    for answer in _infer_both(http, grpc, "trt_on_cpu", {"x": x}, ["y"]):
        np.testing.assert_allclose(answer["y"], models[1]["dense"](x=x)["y"], rtol=RTOL)
    log = server.log()
    assert "gpu_execution_accelerator ['tensorrt'] applies to GPU instances only" in log
    # TF_NUM_INTRA_THREADS is process-wide in TensorFlow: either this model sized the pool, or it is told it cannot.
    assert ("model 'trt_on_cpu' sizes TensorFlow's process-wide thread pools: intra-op 1" in log
            or "model 'trt_on_cpu': TF_NUM_INTRA_THREADS=1 does not apply" in log), log


# ================================================== errors ==================================================
def test_bad_input_is_refused_naming_model_tensor_and_expectation(http: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("x", [2, 7], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 7), dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        http.infer("dense", [tensor])
    message = str(caught.value)
    assert "'x'" in message and "dense" in message and "[-1,8]" in message, message


def test_config_contradicting_the_model_is_refused(http: httpclient.InferenceServerClient) -> None:
    reason = _reason(http, "wrong_dtype")
    assert "input 'x'" in reason and "TYPE_FP32" in reason and "TYPE_INT32" in reason, reason
    reason = _reason(http, "no_such_signature")
    assert "'nope'" in reason and "serving_default" in reason, reason
    reason = _reason(http, "no_such_tag")
    assert "tagged 'gpu'" in reason and "[['serve']]" in reason, reason
