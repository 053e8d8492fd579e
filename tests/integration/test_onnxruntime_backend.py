"""The ONNX Runtime backend behind a real `nereid serve`: auto-complete as Triton derives it, variable dims,
reshape, instances that really run concurrently, session options from the config, and GPU instances."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from examples.build_models import identity, mlp
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.integration.onnx_builders import add_constant, busy_iterations, busy_loop, reshaped, scalar_io, write
from tests.servers import RunningServer, start_nereid


def _threads_param(name: str, value: str) -> str:
    return f'parameters {{ key: "{name}" value {{ string_value: "{value}" }} }}\n'


BUSY = 'backend: "onnxruntime"\n' + _threads_param("intra_op_thread_count", "1")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ort_repo")
    # Auto-complete: no config, partial configs, a model without a batch dimension, a scalar per item.
    mlp(root / "auto_mlp" / "1" / "model.onnx")
    mlp(root / "partial_mbs" / "1" / "model.onnx")
    write(root / "partial_mbs" / "config.pbtxt", "max_batch_size: 2\n")
    add_constant(root / "partial_io" / "1" / "model.onnx", 1.0)
    write(root / "partial_io" / "config.pbtxt", 'backend: "onnxruntime"\ninput [{ name: "INPUT0" dims: [4] }]\n')
    add_constant(root / "full_rank_io" / "1" / "model.onnx", 1.0)
    write(root / "full_rank_io" / "config.pbtxt", 'backend: "onnxruntime"\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 4] }]\n')
    add_constant(root / "no_batch_dim" / "1" / "model.onnx", 1.0, batch=False)
    scalar_io(root / "scalar_per_item" / "1" / "model.onnx")
    add_constant(root / "batch_of_one" / "1" / "model.onnx", 1.0)
    write(root / "batch_of_one" / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 1\n')
    # Shapes: variable dims and reshape.
    identity(root / "variable" / "1" / "model.onnx", TensorProto.FLOAT, "variable")
    write(
        root / "variable" / "config.pbtxt",
        'backend: "onnxruntime"\nmax_batch_size: 8\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }\n'
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }\n',
    )
    reshaped(root / "reshaped" / "1" / "model.onnx")
    write(
        root / "reshaped" / "config.pbtxt",
        'backend: "onnxruntime"\nmax_batch_size: 4\n'
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [6] reshape { shape: [2, 3] } }\n'
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [6] reshape { shape: [2, 3] } }\n',
    )
    # Instances and session options.
    busy_loop(root / "one_instance" / "1" / "model.onnx")
    write(root / "one_instance" / "config.pbtxt", BUSY + "instance_group [{ count: 1 kind: KIND_CPU }]\n")
    busy_loop(root / "two_instances" / "1" / "model.onnx")
    write(root / "two_instances" / "config.pbtxt", BUSY + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    for level in (-1, 1, 2):
        name = f"graph_level_{'minus1' if level < 0 else level}"
        add_constant(root / name / "1" / "model.onnx", 1.0)
        write(root / name / "config.pbtxt", f'backend: "onnxruntime"\noptimization {{ graph {{ level: {level} }} }}\n')
    add_constant(root / "bad_thread_count" / "1" / "model.onnx", 1.0)
    write(root / "bad_thread_count" / "config.pbtxt", 'backend: "onnxruntime"\n' + _threads_param("intra_op_thread_count", "many"))
    add_constant(root / "gpu_instance" / "1" / "model.onnx", 1.0)
    write(root / "gpu_instance" / "config.pbtxt", 'backend: "onnxruntime"\ninstance_group [{ count: 1 kind: KIND_GPU }]\n')
    add_constant(root / "wrong_dtype" / "1" / "model.onnx", 1.0)
    write(root / "wrong_dtype" / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 4\ninput { name: "INPUT0" data_type: TYPE_INT32 dims: [4] }\n')
    add_constant(root / "wrong_shape" / "1" / "model.onnx", 1.0)
    write(root / "wrong_shape" / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 4\ninput { name: "INPUT0" data_type: TYPE_FP32 dims: [5] }\n')
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(
        repo, "--exit-on-error=false", "--strict-readiness=false", "--log-verbose=1",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def _reason(http: httpclient.InferenceServerClient, model: str) -> str:
    entries = [e for e in http.get_model_repository_index() if e["name"] == model]
    assert entries and all(e["state"] == "UNAVAILABLE" for e in entries), entries
    return " ".join(e.get("reason", "") for e in entries)


# ============================================= auto-complete =============================================
def test_model_without_config_is_completed_from_the_onnx_file(http: httpclient.InferenceServerClient, server: RunningServer) -> None:
    config = http.get_model_config("auto_mlp")
    assert config["name"] == "auto_mlp"
    assert config["backend"] == "onnxruntime"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4  # Triton's default for a model that can batch
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("input", "TYPE_FP32", [16])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("probabilities", "TYPE_FP32", [4])]
    assert "dynamic_batching" in config
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    metadata = http.get_model_metadata("auto_mlp")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("input", [3, 16], "FP32")
    inp.set_data_from_numpy(np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32))
    probabilities = grpc.infer("auto_mlp", [inp]).as_numpy("probabilities")
    assert probabilities.shape == (3, 4)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_partial_config_keeps_what_it_says_and_completes_the_rest(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("partial_mbs")
    assert config["max_batch_size"] == 2
    assert config["backend"] == "onnxruntime"  # found from the model.onnx file
    assert [i["name"] for i in config["input"]] == ["input"]
    assert config["output"][0]["dims"] == [4]
    io = http.get_model_config("partial_io")
    assert io["input"][0]["data_type"] == "TYPE_FP32"  # filled in from the model
    assert io["input"][0]["dims"] == [4]
    assert io["max_batch_size"] == 4  # the config's dims leave out the batch dimension, so it batches
    assert [(o["name"], o["data_type"], o["dims"]) for o in io["output"]] == [("OUTPUT0", "TYPE_FP32", [4])]


def test_config_listing_the_full_model_rank_means_no_batching(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("full_rank_io")
    assert config["max_batch_size"] == 0
    assert config["output"][0]["dims"] == [-1, 4]
    assert "dynamic_batching" not in config
    inp = httpclient.InferInput("INPUT0", [3, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((3, 4), dtype=np.float32))
    assert http.infer("full_rank_io", [inp]).as_numpy("OUTPUT0").shape == (3, 4)


def test_model_without_a_batch_dimension_gets_max_batch_size_0(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("no_batch_dim")
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [4]
    assert "dynamic_batching" not in config
    assert http.get_model_metadata("no_batch_dim")["inputs"][0]["shape"] == [4]


def test_scalar_per_batch_item_is_dims_1_with_an_empty_reshape(http: httpclient.InferenceServerClient) -> None:
    config = http.get_model_config("scalar_per_item")
    assert config["input"][0]["dims"] == [1]
    assert config["input"][0]["reshape"] == {"shape": []}
    assert config["output"][0]["reshape"] == {"shape": []}
    inp = httpclient.InferInput("INPUT0", [3, 1], "INT64")
    inp.set_data_from_numpy(np.array([[1], [2], [3]], dtype=np.int64))
    result = http.infer("scalar_per_item", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(result, [[2], [3], [4]])


def test_dynamic_batching_is_added_only_when_auto_complete_chooses_max_batch_size(
    http: httpclient.InferenceServerClient,
) -> None:
    assert "dynamic_batching" in http.get_model_config("auto_mlp")
    assert "dynamic_batching" in http.get_model_config("partial_io")
    # A max_batch_size the config states itself comes with no scheduler unless the config names one.
    for model, size in (("partial_mbs", 2), ("batch_of_one", 1)):
        config = http.get_model_config(model)
        assert config["max_batch_size"] == size
        assert "dynamic_batching" not in config


@pytest.fixture(scope="module", params=["--disable-auto-complete-config", "--strict-model-config=true"])
def strict_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("strict_repo")
    mlp(root / "no_config" / "1" / "model.onnx")
    mlp(root / "partial" / "1" / "model.onnx")
    write(root / "partial" / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 4\n')
    mlp(root / "complete" / "1" / "model.onnx")
    write(
        root / "complete" / "config.pbtxt",
        'backend: "onnxruntime"\nmax_batch_size: 4\ninput { name: "input" data_type: TYPE_FP32 dims: [16] }\n'
        'output { name: "probabilities" data_type: TYPE_FP32 dims: [4] }\n',
    )
    running = start_nereid(
        root, request.param, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path_factory.mktemp("logs")
    )
    yield running
    assert running.stop() == 0, running.log()


def test_disabled_auto_complete_needs_a_complete_config(strict_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(strict_server.http_url)
    assert "config.pbtxt" in _reason(http, "no_config")
    reason = _reason(http, "partial")
    assert "'input'" in reason  # the model input the config does not declare
    config = http.get_model_config("complete")
    assert "dynamic_batching" not in config  # nothing is added to a config when auto-complete is off
    inp = httpclient.InferInput("input", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    assert http.infer("complete", [inp]).as_numpy("probabilities").shape == (1, 4)


# ================================================= shapes ================================================
def test_variable_dims_accept_any_size_and_refuse_a_wrong_rank(http: httpclient.InferenceServerClient) -> None:
    for shape in ((1, 3), (2, 7), (5, 1)):
        data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        inp = httpclient.InferInput("INPUT0", list(shape), "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(http.infer("variable", [inp]).as_numpy("OUTPUT0"), data)
    inp = httpclient.InferInput("INPUT0", [1, 2, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 2, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        http.infer("variable", [inp])
    assert "INPUT0" in caught.value.message()


def test_reshape_feeds_the_model_its_own_shape_and_returns_the_config_shape(server: RunningServer) -> None:
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client: Any = module.InferenceServerClient(url)
        inp = module.InferInput("INPUT0", [2, 6], "FP32")
        inp.set_data_from_numpy(data)
        out = client.infer("reshaped", [inp]).as_numpy("OUTPUT0")
        assert out.shape == (2, 6)
        np.testing.assert_array_equal(out, data * 2)
    assert httpclient.InferenceServerClient(server.http_url).get_model_metadata("reshaped")["inputs"][0]["shape"] == [-1, 6]


@pytest.mark.parametrize(
    ("model", "phrases"),
    [("wrong_dtype", ["INPUT0", "TYPE_INT32", "TYPE_FP32"]), ("wrong_shape", ["INPUT0", "[-1,5]", "[-1,4]"])],
)
def test_config_that_contradicts_the_model_file_is_unavailable_with_the_reason(
    http: httpclient.InferenceServerClient, model: str, phrases: list[str]
) -> None:
    reason = _reason(http, model)
    for phrase in phrases:
        assert phrase in reason, reason


# ============================================ instances ============================================
def _compute_infer_ns(server: RunningServer, model: str) -> int:
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_stats"]["compute_infer"]["ns"])


def _pair(server: RunningServer, model: str, iterations: int) -> tuple[float, list[float]]:
    """Send two requests at once; return the wall time for both and each one's own duration."""
    barrier = threading.Barrier(2)
    durations: list[float] = []
    errors: list[str] = []

    def one() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("ITERS", [1], "INT64")
        inp.set_data_from_numpy(np.array([iterations], dtype=np.int64))
        barrier.wait()
        start = time.perf_counter()
        try:
            client.infer(model, [inp], client_timeout=60)
        except InferenceServerException as exc:
            errors.append(str(exc))
        durations.append(time.perf_counter() - start)

    threads = [threading.Thread(target=one) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return time.perf_counter() - start, durations


def _overlap(server: RunningServer, model: str, iterations: int) -> float:
    """Two requests at once: the model's summed execution time over the wall time both took. About 2 when the
    two executions ran at the same time, about 1 when one waited for the other. Load on the machine stretches
    both sides alike, so the ratio holds where plain wall times would not."""
    before = _compute_infer_ns(server, model)
    wall, _ = _pair(server, model, iterations)
    return (_compute_infer_ns(server, model) - before) / 1e9 / wall


def test_instance_group_count_2_runs_two_sessions_concurrently(server: RunningServer) -> None:
    iterations = busy_iterations(server.base, "one_instance", 0.4)
    serial = _overlap(server, "one_instance", iterations)
    # Two CPU-bound runs on a 2-core machine that also runs another test file overlap less than fully (1.48 was
    # seen in a full suite): the better of two tries, against a bar that one instance (about 1.0) cannot reach.
    parallel = max(_overlap(server, "two_instances", iterations) for _ in range(2))
    assert serial < 1.2, f"one instance ran two executions at once? overlap {serial:.2f}"
    assert parallel > 1.35, f"two instances did not overlap: {parallel:.2f} (one instance: {serial:.2f})"
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("two_instances")
    assert stats["model_stats"][0]["execution_count"] >= 2


# ========================================= session options =========================================
@pytest.mark.parametrize(
    ("model", "level"),
    [("graph_level_minus1", "ORT_ENABLE_BASIC"), ("graph_level_1", "ORT_ENABLE_EXTENDED"), ("graph_level_2", "ORT_DISABLE_ALL"), ("auto_mlp", "ORT_ENABLE_ALL")],
)
def test_graph_optimization_level_maps_as_tritons_ort_backend_does(server: RunningServer, model: str, level: str) -> None:
    lines = [line for line in server.log().splitlines() if f"model '{model}': onnxruntime session options" in line]
    assert lines and all(f"graph_optimization_level={level}" in line for line in lines), lines
    if model != "auto_mlp":
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        assert httpclient.InferenceServerClient(server.http_url).infer(model, [inp]).as_numpy("OUTPUT0")[0, 0] == 2.0


def test_bad_session_option_value_is_unavailable_naming_the_problem(http: httpclient.InferenceServerClient) -> None:
    reason = _reason(http, "bad_thread_count")
    assert "many" in reason and "onnxruntime parameter" in reason


def test_thread_count_parameters_size_each_sessions_thread_pools(tmp_path: Path) -> None:
    for name, params in {
        "warmup": "",
        "one_thread": _threads_param("intra_op_thread_count", "1"),
        "six_intra": _threads_param("intra_op_thread_count", "6"),
        "four_inter": _threads_param("intra_op_thread_count", "1")
        + _threads_param("inter_op_thread_count", "4")
        + _threads_param("execution_mode", "1"),
    }.items():
        add_constant(tmp_path / "repo" / name / "1" / "model.onnx", 1.0)
        write(tmp_path / "repo" / name / "config.pbtxt", 'backend: "onnxruntime"\n' + params)
    running = start_nereid(tmp_path / "repo", "--model-control-mode=explicit", "--load-model=warmup", log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(running.http_url)
        process = psutil.Process(running.process.pid)
        added: dict[str, int] = {}
        # The threads a load starts, by id (a thread of something else that ends meanwhile does not count against
        # it); two passes, keeping each model's smaller figure: a thread the server starts for itself during a
        # load (an executor's first worker, say) stays, so it can inflate only the first pass.
        for _ in range(2):
            for name in ("one_thread", "six_intra", "four_inter"):
                before = {thread.id for thread in process.threads()}
                client.load_model(name)
                started = {thread.id for thread in process.threads()} - before
                added[name] = min(added.get(name, 1 << 30), len(started))
            for name in ("one_thread", "six_intra", "four_inter"):
                client.unload_model(name)
        # ORT's pools hold n-1 threads (the caller is the n-th); the parallel executor adds an inter-op pool.
        assert added["six_intra"] - added["one_thread"] == 5, added
        assert added["four_inter"] - added["one_thread"] == 3, added
    finally:
        assert running.stop() == 0, running.log()


# ============================================== GPU ==============================================
@pytest.mark.skipif(
    "CUDAExecutionProvider" in onnxruntime.get_available_providers(), reason="this onnxruntime has CUDA"
)
def test_gpu_instance_without_cuda_is_unavailable_with_a_clear_reason(http: httpclient.InferenceServerClient) -> None:
    reason = _reason(http, "gpu_instance")
    assert "KIND_GPU" in reason and "CUDA" in reason
    assert not http.is_model_ready("gpu_instance")
    with pytest.raises(InferenceServerException):
        http.get_model_metadata("gpu_instance")


def test_only_small_graphs_without_control_flow_may_run_on_the_event_loop(tmp_path: Path) -> None:
    """A tiny model's runs move onto the event loop; a graph with Loop/Scan/If never does, since its run time
    depends on the data (a long run there would stall every other request)."""
    from nereid.backends.onnxruntime_backend import _may_run_inline

    busy_loop(tmp_path / "busy.onnx")
    identity(tmp_path / "identity.onnx", TensorProto.FLOAT, "identity")
    assert not _may_run_inline(tmp_path / "busy.onnx")
    assert _may_run_inline(tmp_path / "identity.onnx")
    assert not _may_run_inline(tmp_path / "missing.onnx")
