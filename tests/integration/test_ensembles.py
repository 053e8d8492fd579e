"""Ensembles (`platform: "ensemble"`) served by a real server and driven with tritonclient over HTTP and
gRPC: pipelines and fan-outs, branches that run at the same time, failing steps, statistics, bad configs,
and the dependency rules of explicit model control (loads, unloads, unload_dependents, reloads)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.integration.onnx_builders import BUSY_WIDTH, busy_iterations, busy_loop, pending_requests, save_model, write
from tests.servers import RunningServer, start_nereid

# -- models ---------------------------------------------------------------------------------------------


def _affine(root: Path, name: str, scale: float, shift: float) -> None:
    """OUT = IN * scale + shift, FP32 [batch, 4]."""
    shape: list[int | str] = ["batch", 4]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["IN", "scale"], ["scaled"]), helper.make_node("Add", ["scaled", "shift"], ["OUT"])],
        name,
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, shape)],
        initializer=[
            numpy_helper.from_array(np.array(scale, np.float32), "scale"),
            numpy_helper.from_array(np.array(shift, np.float32), "shift"),
        ],
    )
    save_model(graph, root / name / "1" / "model.onnx")
    write(root / name / "config.pbtxt", _io_config(name, 8, [("IN", "FP32", [4])], [("OUT", "FP32", [4])]))


def _adder(root: Path, name: str, dims: list[int], max_batch_size: int) -> None:
    """OUT = A + B (FP32): where two branches of a fan-out meet."""
    shape: list[int | str] = (["batch"] if max_batch_size else []) + list(dims)
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["OUT"])],
        name,
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, shape), helper.make_tensor_value_info("B", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, shape)],
    )
    save_model(graph, root / name / "1" / "model.onnx")
    write(root / name / "config.pbtxt", _io_config(name, max_batch_size, [("A", "FP32", dims), ("B", "FP32", dims)], [("OUT", "FP32", dims)]))


def _broken(root: Path, name: str) -> None:
    """Loads fine, but every run fails inside onnxruntime (it gathers column 9 of 4)."""
    shape: list[int | str] = ["batch", 4]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["IN", "columns"], ["OUT"], axis=1)],
        name,
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(np.array([0, 1, 2, 9], np.int64), "columns")],
    )
    save_model(graph, root / name / "1" / "model.onnx")
    write(root / name / "config.pbtxt", _io_config(name, 8, [("IN", "FP32", [4])], [("OUT", "FP32", [4])]))


def _busy(root: Path, name: str, count: int) -> None:
    busy_loop(root / name / "1" / "model.onnx")
    write(
        root / name / "config.pbtxt",
        _io_config(name, 0, [("ITERS", "INT64", [1])], [("STATE", "FP32", [1, BUSY_WIDTH]), ("ITERS_OUT", "INT64", [1])])
        + 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        + f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n",
    )


def _io_config(name: str, max_batch_size: int, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]], platform: str = 'backend: "onnxruntime"') -> str:
    def tensors(items: list[tuple[str, str, list[int]]]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [ {", ".join(map(str, d))} ] }}' for n, t, d in items)

    return f'name: "{name}"\n{platform}\nmax_batch_size: {max_batch_size}\ninput [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def _ensemble(
    root: Path,
    name: str,
    steps: list[str],
    inputs: list[tuple[str, str, list[int]]] | None = None,
    outputs: list[tuple[str, str, list[int]]] | None = None,
    max_batch_size: int = 8,
) -> None:
    text = _io_config(
        name, max_batch_size, inputs or [("X", "FP32", [4])], outputs or [("Y", "FP32", [4])], platform='platform: "ensemble"'
    )
    write(root / name / "config.pbtxt", text + f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n")
    (root / name / "1").mkdir(parents=True, exist_ok=True)


def _pipeline_models(root: Path) -> None:
    """pre (+1) -> scale (x2) -> post (+100): Y = (X + 1) * 2 + 100."""
    _affine(root, "pre", 1.0, 1.0)
    _affine(root, "scale", 2.0, 0.0)
    _affine(root, "post", 1.0, 100.0)
    _ensemble(
        root,
        "pipe",
        [
            _step("pre", {"IN": "X"}, {"OUT": "a"}),
            _step("scale", {"IN": "a"}, {"OUT": "b"}),
            _step("post", {"IN": "b"}, {"OUT": "Y"}),
        ],
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensembles")
    _pipeline_models(root)
    _adder(root, "join", [4], 8)
    # X -> pre -> a -> join(A) ; X -> scale -> b -> join(B) ; a -> post -> SHIFTED
    _ensemble(
        root,
        "fan",
        [
            _step("pre", {"IN": "X"}, {"OUT": "a"}),
            _step("scale", {"IN": "X"}, {"OUT": "b"}),
            _step("join", {"A": "a", "B": "b"}, {"OUT": "SUM"}),
            _step("post", {"IN": "a"}, {"OUT": "SHIFTED"}),
        ],
        outputs=[("SUM", "FP32", [4]), ("SHIFTED", "FP32", [4])],
    )
    _broken(root, "broken")
    # Classification labels come from the model that produced the tensor, through nested ensembles too.
    _affine(root, "labelled", 1.0, 0.0)
    (root / "labelled" / "labels.txt").write_text("".join(f"class{i}\n" for i in range(4)))
    config = root / "labelled" / "config.pbtxt"
    config.write_text(config.read_text().replace('"OUT" data_type: TYPE_FP32 dims: [ 4 ]', '"OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt"'))
    _ensemble(root, "labelled_pipe", [_step("pre", {"IN": "X"}, {"OUT": "a"}), _step("labelled", {"IN": "a"}, {"OUT": "Y"})])
    _ensemble(root, "labelled_nest", [_step("labelled_pipe", {"X": "X"}, {"Y": "Y"})])
    _ensemble(root, "failing", [_step("pre", {"IN": "X"}, {"OUT": "a"}), _step("broken", {"IN": "a"}, {"OUT": "Y"})])
    # Two branches on a slow model, joined: with 2 instances they can run at once, with 1 they cannot.
    _adder(root, "join_state", [1, BUSY_WIDTH], 0)
    for count in (1, 2):
        _busy(root, f"busy{count}", count)
        _ensemble(
            root,
            f"busy_fan{count}",
            [
                _step(f"busy{count}", {"ITERS": "ITERS"}, {"STATE": "left"}),
                _step(f"busy{count}", {"ITERS": "ITERS"}, {"STATE": "right"}),
                _step("join_state", {"A": "left", "B": "right"}, {"OUT": "STATE"}),
            ],
            inputs=[("ITERS", "INT64", [1])],
            outputs=[("STATE", "FP32", [1, BUSY_WIDTH])],
            max_batch_size=0,
        )
    # Configs that must not load, each for a reason the index should state.
    _ensemble(
        root,
        "bad_cycle",
        [
            _step("pre", {"IN": "X"}, {"OUT": "a"}),
            _step("scale", {"IN": "c"}, {"OUT": "b"}),
            _step("post", {"IN": "b"}, {"OUT": "c"}),
            _step("pre", {"IN": "a"}, {"OUT": "Y"}),
        ],
    )
    _ensemble(root, "bad_unproduced", [_step("pre", {"IN": "X"}, {"OUT": "a"}), _step("scale", {"IN": "nowhere"}, {"OUT": "Y"})])
    _ensemble(root, "bad_no_output", [_step("pre", {"IN": "X"}, {"OUT": "a"}), _step("scale", {"IN": "a"}, {"OUT": "b"})])
    _ensemble(root, "bad_unknown_model", [_step("no_such_model", {"IN": "X"}, {"OUT": "Y"})])
    _ensemble(root, "bad_version", [_step("pre", {"IN": "X"}, {"OUT": "Y"}, version=7)])
    _ensemble(root, "bad_dtype", [_step("pre", {"IN": "X"}, {"OUT": "Y"})], inputs=[("X", "INT32", [4])])
    _ensemble(root, "bad_batch", [_step("pre", {"IN": "X"}, {"OUT": "Y"})], max_batch_size=16)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(repo, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


# -- helpers ---------------------------------------------------------------------------------------------
X = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)


def _client(protocol: str, server: RunningServer) -> Any:
    return httpclient.InferenceServerClient(server.http_url) if protocol == "http" else grpcclient.InferenceServerClient(server.grpc_url)


def _infer(protocol: str, server: RunningServer, model: str, data: np.ndarray, outputs: list[str] | None = None, name: str = "X") -> Any:
    module: Any = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput(name, list(data.shape), "FP32" if data.dtype == np.float32 else "INT64")
    tensor.set_data_from_numpy(data)
    requested = [module.InferRequestedOutput(o) for o in outputs] if outputs else None
    return _client(protocol, server).infer(model, [tensor], outputs=requested, request_id="ens-1")


def _stats(server: RunningServer, model: str) -> dict[str, Any]:
    reply = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10)
    reply.raise_for_status()
    return reply.json()["model_stats"][0]


def _success(server: RunningServer, model: str) -> int:
    return int(_stats(server, model)["inference_stats"]["success"]["count"])


# -- inference -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pipeline_runs_preprocess_model_postprocess_in_order(server: RunningServer, protocol: str) -> None:
    result = _infer(protocol, server, "pipe", X)
    np.testing.assert_allclose(result.as_numpy("Y"), (X + 1) * 2 + 100)
    response = result.get_response()
    model_name = response["model_name"] if protocol == "http" else response.model_name
    assert model_name == "pipe"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fan_out_branches_meet_in_a_joining_step(server: RunningServer, protocol: str) -> None:
    result = _infer(protocol, server, "fan", X)
    np.testing.assert_allclose(result.as_numpy("SUM"), (X + 1) + X * 2)
    np.testing.assert_allclose(result.as_numpy("SHIFTED"), X + 101)


def test_asking_for_one_output_runs_only_the_steps_it_needs(server: RunningServer) -> None:
    before = {m: _success(server, m) for m in ("pre", "scale", "join", "post")}
    result = _infer("http", server, "fan", X, outputs=["SHIFTED"])
    np.testing.assert_allclose(result.as_numpy("SHIFTED"), X + 101)
    assert result.as_numpy("SUM") is None
    after = {m: _success(server, m) for m in before}
    assert {m: after[m] - before[m] for m in before} == {"pre": 1, "scale": 0, "join": 0, "post": 1}


def test_metadata_and_config_describe_an_ensemble(server: RunningServer) -> None:
    metadata = httpclient.InferenceServerClient(server.http_url).get_model_metadata("pipe")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    config = grpcclient.InferenceServerClient(server.grpc_url).get_model_config("pipe", as_json=True)["config"]
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["pre", "scale", "post"]
    assert "optimization" not in config and config.get("instance_group", []) == []


def test_parallel_branches_overlap_in_time(server: RunningServer) -> None:
    """The server's own statistics time it: two slow branches that overlap finish in less time than their
    two executions add up to; branches run one after the other cannot. CPU contention stretches both
    sides alike, so the comparison holds on a busy machine."""
    iterations = busy_iterations(server.base, "busy1", 0.2)
    body = np.array([iterations], dtype=np.int64)
    expected = _infer("http", server, "busy1", body, name="ITERS").as_numpy("STATE") * 2

    def run(count: int, watch: Callable[[], None] | None = None) -> float:
        """Run busy_fan<count> once; the ensemble's request time over the sum of its branches' compute time."""
        before = (_stats(server, f"busy_fan{count}"), _stats(server, f"busy{count}"))
        done: queue.Queue[Any] = queue.Queue()

        def call() -> None:
            try:
                done.put(_infer("http", server, f"busy_fan{count}", body, name="ITERS"))
            except Exception as exc:  # surfaced below
                done.put(exc)

        thread = threading.Thread(target=call)
        thread.start()
        if watch is not None:
            watch()
        thread.join(60)
        result = done.get_nowait()
        assert not isinstance(result, Exception), result
        np.testing.assert_allclose(result.as_numpy("STATE"), expected, rtol=1e-5)
        after = (_stats(server, f"busy_fan{count}"), _stats(server, f"busy{count}"))
        request_ns = after[0]["inference_stats"]["success"]["ns"] - before[0]["inference_stats"]["success"]["ns"]
        branches_ns = after[1]["inference_stats"]["compute_infer"]["ns"] - before[1]["inference_stats"]["compute_infer"]["ns"]
        assert after[1]["execution_count"] - before[1]["execution_count"] == 2
        return float(request_ns / branches_ns)

    def both_branches_submitted() -> None:
        # With one instance, one branch executes while the other waits in the model's queue: the ensemble
        # handed both branches over at once rather than one after the other.
        deadline = time.monotonic() + 10
        while pending_requests(server.metrics_port, "busy1") < 1:
            assert time.monotonic() < deadline, "the second branch never queued behind the first"
            time.sleep(0.01)

    # One instance: the branches take turns, so the request lasts at least both executions.
    assert run(1, both_branches_submitted) >= 0.95
    # Two instances: the branches run side by side, so the request lasts about one execution, not two.
    overlapped = min(run(2) for _ in range(3))
    assert overlapped < 0.8, overlapped


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_the_request_and_names_the_step(server: RunningServer, protocol: str) -> None:
    with pytest.raises(InferenceServerException) as failed:
        _infer(protocol, server, "failing", X)
    message = failed.value.message()
    assert message.startswith("in ensemble 'failing', model 'broken': onnxruntime failed to run the model"), message
    assert failed.value.status() in ("500", "StatusCode.INTERNAL")
    # The server keeps serving the ensembles around it.
    np.testing.assert_allclose(_infer(protocol, server, "pipe", X).as_numpy("Y"), (X + 1) * 2 + 100)


def test_statistics_are_kept_per_ensemble_and_per_step(server: RunningServer) -> None:
    models = ("pipe", "pre", "scale", "post")
    before = {m: _stats(server, m) for m in models}
    for _ in range(3):
        _infer("grpc", server, "pipe", X)
    after = {m: _stats(server, m) for m in models}
    for model in models:
        gained = after[model]["inference_stats"]["success"]["count"] - before[model]["inference_stats"]["success"]["count"]
        assert gained == 3, model
        assert after[model]["inference_count"] - before[model]["inference_count"] == 6, model  # batch of 2
    pipe = after["pipe"]
    assert pipe["inference_stats"]["queue"]["count"] - before["pipe"]["inference_stats"]["queue"]["count"] == 3
    assert pipe["execution_count"] - before["pipe"]["execution_count"] == 3
    # The ensemble's compute time is its steps' compute time, and its request time covers them.
    step_infer = sum(after[m]["inference_stats"]["compute_infer"]["ns"] - before[m]["inference_stats"]["compute_infer"]["ns"] for m in models[1:])
    pipe_infer = pipe["inference_stats"]["compute_infer"]["ns"] - before["pipe"]["inference_stats"]["compute_infer"]["ns"]
    assert pipe_infer == step_infer > 0
    assert [b["batch_size"] for b in pipe["batch_stats"]] == [2]

    failed_before = _stats(server, "failing")["inference_stats"]
    with pytest.raises(InferenceServerException):
        _infer("http", server, "failing", X)
    failed_after = _stats(server, "failing")["inference_stats"]
    assert failed_after["fail"]["count"] - failed_before["fail"]["count"] == 1
    assert failed_after["success"]["count"] == failed_before["success"]["count"]


# Placed after the statistics test, whose batch-size counts its batch-1 requests would change.
def test_an_ensemble_answers_with_its_requests_sequence_as_triton_does(server: RunningServer) -> None:
    """Triton 2.51 (asked): sequence_id, sequence_start and sequence_end on each ensemble response, 0 and false for a
    request of no sequence, and triton_final_response on each streamed one (L0_simple_ensemble's test_ensemble_sequence_flags reads them from a gRPC stream)."""
    reply = requests.post(f"{server.base}/v2/models/pipe/infer", json={"inputs": [
        {"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}, timeout=10)  # fmt: skip
    assert reply.json()["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    tensor = grpcclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(X[:1])
    seen = []
    try:
        for start, end in ((True, False), (False, False), (False, True)):
            client.async_stream_infer("pipe", [tensor], sequence_id=42, sequence_start=start, sequence_end=end)
            parameters = answers.get(timeout=10).get_response().parameters
            flags = (parameters["sequence_start"].bool_param, parameters["sequence_end"].bool_param)
            # Triton 2.51 marks every streamed response final or not, a model's that is not decoupled too (asked)
            seen.append((parameters["sequence_id"].int64_param, *flags, parameters["triton_final_response"].bool_param))
    finally:
        client.stop_stream()
    assert seen == [(42, True, False, True), (42, False, False, True), (42, False, True, True)]


@pytest.mark.parametrize("model", ["labelled_pipe", "labelled_nest"])
def test_classification_of_an_ensemble_output_uses_the_producing_models_labels(server: RunningServer, model: str) -> None:
    """Triton's label provider (qa/L0_infer's class and ensemble label tests): an ensemble without a label file of its
    own labels an output with the labels of the model that produced it, through nested ensembles too."""
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[0, 3, 1, 2]], np.float32))  # `pre` adds 1, `labelled` passes it on
    result = httpclient.InferenceServerClient(server.http_url).infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("Y", class_count=2)])
    assert result.as_numpy("Y").tolist() == [[b"4.000000:1:class1", b"3.000000:3:class3"]]


def test_bad_ensemble_configs_are_unavailable_with_reasons_in_the_index(server: RunningServer) -> None:
    index = {e["name"]: e for e in httpclient.InferenceServerClient(server.http_url).get_model_repository_index()}
    expected = {
        "bad_cycle": ["ensemble tensor 'b' is unused in ensemble 'bad_cycle'", "cycle", "'scale'", "'post'"],
        "bad_unproduced": ["output 'Y' for ensemble 'bad_unproduced' is not written", "'nowhere', is not connected"],
        "bad_no_output": ["ensemble output 'Y' for ensemble bad_no_output' is not used"],
        "bad_unknown_model": ["ensemble bad_unknown_model contains models that are not available or ambiguous: no_such_model"],
        "bad_version": ["ensemble 'bad_version' depends on 'pre' whose required version 7 is not loaded."],
        "bad_dtype": ["in ensemble bad_dtype, ensemble tensor X: inconsistent data type: TYPE_INT32 is inferred from model bad_dtype while TYPE_FP32 is inferred from model pre"],
        "bad_batch": ["ensemble bad_batch allows maximum batch size 16, but it contains model pre which only allows maximum batch size to be 8"],
    }
    for name, fragments in expected.items():
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        for fragment in fragments:
            assert fragment in entry["reason"], (name, entry["reason"])
        assert not httpclient.InferenceServerClient(server.http_url).is_model_ready(name)
    for good in ("pipe", "fan", "failing", "busy_fan1", "busy_fan2"):
        assert index[good]["state"] == "READY"


# -- explicit model control: loads, unloads and reloads follow the dependencies ---------------------------
_REPEAT_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x + i).astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensembles_explicit")
    _pipeline_models(root)
    _ensemble(root, "twice", [_step("scale", {"IN": "X"}, {"OUT": "a"}), _step("scale", {"IN": "a"}, {"OUT": "Y"})])
    write(root / "repeat_py" / "1" / "model.py", _REPEAT_PY)
    write(
        root / "repeat_py" / "config.pbtxt",
        _io_config("repeat_py", 8, [("IN", "FP32", [4])], [("OUT", "FP32", [4])], platform='backend: "python"')
        + "model_transaction_policy { decoupled: true }\n",
    )
    _ensemble(
        root,
        "streaming",
        [
            _step("pre", {"IN": "X"}, {"OUT": "a"}),
            _step("repeat_py", {"IN": "a"}, {"OUT": "b"}),
            _step("post", {"IN": "b"}, {"OUT": "Y"}),
        ],
    )
    return root


@pytest.fixture(scope="module")
def explicit(explicit_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(explicit_repo, "--model-control-mode=explicit", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def _states(server: RunningServer) -> dict[str, str]:
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    return {e["name"]: e.get("state", "") for e in index}


def _unload_all(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for name in ("pipe", "twice", "streaming", "pre", "scale", "post", "repeat_py"):
        client.unload_model(name)


def test_loading_an_ensemble_loads_its_composing_models(explicit: RunningServer) -> None:
    _unload_all(explicit)
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    client.load_model("pipe")
    states = _states(explicit)
    assert {m: states[m] for m in ("pipe", "pre", "scale", "post")} == dict.fromkeys(("pipe", "pre", "scale", "post"), "READY")
    np.testing.assert_allclose(_infer("grpc", explicit, "pipe", X).as_numpy("Y"), (X + 1) * 2 + 100)


@pytest.mark.parametrize("unload_dependents", [True, False])
def test_unloading_a_composing_model_unloads_the_ensembles_that_use_it(explicit: RunningServer, unload_dependents: bool) -> None:
    # Triton unloads them with or without unload_dependents: an ensemble cannot run without its steps.
    _unload_all(explicit)
    client = httpclient.InferenceServerClient(explicit.http_url)
    client.load_model("pipe")
    client.load_model("twice")
    client.unload_model("pre", unload_dependents=unload_dependents)
    states = _states(explicit)
    assert states["pipe"] == "UNAVAILABLE" and states["pre"] == "UNAVAILABLE"
    assert states["twice"] == "READY" and states["scale"] == "READY"  # 'twice' does not use 'pre'
    assert states["post"] == "READY"
    assert not client.is_model_ready("pipe")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unload_dependents_of_an_ensemble_unloads_models_loaded_only_for_it(explicit: RunningServer, protocol: str) -> None:
    _unload_all(explicit)
    client = _client(protocol, explicit)
    client.load_model("post")  # asked for by name: stays
    client.load_model("twice")  # uses 'scale' too: keeps it
    client.load_model("pipe")
    client.unload_model("pipe", unload_dependents=True)
    states = _states(explicit)
    assert states["pipe"] == "UNAVAILABLE" and states["pre"] == "UNAVAILABLE"
    assert states["post"] == "READY" and states["scale"] == "READY" and states["twice"] == "READY"
    # Without unload_dependents, unloading an ensemble leaves its composing models loaded.
    client.load_model("pipe")
    client.unload_model("pipe")
    states = _states(explicit)
    assert states["pipe"] == "UNAVAILABLE" and states["pre"] == "READY"


def test_reloading_a_composing_model_keeps_the_ensemble_working(explicit: RunningServer) -> None:
    _unload_all(explicit)
    client = httpclient.InferenceServerClient(explicit.http_url)
    client.load_model("pipe")
    np.testing.assert_allclose(_infer("http", explicit, "pipe", X).as_numpy("Y"), (X + 1) * 2 + 100)
    client.load_model("scale")  # a reload of a model the ensemble uses
    assert client.is_model_ready("pipe")
    np.testing.assert_allclose(_infer("http", explicit, "pipe", X).as_numpy("Y"), (X + 1) * 2 + 100)
    assert _stats(explicit, "scale")["inference_stats"]["success"]["count"] == 1  # the new version served it


def test_a_decoupled_step_streams_through_the_ensemble(explicit: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    client.load_model("streaming")
    assert client.get_model_config("streaming", as_json=True)["config"]["model_transaction_policy"] == {"decoupled": True}
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        tensor = grpcclient.InferInput("X", [2, 4], "FP32")
        tensor.set_data_from_numpy(X)
        client.async_stream_infer("streaming", [tensor], request_id="stream-1", enable_empty_final_response=True)
        values = []
        while True:
            result, error = results.get(timeout=30)
            if error is not None:
                raise AssertionError(str(error))
            response = result.get_response()
            assert response.id == "stream-1"
            if response.outputs:
                values.append(result.as_numpy("Y"))
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert len(values) == 3
    for i, value in enumerate(values):
        np.testing.assert_allclose(value, X + 1 + i + 100)
    with pytest.raises(InferenceServerException, match="decoupled"):
        _infer("http", explicit, "streaming", X)


def test_the_example_repository_serves_its_ensemble(example_server: RunningServer) -> None:
    a = np.linspace(-3.2, 3.2, 16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.6, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = httpclient.InferenceServerClient(example_server.http_url).infer("simple_ensemble", inputs)
    np.testing.assert_array_equal(result.as_numpy("SUM"), np.round(a) + np.round(b))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), np.round(a) - np.round(b))
