"""The HTTP/REST protocol (KServe v2 plus Triton's extensions) against a real server, through the official
tritonclient.http and tritonclient.http.aio clients, with raw HTTP where the wire format itself is the point."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.conftest import EXAMPLES, without_llm
from tests.integration.protocol_models import (
    ADD_SUB_LABELS,
    DTYPES,
    HTTP_TRACE_DEFAULTS,
    TRITON_EXTENSIONS,
    as_bytes_array,
    build_protocol_repository,
    echo_model,
    sample,
)
from tests.servers import RunningServer, start_nereid

TRACE_DEFAULTS = HTTP_TRACE_DEFAULTS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = build_protocol_repository(tmp_path_factory.mktemp("protocol_repository"))
    running = start_nereid([EXAMPLES, repository], *without_llm(repository), "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url) as c:
        yield c


def _simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
        httpclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def _echo_input(datatype: str, data: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def _status(excinfo: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(excinfo.value.status())


# -- health and metadata -----------------------------------------------------------------------------
def test_health_endpoints_report_server_and_model_readiness(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "7")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata_lists_tritons_extensions(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert TRITON_EXTENSIONS <= set(metadata["extensions"])


def test_model_metadata_shows_batch_dimension_datatypes_and_versions(client: httpclient.InferenceServerClient) -> None:
    expected = {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert client.get_model_metadata("simple") == expected
    assert client.get_model_metadata("simple", "1") == expected
    assert client.get_model_metadata("simple_string")["inputs"] == [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}
    ]
    for datatype in DTYPES:
        metadata = client.get_model_metadata(echo_model(datatype))
        assert metadata["inputs"][0]["datatype"] == datatype
        assert metadata["outputs"][0]["datatype"] == datatype
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_model_metadata("no_such_model")
    assert _status(excinfo) == "404"
    assert "Request for unknown model: 'no_such_model' is not found" in excinfo.value.message()


def test_model_config_is_returned_as_triton_json(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert config["output"][0]["label_filename"] == "simple_labels.txt"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert client.get_model_config("simple_string")["input"][0]["data_type"] == "TYPE_STRING"
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_model_config("simple", "7")
    assert _status(excinfo) == "404"
    assert "Request for unknown model: 'simple' version 7 is not found" in excinfo.value.message()


# -- inference -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("datatype", "binary"),
    [
        pytest.param(d, binary, id=f"{d}-{'binary' if binary else 'json'}", marks=[])
        for d in DTYPES
        for binary in (True, False)
        if binary or d != "BF16"  # tritonclient refuses to send BF16 as JSON
    ],
)
def test_inference_round_trips_every_datatype(
    client: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    data = sample(datatype)
    result = client.infer(
        echo_model(datatype),
        [_echo_input(datatype, data, binary)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)],
    )
    output = result.get_output("OUTPUT0")
    assert output["datatype"] == datatype
    assert output["shape"] == [2, 3]
    received = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        np.testing.assert_array_equal(as_bytes_array(received), data)
    else:
        assert received.dtype == data.dtype
        np.testing.assert_array_equal(received, data)


def test_json_inputs_of_every_numeric_type_parse_nested_and_flat(server: RunningServer) -> None:
    for datatype in ("BOOL", "INT8", "UINT64", "INT64", "FP16", "FP64"):
        data = sample(datatype)
        for values in (data.tolist(), data.reshape(-1).tolist()):
            body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [2, 3], "data": values}]}
            reply = requests.post(f"{server.base}/v2/models/{echo_model(datatype)}/infer", json=body, timeout=10)
            assert reply.status_code == 200, reply.text
            output = reply.json()["outputs"][0]
            np.testing.assert_array_equal(np.array(output["data"], dtype=data.dtype).reshape(2, 3), data)


def test_binary_and_json_tensors_mix_in_one_request_and_response(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    header = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.reshape(-1).tolist()},
        ],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": False}}],
    }
    head = json.dumps(header).encode()
    reply = requests.post(
        f"{server.base}/v2/models/simple/infer",
        data=head + a.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    json_length = int(reply.headers["Inference-Header-Content-Length"])
    document = json.loads(reply.content[:json_length])
    out0, out1 = document["outputs"]
    assert out0["name"] == "OUTPUT0" and out0["parameters"] == {"binary_data_size": 64} and "data" not in out0
    assert out1["name"] == "OUTPUT1" and out1["data"] == (a - b).reshape(-1).tolist()
    np.testing.assert_array_equal(np.frombuffer(reply.content[json_length:], dtype=np.int32), (a + b).reshape(-1))

    # The official client does the same mix: one input binary, one JSON; one output binary, one JSON.
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a, binary_data=True)
        inputs[1].set_data_from_numpy(b, binary_data=False)
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
        ]
        result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert "data" in result.get_output("OUTPUT1") and "data" not in result.get_output("OUTPUT0")


def test_bytes_json_tensors_travel_as_utf8_strings(server: RunningServer) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "data": ["h\u00e9llo", ""]}]}
    reply = requests.post(f"{server.base}/v2/models/simple_string/infer", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == ["h\u00e9llo", ""]


def test_only_requested_outputs_are_returned(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", _simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))
    every = client.infer("simple", _simple_inputs(a, a))
    assert [o["name"] for o in every.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_request_id_is_echoed_only_when_given(client: httpclient.InferenceServerClient) -> None:
    a = np.zeros((1, 16), np.int32)
    assert client.infer("simple", _simple_inputs(a, a), request_id="req-42").get_response()["id"] == "req-42"
    assert "id" not in client.infer("simple", _simple_inputs(a, a)).get_response()


def test_numbered_requests_of_one_shape_each_answer_with_their_own_id_and_data(
    client: httpclient.InferenceServerClient,
) -> None:
    """Their headers differ only by the id, which the repeated-header decoding cuts out and puts back."""
    for i in range(6):
        a = np.full((1, 16), i, np.int32)
        result = client.infer("simple", _simple_inputs(a, a), request_id=f"n-{i}")
        assert result.get_response()["id"] == f"n-{i}"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert "id" not in client.infer("simple", _simple_inputs(a, a)).get_response()


def test_request_parameters_are_accepted_and_response_parameters_are_triton_shaped(
    client: httpclient.InferenceServerClient, server: RunningServer
) -> None:
    a = np.ones((1, 16), np.int32)
    result = client.infer("simple", _simple_inputs(a, a), parameters={"custom": "x", "count": 3, "flag": True})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    response = result.get_response()
    # An ONNX model sets no response parameters, so the response has none, as Triton's (the request's are not echoed).
    assert "parameters" not in response and response["model_name"] == "simple", response
    reply = requests.post(
        f"{server.base}/v2/models/simple/infer",
        json={
            "parameters": {"custom": "x", "nested_ok": 1.5},
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16, "parameters": {"note": "in"}}
                for n in ("INPUT0", "INPUT1")
            ],
        },
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [2] * 16 and outputs["OUTPUT1"]["data"] == [0] * 16, reply.text


def test_classification_returns_top_k_values_indices_and_labels(client: httpclient.InferenceServerClient) -> None:
    a = np.zeros((2, 16), dtype=np.int32)
    a[0, :3] = [3, 9, 1]
    a[1, 5] = 7
    zeros = np.zeros_like(a)
    for binary in (True, False):
        result = client.infer(
            "simple",
            _simple_inputs(a, zeros),
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)],
        )
        assert result.get_output("OUTPUT0")["datatype"] == "BYTES"
        assert result.get_output("OUTPUT0")["shape"] == [2, 2]
        np.testing.assert_array_equal(
            as_bytes_array(result.as_numpy("OUTPUT0")),
            np.array([[b"9:1:label_1", b"3:0:label_0"], [b"7:5:label_5", b"0:0:label_0"]], dtype=object),
        )
    values = np.array([[0.5, 2.0, 1.0, -1.0]], dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.zeros_like(values))
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    expected = [f"2.000000:1:{ADD_SUB_LABELS[1]}", f"1.000000:2:{ADD_SUB_LABELS[2]}", f"0.500000:0:{ADD_SUB_LABELS[0]}"]
    assert [x.decode() for x in result.as_numpy("OUTPUT0").reshape(-1)] == expected


# -- statistics ------------------------------------------------------------------------------------------
def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    return entry


def test_statistics_count_inferences_in_tritons_schema(client: httpclient.InferenceServerClient) -> None:
    before = _stats(client, "echo_int32")
    assert set(before) >= {
        "name", "version", "last_inference", "inference_count", "execution_count", "inference_stats", "batch_stats"
    }
    assert set(before["inference_stats"]) == {
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"
    }
    assert (before["name"], before["version"]) == ("echo_int32", "1")
    data = sample("INT32")
    for _ in range(3):
        client.infer("echo_int32", [_echo_input("INT32", data, True)])
    with pytest.raises(InferenceServerException):  # rejected before it runs: counted neither way, as in Triton
        client.infer("echo_int32", [_echo_input("FP32", data.astype(np.float32), True)])
    after = _stats(client, "echo_int32")
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] == old["success"]["count"] + 3
    assert stats["success"]["ns"] > old["success"]["ns"]
    assert stats["fail"]["count"] == old["fail"]["count"]
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == old[phase]["count"] + 3, phase
    assert after["inference_count"] == before["inference_count"] + 6  # three requests of batch 2
    assert after["execution_count"] == before["execution_count"] + 3
    assert after["last_inference"] > 0 and after["last_inference"] >= before["last_inference"]
    by_size = {b["batch_size"]: b for b in after["batch_stats"]}
    assert by_size[2]["compute_infer"]["count"] >= 3
    everything = client.get_inference_statistics()["model_stats"]
    assert {"simple", "echo_int32", "add_sub"} <= {entry["name"] for entry in everything}
    assert [e["version"] for e in client.get_inference_statistics("simple", "1")["model_stats"]] == ["1"]
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_inference_statistics("no_such_model")
    assert _status(excinfo) == "400"
    assert "requested model 'no_such_model' is not available" in excinfo.value.message()


# -- shared memory ---------------------------------------------------------------------------------------
def _unique(name: str) -> str:
    return f"{name}_{os.getpid()}"


def test_system_shared_memory_feeds_inputs_and_receives_outputs(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.int32)
    in_key, out_key = f"/{_unique('nereid_http_in')}", f"/{_unique('nereid_http_out')}"
    in_handle = shm.create_shared_memory_region("http_in", in_key, 128)
    out_handle = shm.create_shared_memory_region("http_out", out_key, 128)
    try:
        shm.set_shared_memory_region(in_handle, [a, b])
        client.register_system_shared_memory("http_in", in_key, 128)
        client.register_system_shared_memory("http_out", out_key, 128)
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status["http_in"] == {"name": "http_in", "key": in_key, "offset": 0, "byte_size": 128}
        assert client.get_system_shared_memory_status("http_out") == [
            {"name": "http_out", "key": out_key, "offset": 0, "byte_size": 128}
        ]

        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("http_in", 64)
        inputs[1].set_shared_memory("http_in", 64, offset=64)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("http_out", 64)
        outputs[1].set_shared_memory("http_out", 64, offset=64)
        result = client.infer("simple", inputs, outputs=outputs)
        # The data went into the region, not the response: the entry has a shape but no data, as in Triton.
        assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64), a - b)

        # Shared-memory input, ordinary binary output in the same request.
        result = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

        client.unregister_system_shared_memory("http_out")
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["http_in"]
        with pytest.raises(InferenceServerException) as excinfo:
            client.get_system_shared_memory_status("http_out")
        assert _status(excinfo) == "404"
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_system_shared_memory_carries_bytes_tensors(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[b"one", b"", b"three"]], dtype=np.object_)
    serialized = serialize_byte_tensor(data)
    payload = serialized.item()
    key = f"/{_unique('nereid_http_bytes')}"
    handle = shm.create_shared_memory_region("http_bytes", key, len(payload))
    try:
        shm.set_shared_memory_region(handle, [serialized])
        client.register_system_shared_memory("http_bytes", key, len(payload))
        tensor = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
        tensor.set_shared_memory("http_bytes", len(payload))
        result = client.infer("simple_string", [tensor])
        np.testing.assert_array_equal(as_bytes_array(result.as_numpy("OUTPUT0")), data)
    finally:
        client.unregister_system_shared_memory("http_bytes")
        shm.destroy_shared_memory_region(handle)


def test_cuda_shared_memory_register_is_refused_as_unsupported(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        client.register_cuda_shared_memory("cuda_region", b"\0" * 64, 0, 64)
    assert _status(excinfo) == "501"
    assert "CUDA shared memory is not supported" in excinfo.value.message()
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()  # nothing registered: a no-op, as in Triton


# -- logging and trace settings ----------------------------------------------------------------------------
def test_log_settings_can_be_read_and_updated(client: httpclient.InferenceServerClient) -> None:
    original = client.get_log_settings()
    assert set(original) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    try:
        updated = client.update_log_settings({"log_verbose_level": 2, "log_info": False})
        assert updated["log_verbose_level"] == 2 and updated["log_info"] is False
        assert client.get_log_settings() == updated
        with pytest.raises(InferenceServerException) as excinfo:
            client.update_log_settings({"log_verbose_level": "loud"})
        assert _status(excinfo) == "400"
    finally:
        restored = client.update_log_settings(
            {k: original[k] for k in ("log_verbose_level", "log_info", "log_warning", "log_error", "log_format")}
        )
    assert restored == original


def test_trace_settings_are_global_with_per_model_overrides(client: httpclient.InferenceServerClient) -> None:
    assert client.get_trace_settings() == TRACE_DEFAULTS
    try:
        model_view = client.update_trace_settings("simple", {"trace_rate": "5"})
        assert model_view == {**TRACE_DEFAULTS, "trace_rate": "5"}
        assert client.get_trace_settings() == TRACE_DEFAULTS  # the global settings are untouched
        assert client.update_trace_settings(settings={"trace_count": "10"})["trace_count"] == "10"
        # A model inherits the global values it does not override.
        assert client.get_trace_settings("simple") == {**TRACE_DEFAULTS, "trace_rate": "5", "trace_count": "10"}
        assert client.update_trace_settings("simple", {"trace_rate": None})["trace_rate"] == "1000"
        with pytest.raises(InferenceServerException) as excinfo:
            client.update_trace_settings(settings={"trace_rate": "often"})
        assert _status(excinfo) == "400" and "trace_rate" in excinfo.value.message()
        with pytest.raises(InferenceServerException) as excinfo:
            client.get_trace_settings("no_such_model")
        assert "no_such_model" in excinfo.value.message()
    finally:
        client.update_trace_settings(settings={"trace_count": None, "trace_rate": None})
        client.update_trace_settings("simple", {"trace_rate": None})
    assert client.get_trace_settings() == TRACE_DEFAULTS


# -- compression ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
def test_compressed_requests_and_responses_infer_correctly(
    client: httpclient.InferenceServerClient, request_algorithm: str | None, response_algorithm: str | None
) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer(
        "simple",
        _simple_inputs(a, a),
        request_compression_algorithm=request_algorithm,
        response_compression_algorithm=response_algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_server_compresses_infer_responses_with_the_accepted_encoding(server: RunningServer) -> None:
    body = json.dumps(
        {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]}
    ).encode()
    url = f"{server.base}/v2/models/simple/infer"
    for request_encoding, compress in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        for accept, expected, decompress in (
            ("gzip", "gzip", lambda d: zlib.decompress(d, 31)),
            ("deflate", "deflate", zlib.decompress),
            ("gzip;q=0, deflate", "deflate", zlib.decompress),
        ):
            reply = requests.post(
                url,
                data=compress(body),
                headers={"Content-Encoding": request_encoding, "Accept-Encoding": accept},
                stream=True,
                timeout=10,
            )
            assert reply.status_code == 200
            assert reply.headers["Content-Encoding"] == expected
            document = json.loads(decompress(reply.raw.read()))
            assert document["outputs"][0]["data"] == [2 * i for i in range(16)]
    plain = requests.post(url, data=body, headers={"Accept-Encoding": "identity"}, timeout=10)
    assert "Content-Encoding" not in plain.headers and plain.json()["model_name"] == "simple"


# -- the aio client ---------------------------------------------------------------------------------------
def test_aio_client_reads_health_metadata_config_and_statistics(server: RunningServer) -> None:
    async def scenario() -> None:
        async with httpaio.InferenceServerClient(server.http_url) as client:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("simple")
            assert not await client.is_model_ready("no_such_model")
            assert TRITON_EXTENSIONS <= set((await client.get_server_metadata())["extensions"])
            assert (await client.get_model_metadata("simple"))["inputs"][0]["shape"] == [-1, 16]
            assert (await client.get_model_config("simple"))["max_batch_size"] == 8
            stats = await client.get_inference_statistics("simple")
            assert stats["model_stats"][0]["name"] == "simple"
            assert set(await client.get_log_settings()) >= {"log_info", "log_verbose_level"}
            assert (await client.get_trace_settings())["trace_mode"] == "triton"
            with pytest.raises(InferenceServerException) as excinfo:
                await client.get_model_metadata("no_such_model")
            assert _status(excinfo) == "404"

    asyncio.run(scenario())


def test_aio_client_infers_every_datatype_with_options(server: RunningServer) -> None:
    async def scenario() -> None:
        async with httpaio.InferenceServerClient(server.http_url) as client:
            for datatype in DTYPES:
                data = sample(datatype)
                result = await client.infer(echo_model(datatype), [_echo_input(datatype, data, True)])
                received = result.as_numpy("OUTPUT0")
                if datatype == "BYTES":
                    received = as_bytes_array(received)
                np.testing.assert_array_equal(received, data)
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            result = await client.infer(
                "simple",
                _simple_inputs(a, a, binary=False),
                outputs=[httpaio.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=1)],
                request_id="aio-1",
                # (tritonclient 2.41's aio client cannot compress requests: it never imports gzip/zlib)
                response_compression_algorithm="deflate",
                parameters={"custom": "value"},
            )
            assert result.get_response()["id"] == "aio-1"
            assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT0"]
            assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == ["30:15:label_15"]

    asyncio.run(scenario())


def test_aio_client_uses_system_shared_memory(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    key = f"/{_unique('nereid_http_aio')}"
    handle = shm.create_shared_memory_region("http_aio", key, 192)

    async def scenario() -> None:
        async with httpaio.InferenceServerClient(server.http_url) as client:
            await client.register_system_shared_memory("http_aio", key, 192)
            try:
                assert [r["name"] for r in await client.get_system_shared_memory_status()] == ["http_aio"]
                inputs = [httpaio.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_shared_memory("http_aio", 64)
                inputs[1].set_shared_memory("http_aio", 64)
                output = httpaio.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory("http_aio", 64, offset=128)
                await client.infer("simple", inputs, outputs=[output])
                with pytest.raises(InferenceServerException) as excinfo:
                    await client.register_cuda_shared_memory("cuda_region", b"\0" * 64, 0, 64)
                assert _status(excinfo) == "501"
            finally:
                await client.unregister_system_shared_memory("http_aio")
            assert await client.get_system_shared_memory_status() == []

    try:
        shm.set_shared_memory_region(handle, [a])
        asyncio.run(scenario())
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128), a + a)
    finally:
        shm.destroy_shared_memory_region(handle)
