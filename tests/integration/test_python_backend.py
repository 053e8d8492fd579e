"""The Python backend through the official clients: Triton model.py files served unmodified by `nereid serve`.

One server indexes tests/models/python (every model a Triton user could have written) for the whole module.
"""

from __future__ import annotations

import json
import os
import queue
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.grpc_streams import repeat_inputs, stream
from tests.servers import ROOT, RunningServer, start_nereid

REPOSITORY = ROOT / "tests" / "models" / "python"
DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(
        REPOSITORY,
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--log-verbose=1",
        f"--http-max-input-size={256 * 1024 * 1024}",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield running
    assert running.stop() == 0, running.log()


def _clients(server: RunningServer) -> list[tuple[Any, Any]]:
    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=120)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


def _input(module: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _bytes_input(module: Any, name: str, values: list[bytes], shape: list[int]) -> Any:
    return _input(module, name, np.array(values, dtype=np.object_).reshape(shape), "BYTES")


def _infer_raw(server: RunningServer, model: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=60)


def _mode_body(mode: str) -> dict[str, Any]:
    return {"inputs": [{"name": "MODE", "shape": [1, 1], "datatype": "BYTES", "data": [mode]}]}


# -- plain inference ------------------------------------------------------------------------------------------
def test_add_sub_model_runs_unmodified_over_http_and_grpc(server: RunningServer) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, dtype=np.float32)
    for module, client in _clients(server):
        result = client.infer("add_sub", [_input(module, "INPUT0", a, "FP32"), _input(module, "INPUT1", b, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_add_sub_over_http_json(server: RunningServer) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }
    reply = _infer_raw(server, "add_sub", body)
    assert reply.status_code == 200, reply.text
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    assert outputs["OUTPUT0"] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [2.0, 3.0, 4.0, 5.0]}
    assert outputs["OUTPUT1"]["data"] == [0.0, 1.0, 2.0, 3.0]


def test_bytes_inputs_and_outputs_round_trip(server: RunningServer) -> None:
    values = ["héllo".encode(), b"", b"abc\x00def", b"x" * 1000]
    for module, client in _clients(server):
        result = client.infer("bytes_io", [_bytes_input(module, "TEXT", values, [1, 4])])
        upper = result.as_numpy("UPPER")
        assert upper.shape == (1, 4)
        assert [v for v in upper.reshape(-1)] == ["HÉLLO".encode(), b"", b"ABC\x00DEF", b"X" * 1000]
        np.testing.assert_array_equal(result.as_numpy("LENGTH"), [[len(v) for v in values]])


def _sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        return np.array([f"item-{i}".encode() * (i % 3) for i in range(count)], dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 2 == 0).reshape(shape)
    dtype = np.dtype(DTYPES[datatype])
    if dtype.kind == "f":
        return rng.standard_normal(count).astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    return np.array([info.min, info.max, 0, 1, 7][: max(count, 0)] + [5] * max(count - 5, 0), dtype=dtype).reshape(shape)


def test_every_data_type_round_trips_through_the_worker(server: RunningServer) -> None:
    arrays = {t: _sample(t, (5,)) for t in DTYPES}
    for module, client in _clients(server):
        inputs = [_input(module, f"IN_{'STRING' if t == 'BYTES' else t}", a, t) for t, a in arrays.items()]
        result = client.infer("dtypes", inputs)
        for datatype, array in arrays.items():
            got = result.as_numpy(f"OUT_{'STRING' if datatype == 'BYTES' else datatype}")
            assert got.dtype == array.dtype or datatype == "BYTES", datatype
            assert got.shape == array.shape, datatype
            assert list(got.reshape(-1)) == list(array.reshape(-1)), datatype


def test_zero_size_tensors_round_trip(server: RunningServer) -> None:
    for module, client in _clients(server):
        inputs = [
            _input(module, "IN_FP32", np.zeros((0,), np.float32), "FP32"),
            _input(module, "IN_STRING", np.zeros((0,), np.object_), "BYTES"),
        ]
        result = client.infer("dtypes", inputs)
        assert result.as_numpy("OUT_FP32").shape == (0,)
        assert result.as_numpy("OUT_STRING").shape == (0,)


def test_a_64_megabyte_tensor_round_trips(server: RunningServer) -> None:
    big = np.random.default_rng(3).standard_normal(16 * 1024 * 1024 + 3).astype(np.float32)  # just over 64 MiB
    for module, client in _clients(server):
        result = client.infer("dtypes", [_input(module, "IN_FP32", big, "FP32")])
        out = result.as_numpy("OUT_FP32")
        assert out.shape == big.shape
        assert np.array_equal(out, big)
    # The arenas grew for it; small requests keep working on the same workers.
    a = np.ones((1, 4), np.float32)
    result = _clients(server)[1][1].infer("add_sub", [_input(grpcclient, "INPUT0", a, "FP32"), _input(grpcclient, "INPUT1", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_dlpack_round_trip(server: RunningServer) -> None:
    data = np.arange(6, dtype=np.float32)
    result = _clients(server)[0][1].infer("dlpack", [_input(httpclient, "IN", data, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)


def test_bf16_tensors_travel_through_dlpack_as_torch_bfloat16(server: RunningServer) -> None:
    pytest.importorskip("torch")
    data = np.array([1.5, -2.0, 0.0, 256.0], np.float32)  # all exact in bfloat16
    for module, client in _clients(server):
        result = client.infer("bf16", [_input(module, "IN", data, "BF16")])
        np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)


# -- what the model sees of a request ---------------------------------------------------------------------------
def _request_info(module: Any, client: Any, **kwargs: Any) -> dict[str, Any]:
    result = client.infer("request_info", [_input(module, "IN", np.array([1], np.int32), "INT32")], **kwargs)
    info: dict[str, Any] = {}
    for name in ("PARAMETERS", "REQUEST_ID", "CORRELATION_ID", "REQUESTED"):
        value = result.as_numpy(name)
        if value is not None:
            info[name] = value[0].decode()
    for name in ("FLAGS", "TIMEOUT"):
        value = result.as_numpy(name)
        if value is not None:
            info[name] = int(value[0])
    return info


def test_request_id_parameters_correlation_id_flags_and_timeout_reach_the_model(server: RunningServer) -> None:
    for module, client in _clients(server):
        info = _request_info(
            module,
            client,
            request_id="req-7",
            sequence_id=42,
            sequence_start=True,
            timeout=12_000_000,
            parameters={"custom": "yes", "n": 3, "flag": True},
        )
        assert json.loads(info["PARAMETERS"]) == {"custom": "yes", "n": 3, "flag": True}, module.__name__
        assert info["REQUEST_ID"] == "req-7"
        assert info["CORRELATION_ID"] == "42"
        assert info["FLAGS"] == 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        assert info["TIMEOUT"] == 12_000_000
        assert info["REQUESTED"] == "CORRELATION_ID,FLAGS,PARAMETERS,REQUESTED,REQUEST_ID,TIMEOUT"


def test_requested_output_names_are_what_the_client_asked_for(server: RunningServer) -> None:
    for module, client in _clients(server):
        outputs = [module.InferRequestedOutput("REQUESTED"), module.InferRequestedOutput("FLAGS")]
        result = client.infer("request_info", [_input(module, "IN", np.array([1], np.int32), "INT32")], outputs=outputs)
        assert result.as_numpy("REQUESTED")[0] == b"FLAGS,REQUESTED"
        assert result.as_numpy("PARAMETERS") is None  # not asked for, so not sent


def test_response_parameters_reach_the_client(server: RunningServer) -> None:
    body = {
        "inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}],
        "parameters": {"respond_with_parameters": True},
    }
    reply = _infer_raw(server, "request_info", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["parameters"] == {"echo": "yes", "count": 3, "flag": True}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer(
        "request_info",
        [_input(grpcclient, "IN", np.array([1], np.int32), "INT32")],
        parameters={"respond_with_parameters": True},
    )
    params = result.get_response().parameters
    assert params["echo"].string_param == "yes"
    assert params["count"].int64_param == 3
    assert params["flag"].bool_param is True


def test_initialize_receives_tritons_arguments(server: RunningServer) -> None:
    result = _clients(server)[0][1].infer("init_args", [_input(httpclient, "IN", np.array([1], np.int32), "INT32")])
    reply = json.loads(result.as_numpy("ARGS")[0])
    args, helpers = reply["args"], reply["helpers"]
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert args["model_name"] == "init_args"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == "init_args_0"
    assert args["model_repository"] == str(REPOSITORY / "init_args")
    config = json.loads(args["model_config"])
    assert config["name"] == "init_args" and config["parameters"] == {"greeting": {"string_value": "hello"}}
    assert helpers["input"]["name"] == "IN" and helpers["input"]["data_type"] == "TYPE_INT32"
    assert helpers["output"]["name"] == "ARGS" and helpers["missing"] is None
    assert helpers["decoupled"] is False
    assert helpers["fp32"] == "float32" and helpers["code_of_int64"] == 9 and helpers["type_of_13"] == "object_"
    assert helpers["error_codes"] == [0, 1, 3]
    assert helpers["flags"] == [1, 1]


# -- auto-complete -------------------------------------------------------------------------------------------------
def test_auto_complete_config_fills_in_a_model_without_config_pbtxt(server: RunningServer) -> None:
    config = requests.get(f"{server.base}/v2/models/auto_complete/config", timeout=10).json()
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 16
    assert [(i["name"], i["data_type"], i["dims"], i["optional"]) for i in config["input"]] == [
        ("A", "TYPE_FP32", [4], False),
        ("B", "TYPE_INT32", [-1], True),
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("SUM", "TYPE_FP32", [1])]
    assert "dynamic_batching" in config
    assert config["model_transaction_policy"] == {"decoupled": False}
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = _clients(server)[1][1].infer("auto_complete", [_input(grpcclient, "A", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("SUM"), a.sum(axis=1, keepdims=True))


# -- errors ------------------------------------------------------------------------------------------------------
def test_an_exception_in_execute_fails_the_request_with_its_message(server: RunningServer) -> None:
    reply = _infer_raw(server, "errors", _mode_body("raise"))
    assert reply.status_code == 500
    message = reply.json()["error"]
    assert "ValueError: execute exploded" in message
    assert "model.py" in message and "execute" in message
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("errors", [_bytes_input(grpcclient, "MODE", [b"model_exception"], [1, 1])])
    assert caught.value.status() == "StatusCode.INTERNAL"
    assert "TritonModelException: the model refuses" in caught.value.message()


@pytest.mark.parametrize(
    ("code", "http", "grpc"),
    [
        ("INVALID_ARG", 400, "INVALID_ARGUMENT"),
        ("NOT_FOUND", 404, "NOT_FOUND"),
        ("UNAVAILABLE", 503, "UNAVAILABLE"),
        ("UNSUPPORTED", 501, "UNIMPLEMENTED"),
        ("INTERNAL", 500, "INTERNAL"),
        ("ALREADY_EXISTS", 400, "ALREADY_EXISTS"),
        ("CANCELLED", 400, "CANCELLED"),
        ("UNKNOWN", 400, "UNKNOWN"),
    ],
)
def test_error_responses_carry_their_triton_error_code(server: RunningServer, code: str, http: int, grpc: str) -> None:
    reply = _infer_raw(server, "errors", _mode_body(f"code:{code}"))
    assert (reply.status_code, reply.json()) == (http, {"error": "custom error"})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("errors", [_bytes_input(grpcclient, "MODE", [f"code:{code}".encode()], [1, 1])])
    assert caught.value.status() == f"StatusCode.{grpc}"
    assert caught.value.message() == "custom error"


def test_a_triton_error_without_a_code_is_internal(server: RunningServer) -> None:
    reply = _infer_raw(server, "errors", _mode_body("default_code"))
    assert (reply.status_code, reply.json()) == (500, {"error": "default code error"})


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("too_few", "returned 0 responses for 1 requests"),
        ("too_many", "returned 2 responses for 1 requests"),
        ("none", "returned None"),
        ("wrong_type", "returned a str for request 0"),
    ],
)
def test_wrong_responses_from_execute_are_clear_errors(server: RunningServer, mode: str, expected: str) -> None:
    reply = _infer_raw(server, "errors", _mode_body(mode))
    assert reply.status_code == 500
    assert expected in reply.json()["error"]
    assert "[model 'errors' version 1]" in reply.json()["error"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("sender", "Unable to send response. Non-decoupled model cannot send complete final before sending a response.")],
)
def test_a_misused_response_sender_is_a_clear_error(server: RunningServer, mode: str, expected: str) -> None:
    reply = _infer_raw(server, "errors", _mode_body(mode))
    assert reply.status_code == 500
    assert expected in reply.json()["error"]
    assert "TritonModelException" in reply.json()["error"]


def test_auto_complete_that_contradicts_the_configuration_fails_the_load(server: RunningServer) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
    entry = next(e for e in index if e["name"] == "auto_complete_conflict")
    assert entry["state"] == "UNAVAILABLE"
    assert "ValueError" in entry["reason"] and "max_batch_size 8" in entry["reason"]
    assert "model.py" in entry["reason"]


def test_outputs_the_client_did_not_ask_for_are_dropped(server: RunningServer) -> None:
    reply = _infer_raw(server, "errors", _mode_body("extra_output"))
    assert [o["name"] for o in reply.json()["outputs"]] == ["OUT"]
    body = _mode_body("both") | {"outputs": [{"name": "OUT2"}]}
    reply = _infer_raw(server, "errors", body)
    assert reply.json()["outputs"] == [{"name": "OUT2", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}]


def test_an_error_response_for_one_request_leaves_the_rest_of_its_batch_alone(server: RunningServer) -> None:
    def call(mode: bytes) -> requests.Response:
        body = {"inputs": [{"name": "MODE", "shape": [1, 1], "datatype": "BYTES", "data": [mode.decode()]}]}
        return _infer_raw(server, "batch_errors", body)

    with ThreadPoolExecutor(2) as pool:
        failing, passing = pool.map(call, [b"fail", b"pass"])
    assert failing.status_code == 400
    assert failing.json() == {"error": "this request was asked to fail"}
    assert passing.status_code == 200, passing.text
    # Both arrived in one batch of two, and only the one that asked to fail did.
    assert passing.json()["outputs"][0]["data"] == [2]


def test_a_model_whose_initialize_raises_is_unavailable_with_the_reason(server: RunningServer) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
    entry = next(e for e in index if e["name"] == "init_fail")
    assert entry["state"] == "UNAVAILABLE"
    assert "ValueError: initialize exploded on purpose" in entry["reason"]
    assert requests.get(f"{server.base}/v2/models/init_fail/ready", timeout=10).status_code != 200
    # The other models of the repository load regardless.
    assert requests.get(f"{server.base}/v2/models/add_sub/ready", timeout=10).status_code == 200


# -- observability -------------------------------------------------------------------------------------------------
def _metrics(server: RunningServer) -> str:
    return requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text


def _sample_value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def test_custom_metrics_appear_on_the_metrics_port(server: RunningServer) -> None:
    client = _clients(server)[0][1]
    counts = []
    for value in (0.5, 1.5, 4.0):
        result = client.infer("custom_metrics", [_input(httpclient, "VALUE", np.array([value], np.float32), "FP32")])
        counts.append(float(result.as_numpy("COUNT")[0]))
    assert counts[1] == counts[0] + 1 and counts[2] == counts[0] + 2  # value() reads the server's count back
    text = _metrics(server)
    labels = {"model": "custom_metrics", "version": "1"}
    assert "# TYPE custom_requests_seen counter" in text
    assert _sample_value(text, "custom_requests_seen", **labels) == counts[2]
    assert _sample_value(text, "custom_last_value", **labels) == 4.0
    assert "# TYPE custom_value_histogram histogram" in text
    total = _sample_value(text, "custom_value_histogram_count", **labels)
    assert total is not None and total >= 3
    le_1 = _sample_value(text, "custom_value_histogram_bucket", le="1", **labels)
    le_2 = _sample_value(text, "custom_value_histogram_bucket", le="2", **labels)
    le_5 = _sample_value(text, "custom_value_histogram_bucket", le="5", **labels)
    assert le_1 is not None and le_2 is not None and le_5 is not None
    assert le_2 - le_1 >= 1 and le_5 - le_2 >= 1
    assert _sample_value(text, "custom_value_histogram_bucket", le="+Inf", **labels) == total


def test_model_logs_reach_the_server_log_with_their_level_and_origin(server: RunningServer) -> None:
    marker = f"marker-{time.monotonic_ns()}"
    _clients(server)[1][1].infer("logging", [_bytes_input(grpcclient, "MARKER", [marker.encode()], [1])])
    deadline = time.monotonic() + 10
    expected = {f"info {marker}": "I", f"warn {marker}": "W", f"error {marker}": "E", f"verbose {marker}": "I"}
    found: dict[str, str] = {}
    while time.monotonic() < deadline and len(found) < len(expected):
        for line in server.log().splitlines():
            for text in expected:
                if line.endswith(f'] "{text}"') and "model.py:" in line:  # quoted, as Triton writes messages
                    found[text] = line[0]
    assert found == expected
    assert "logging model initialized" in server.log()


# -- decoupled models and response senders -----------------------------------------------------------------------
@pytest.mark.parametrize("threaded", [False, True], ids=["from_execute", "from_a_thread_after_execute"])
def test_a_decoupled_model_streams_its_responses_then_a_final_flag(server: RunningServer, threaded: bool) -> None:
    responses = stream(server, "repeat", repeat_inputs([5, 6, 7], threaded=threaded), ["OUT", "IDX"])
    assert [(int(r[0]["OUT"][0]), int(r[0]["IDX"][0]), r[1]) for r in responses[:-1]] == [
        (5, 0, False),
        (6, 1, False),
        (7, 2, False),
    ]
    assert responses[-1] == ({}, True)  # the bare final flag


def test_a_decoupled_models_streamed_responses_say_they_are_not_final(server: RunningServer) -> None:
    """Triton 2.51 (asked) marks each response of a decoupled model with triton_final_response, even when the client
    did not ask for empty final responses (qa/L0_backend_python/parameters counts on it)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", repeat_inputs([4, 5]))
        marks = []
        for _ in range(2):
            result, error = results.get(timeout=60)
            assert error is None, error
            marks.append(dict(result.get_response().parameters)["triton_final_response"].bool_param)
    finally:
        client.stop_stream()
        client.close()
    assert marks == [False, False]


def test_a_decoupled_model_may_send_no_response_at_all(server: RunningServer) -> None:
    assert stream(server, "repeat", [_input(grpcclient, "IN", np.zeros(0, np.int32), "INT32")]) == [({}, True)]


def test_an_error_response_in_a_stream_leaves_the_others(server: RunningServer) -> None:
    responses = stream(server, "repeat", repeat_inputs([1, -1, 2]), ["OUT"])
    assert responses[1] == "negative element -1"
    assert [int(r[0]["OUT"][0]) for r in (responses[0], responses[2])] == [1, 2]
    assert responses[-1] == ({}, True)


def test_large_streamed_responses_reuse_the_shared_memory(server: RunningServer) -> None:
    size = 2 * 1024 * 1024  # 8 MiB per response, 64 MiB in all
    responses = stream(server, "repeat", repeat_inputs(list(range(8)), data_size=size), ["DATA"])
    assert len(responses) == 9
    for value, (outputs, final) in enumerate(responses[:-1]):
        assert not final and outputs["DATA"].shape == (size,)
        assert outputs["DATA"][0] == value and outputs["DATA"][-1] == value


def test_many_streams_at_once_each_get_their_own_responses(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request in range(6):
            values = [request * 10 + i for i in range(request + 1)]
            client.async_stream_infer(
                "repeat", repeat_inputs(values, threaded=request % 2 == 1), request_id=f"r{request}",
                enable_empty_final_response=True,
            )
        seen: dict[str, list[int]] = {f"r{r}": [] for r in range(6)}
        finals = 0
        while finals < 6:
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
            else:
                seen[response.id].append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert seen == {f"r{r}": [r * 10 + i for i in range(r + 1)] for r in range(6)}


def test_a_decoupled_requests_inputs_outlive_execute_until_its_thread_reads_them(server: RunningServer) -> None:
    """Triton's L0_backend_python/decoupled (decoupled_bls_stream): a thread answers after execute() has returned,
    reading the array as_numpy() gave; the next request's inputs must not overwrite it."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", repeat_inputs([7, 8, 9], threaded=True, after_next=True), request_id="late")
        client.async_stream_infer("repeat", repeat_inputs([1, 2, 3]), request_id="next")
        seen: dict[str, list[int]] = {"late": [], "next": []}
        while len(seen["late"]) + len(seen["next"]) < 6:
            result, error = results.get(timeout=60)
            assert error is None, error
            seen[result.get_response().id].append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert seen == {"late": [7, 8, 9], "next": [1, 2, 3]}


def test_a_cancelled_stream_is_seen_by_the_sender(server: RunningServer) -> None:
    tag = f"stream-{time.monotonic_ns()}"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("cancellable", [_bytes_input(grpcclient, "TAG", [tag.encode()], [1])])
        for expected in range(2):
            result, error = results.get(timeout=30)
            assert error is None and int(result.as_numpy("OUT")[0]) == expected
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    deadline = time.monotonic() + 10
    while f"{tag} cancelled after" not in server.log():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)
    line = next(line for line in server.log().splitlines() if f"{tag} cancelled after" in line)
    assert line.endswith('(request says True)"')


@pytest.mark.parametrize("mode", [0, 1, 2, 3], ids=["with_final", "then_final", "twice", "and_returns_one"])
def test_a_model_that_is_not_decoupled_may_answer_through_its_sender(server: RunningServer, mode: int) -> None:
    """As Triton's L0_backend_python/response_sender: the response first sent through the sender is the request's,
    with the final flag or after it; a second one is refused and a returned one dropped."""
    values = np.array([1.5, -2.0, 3.0], np.float32)
    for module, client in _clients(server):
        inputs = [_input(module, "IN", values, "FP32"), _input(module, "MODE", np.array([mode], np.int32), "INT32")]
        result = client.infer("single_sender", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUT"), values * values)


def _late(module: Any, client: Any, value: float, mode: int) -> Any:
    inputs = [
        _input(module, "IN", np.array([[value]], np.float32), "FP32"),
        _input(module, "MODE", np.array([[mode]], np.int32), "INT32"),
    ]
    return client.infer("late_sender", inputs)


def test_a_model_that_is_not_decoupled_may_answer_after_execute_returned(server: RunningServer) -> None:
    """As Triton's response_sender test_non_decoupled_one_response_post_return: execute() returns None and a thread
    sends the response, then the final flag, later; the request completes then."""
    for module, client in _clients(server):
        result = _late(module, client, 1.5, 0)
        assert result.as_numpy("OUT").tolist() == [[3.0]]


def test_requests_of_one_batch_answered_after_execute_returned_and_on_return_all_complete(server: RunningServer) -> None:
    """As test_non_decoupled_multiple_requests: in one batch, execute() returns a response for one request and None for
    the others, which its thread answers later; a request whose sender the thread drops unused fails, not hangs."""

    def call(args: tuple[float, int]) -> Any:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
        try:
            return _late(httpclient, client, *args)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(call, [(1.0, 0), (2.0, 1), (3.0, 2)]))
    for answer, expected in zip(answers[:2], [2.0, 4.0], strict=True):
        assert not isinstance(answer, Exception), answer
        assert answer.as_numpy("OUT").tolist() == [[expected]]
        assert answer.as_numpy("COUNT").tolist() == [[3]]  # the three were one batch
    assert isinstance(answers[2], InferenceServerException)
    assert "response sender of request" in str(answers[2].message())
    assert "was deleted before it sent a response with the final flag" in str(answers[2].message())

# -- instances ---------------------------------------------------------------------------------------------------
def test_two_instances_execute_at_the_same_time_in_two_processes(server: RunningServer) -> None:
    def call(_: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        seconds = np.array([0.6], np.float32)
        return client.infer("concurrent", [_input(httpclient, "SECONDS", seconds, "FP32")]).as_numpy("SPAN")

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(call, range(2))
    elapsed = time.monotonic() - started
    assert first[0] != second[0]  # two worker processes
    overlap = min(first[2], second[2]) - max(first[1], second[1])
    assert overlap > 0.3, (first, second)
    assert elapsed < 1.15  # not one after the other (2 x 0.6 s)


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_lone_requests_are_fast_and_leave_the_server_idle(server: RunningServer) -> None:
    """A lone request's wait for its worker keeps the event loop polling (HotLoop); once answered, the server
    must go back to sleep, not keep burning a core."""
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [_input(httpclient, name, np.ones((1, 4), np.float32), "FP32") for name in ("INPUT0", "INPUT1")]
    for _ in range(50):
        assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    time.sleep(0.05)
    before = _cpu_seconds(server.process.pid)
    time.sleep(1.0)
    assert _cpu_seconds(server.process.pid) - before < 0.2
    client.close()


def _one_each(server: RunningServer, mode: str) -> requests.Response:
    body = {
        "inputs": [{"name": "MODE", "shape": [1], "datatype": "BYTES", "data": [mode]}],
        "outputs": [{"name": "SEEN"}, {"name": "CALL"}],
    }
    return _infer_raw(server, "one_each", body)


def _model_stats(server: RunningServer, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    return stats["model_stats"][0]


def test_requests_queued_behind_a_running_one_still_reach_execute_one_at_a_time(server: RunningServer) -> None:
    """Requests of a model without batching that queue behind a running one are handed to its worker together
    (16 clients on one instance keep a queue), but the model still sees one request per execute() (as in Triton),
    an execute() that raises fails only its own request, and the statistics count one execution per request that
    succeeded."""
    lone_raise = _one_each(server, "raise")  # what a request that raises alone gets
    before = _model_stats(server, "one_each")
    modes = (["ok"] * 8 + ["raise"] + ["ok"] * 6 + ["fail"]) * 12
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda mode: _one_each(server, mode), modes))
    calls = []
    for mode, answer in zip(modes, answers):
        if mode == "raise":
            assert (answer.status_code, answer.json()) == (lone_raise.status_code, lone_raise.json())
            assert "this request was asked to raise" in answer.json()["error"]
        elif mode == "fail":
            assert answer.status_code == 400 and "this request was asked to fail" in answer.json()["error"], answer.text
        else:
            assert answer.status_code == 200, answer.text
            outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
            assert outputs["SEEN"] == [1]
            calls.append(outputs["CALL"][0])
    assert len(set(calls)) == len(calls)  # each its own execute() call
    after = _model_stats(server, "one_each")
    succeeded = modes.count("ok")
    assert after["execution_count"] - before["execution_count"] == succeeded
    assert after["inference_count"] - before["inference_count"] == succeeded
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    failed = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert (success, failed) == (succeeded, modes.count("raise") + modes.count("fail"))
