"""Bad input over raw HTTP and raw gRPC: each case gets a 4xx (or its gRPC code) with a Triton-style message that
names the model and tensor, and the server goes on serving good requests afterwards."""

from __future__ import annotations

import gzip
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.conftest import WITHOUT_LLM
from tests.servers import ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"
SHAPE_NOTE = "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension"
ONES = np.ones((1, 16), dtype=np.int32)


def _json_input(name: str = "INPUT0", datatype: str = "INT32", shape: list[int] | None = None, data: Any = None) -> dict[str, Any]:
    shape = [1, 16] if shape is None else shape
    count = int(np.prod(shape))
    return {"name": name, "datatype": datatype, "shape": shape, "data": [1] * count if data is None else data}


GOOD_BODY = {"inputs": [_json_input("INPUT0"), _json_input("INPUT1")]}


def _post(server: RunningServer, body: bytes | dict[str, Any], model: str = "simple", headers: dict[str, str] | None = None, version: str = "") -> requests.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    return requests.post(server.base + path, data=data, headers=headers or {}, timeout=30)


def _binary_request(header: dict[str, Any], *chunks: bytes, header_length_delta: int = 0) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), {"Inference-Header-Content-Length": str(len(head) + header_length_delta)}


def _assert_http_still_serves(server: RunningServer) -> None:
    reply = _post(server, GOOD_BODY)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [2] * 16


# -- HTTP ------------------------------------------------------------------------------------------------
# (case id, body, headers, model, version, expected status, substrings the error message must contain)
_BYTES_HEADER = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": 11}}]}
HTTP_CASES: list[tuple[str, bytes | dict[str, Any], dict[str, str] | None, str, str, int, list[str]]] = [
    (
        "wrong_tensor_name",
        {"inputs": [_json_input("INPUTX"), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["unexpected inference input 'INPUTX' for model 'simple'"],
    ),
    (
        "missing_input",
        {"inputs": [_json_input("INPUT0")]},
        None, "simple", "", 400,
        ["expected 2 inputs but got 1 inputs for model 'simple'", "missing required input(s) ['INPUT1']"],
    ),
    (
        "wrong_datatype",
        {"inputs": [_json_input("INPUT0", "FP32"), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"],
    ),
    (
        "wrong_datatype_echoes_request_id",
        {"id": "req-9", "inputs": [_json_input("INPUT0"), _json_input("INPUT1", "INT64")]},
        None, "simple", "", 400,
        ["[request id: req-9] inference input 'INPUT1' data-type is 'INT64', but model 'simple' expects 'INT32'"],
    ),
    (
        "unknown_datatype_name",
        {"inputs": [_json_input("INPUT0", "FLOAT32"), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'", "FLOAT32"],
    ),
    (
        "shape_not_matching_config",
        {"inputs": [_json_input("INPUT0", shape=[1, 15]), _json_input("INPUT1", shape=[1, 15])]},
        None, "simple", "", 400,
        ["unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15].", SHAPE_NOTE],
    ),
    (
        "shape_missing_batch_dimension",
        {"inputs": [_json_input("INPUT0", shape=[16]), _json_input("INPUT1", shape=[16])]},
        None, "simple", "", 400,
        ["unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [16]."],
    ),
    (
        "batch_size_over_max",
        {"inputs": [_json_input("INPUT0", shape=[9, 16]), _json_input("INPUT1", shape=[9, 16])]},
        None, "simple", "", 400,
        ["inference request batch-size must be <= 8 for 'simple'"],
    ),
    (
        "batch_sizes_differ_between_inputs",
        {"inputs": [_json_input("INPUT0", shape=[2, 16]), _json_input("INPUT1", shape=[3, 16])]},
        None, "simple", "", 400,
        ["'INPUT1'", "batch size does not match other inputs for 'simple'"],
    ),
    (
        "json_data_count_not_matching_shape",
        {"inputs": [_json_input("INPUT0", data=[1] * 15), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'", "16"],
    ),
    (
        "json_data_of_wrong_kind",
        {"inputs": [_json_input("INPUT0", data=["one"] * 16), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'"],
    ),
    (
        "input_without_data",
        {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16]}, _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'"],
    ),
    (
        "negative_shape",
        {"inputs": [_json_input("INPUT0", shape=[-1, 16], data=[1] * 16), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'", "shape"],
    ),
    (
        "unknown_requested_output",
        {**GOOD_BODY, "outputs": [{"name": "OUTPUTX"}]},
        None, "simple", "", 400,
        ["unexpected inference output 'OUTPUTX' for model 'simple'"],
    ),
    (
        "duplicate_input",
        {"inputs": [_json_input("INPUT0"), _json_input("INPUT0"), _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'"],
    ),
    (
        "reserved_parameter_of_wrong_type",
        {**GOOD_BODY, "parameters": {"priority": "high"}},
        None, "simple", "", 400,
        ["'priority'", "'simple'", "unsigned integer"],
    ),
    (
        "parameter_of_unsupported_type",
        {**GOOD_BODY, "parameters": {"custom": {"nested": 1}}},
        None, "simple", "", 400,
        ["'custom'", "'simple'"],
    ),
    (
        "input_parameters_not_an_object",
        {"inputs": [{**_json_input("INPUT0"), "parameters": ["binary_data_size", 4]}, _json_input("INPUT1")]},
        None, "simple", "", 400,
        ["'INPUT0'", "'simple'", "'parameters'"],
    ),
    (
        "outputs_not_an_array",
        {**GOOD_BODY, "outputs": {"name": "OUTPUT0"}},
        None, "simple", "", 400,
        ["'simple'", "'outputs'"],
    ),
    (
        "requested_output_without_name",
        {**GOOD_BODY, "outputs": [{"parameters": {"binary_data": True}}]},
        None, "simple", "", 400,
        ["'simple'", "'name'"],
    ),
    ("malformed_json", b'{"inputs": [', None, "simple", "", 400, ["failed to parse the request JSON buffer"]),
    ("json_not_an_object", b"[1, 2, 3]", None, "simple", "", 400, ["failed to parse the request JSON buffer"]),
    ("inputs_missing", {"id": "x"}, None, "simple", "", 400, ["'inputs'", "'simple'"]),
    (
        "binary_data_size_past_the_body",
        *_binary_request(
            {"inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            ]},
            ONES.tobytes(), ONES.tobytes()[:40],
        ),
        "simple", "", 400,
        ["unexpected size for input 'INPUT1'", "for model 'simple'"],
    ),
    (
        "binary_data_size_not_matching_shape",
        *_binary_request(
            {"inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 60}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 68}},
            ]},
            ONES.tobytes(), ONES.tobytes(),
        ),
        "simple", "", 400,
        ["[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"],
    ),
    (
        "binary_data_size_mismatch_echoes_request_id",
        *_binary_request(
            {"id": "bin-3", "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 8}},
            ]},
            ONES.tobytes(), ONES.tobytes()[:8],
        ),
        "simple", "", 400,
        ["[request id: bin-3] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 8"],
    ),
    (
        "binary_bytes_no_input_claims",
        *_binary_request(
            {"inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            ]},
            ONES.tobytes(), ONES.tobytes(), b"spare",
        ),
        "simple", "", 400,
        ["'simple'", "5 bytes"],
    ),
    (
        "bytes_length_prefix_past_its_buffer",
        *_binary_request(_BYTES_HEADER, struct.pack("<I", 3) + b"abc" + struct.pack("<I", 100)),
        "simple_string", "", 400,
        ["'INPUT0'", "'simple_string'"],
    ),
    (
        "bytes_element_count_not_matching_shape",
        *_binary_request(
            {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": 15}}]},
            struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0) + struct.pack("<I", 0),
        ),
        "simple_string", "", 400,
        ["'INPUT0'", "'simple_string'", "expecting 2"],
    ),
    (
        "truncated_bytes_length_prefix",
        *_binary_request(
            {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 2}}]},
            b"\x05\x00",
        ),
        "simple_string", "", 400,
        ["'INPUT0'", "'simple_string'"],
    ),
    (
        "header_length_longer_than_body",
        *_binary_request(GOOD_BODY, header_length_delta=500),
        "simple", "", 400,
        ["inference header size should be in range (0, "],
    ),
    (
        "header_length_not_a_number",
        json.dumps(GOOD_BODY).encode(), {"Inference-Header-Content-Length": "lots"},
        "simple", "", 400,
        ["Inference-Header-Content-Length"],
    ),
    (
        "request_id_not_a_string",
        {**GOOD_BODY, "id": 5}, None, "simple", "", 400,
        ["Unable to parse 'id'", "must be a string, got 5"],
    ),
    (
        "nan_in_integer_data",
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[NaN' + b',1' * 15 + b"]}]}",
        None, "simple", "", 400,
        ["'INPUT0' for model 'simple': expected INT32 values, got NaN"],
    ),
    (
        "unknown_model",
        GOOD_BODY, None, "nope", "", 404,
        ["Request for unknown model: 'nope' is not found"],
    ),
    (
        "unknown_version",
        GOOD_BODY, None, "simple", "7", 404,
        ["Request for unknown model: 'simple' version 7 is not found"],
    ),
    (
        "corrupt_gzip_body",
        b"certainly not gzip", {"Content-Encoding": "gzip"}, "simple", "", 400,
        ["gzip"],
    ),
    (
        "unsupported_content_encoding",
        json.dumps(GOOD_BODY).encode(), {"Content-Encoding": "br"}, "simple", "", 501,
        ["br"],
    ),
]


@pytest.mark.parametrize(
    ("body", "headers", "model", "version", "status", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in HTTP_CASES],
)
def test_http_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    example_server: RunningServer,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None,
    model: str,
    version: str,
    status: int,
    fragments: list[str],
) -> None:
    log_mark = len(example_server.log())
    reply = _post(example_server, body, model, headers, version)
    assert reply.status_code == status, reply.text
    # Errors about the model itself, and a header length outside the body, are text/plain on /infer, as Triton
    # sends them; the rest are JSON.
    plain = status == 404 or fragments[0].startswith("inference header size")
    expected_type = "text/plain" if plain else "application/json"
    assert reply.headers["Content-Type"] == expected_type
    message = reply.json()["error"]
    for fragment in fragments:
        assert fragment in message
    _assert_http_still_serves(example_server)
    assert "Traceback" not in example_server.log()[log_mark:]  # refused cleanly, not by an unhandled error


def test_a_repository_index_ready_that_is_not_a_boolean_is_refused_in_triton_s_words(example_server: RunningServer) -> None:
    for ready in ('"yes"', "[true]", "1"):
        reply = requests.post(f"{example_server.base}/v2/repository/index", data='{"ready":' + ready + '}', timeout=30)
        assert reply.status_code == 400 and reply.json()["error"] == "Invalid value for 'ready': expected a boolean"


# -- --http-max-input-size ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_limit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(EXAMPLES, *WITHOUT_LLM, "--http-max-input-size=4096", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def test_body_over_http_max_input_size_is_refused(small_limit_server: RunningServer) -> None:
    big = {"inputs": [_json_input("INPUT0", shape=[8, 16], data=[123456] * 128), _json_input("INPUT1", shape=[8, 16], data=[123456] * 128)]}
    encoded = json.dumps({**big, "padding": "x" * 60_000}).encode()
    assert len(encoded) > 4096
    reply = _post(small_limit_server, encoded)
    # 400 from the transport, before the body is read (Triton reads it all, then answers 400).
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]
    assert "4096" in message and "--http-max-input-size" in message
    # A small body that inflates past the limit is refused too (no decompression bomb).
    reply = _post(small_limit_server, gzip.compress(encoded), headers={"Content-Encoding": "gzip"})
    assert reply.status_code == 400, reply.text
    assert "--http-max-input-size" in reply.json()["error"]
    _assert_http_still_serves(small_limit_server)


# -- shared memory bounds -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def region(example_server: RunningServer) -> Iterator[str]:
    """A 128-byte system shared memory region registered as 'bad_input_region' (two [1,16] INT32 tensors)."""
    key = f"/nereid_bad_input_{os.getpid()}"
    handle = shm.create_shared_memory_region("bad_input_region", key, 128)
    shm.set_shared_memory_region(handle, [ONES, ONES])
    reply = requests.post(
        f"{example_server.base}/v2/systemsharedmemory/region/bad_input_region/register",
        json={"key": key, "offset": 0, "byte_size": 128},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    yield "bad_input_region"
    requests.post(f"{example_server.base}/v2/systemsharedmemory/region/bad_input_region/unregister", timeout=10)
    shm.destroy_shared_memory_region(handle)


def _shm_input(name: str, region: str, byte_size: int, offset: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "INT32",
        "shape": [1, 16],
        "parameters": {"shared_memory_region": region, "shared_memory_byte_size": byte_size, "shared_memory_offset": offset},
    }


@pytest.mark.parametrize(
    ("byte_size", "offset"), [(64, 100), (200, 0), (64, -8)], ids=["offset_past_end", "size_past_end", "negative_offset"]
)
def test_http_shared_memory_input_out_of_bounds_is_refused(
    example_server: RunningServer, region: str, byte_size: int, offset: int
) -> None:
    body = {"inputs": [_shm_input("INPUT0", region, byte_size, offset), _shm_input("INPUT1", region, 64, 64)]}
    reply = _post(example_server, body)
    assert reply.status_code == 400, reply.text
    what = "offset" if offset < 0 else "offset + byte size"  # Triton names an offset outside the region on its own
    assert reply.json()["error"] == f"Invalid {what} for shared memory region: '{region}'"
    _assert_http_still_serves(example_server)


def test_http_shared_memory_errors_name_region_tensor_and_model(example_server: RunningServer, region: str) -> None:
    good_inputs = [_shm_input("INPUT0", region, 64), _shm_input("INPUT1", region, 64, 64)]
    reply = _post(example_server, {"inputs": [_shm_input("INPUT0", "never_registered", 64), good_inputs[1]]})
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"] == "Unable to find shared memory region: 'never_registered'"

    reply = _post(example_server, {"inputs": [_shm_input("INPUT0", region, 60), good_inputs[1]]})
    assert reply.status_code == 400, reply.text
    assert "input byte size mismatch for input 'INPUT0' for model 'simple'" in reply.json()["error"]

    too_small = {"name": "OUTPUT0", "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 32}}
    reply = _post(example_server, {"inputs": good_inputs, "outputs": [too_small]})
    assert reply.status_code == 400, reply.text
    assert "'OUTPUT0'" in reply.json()["error"] and "64 bytes" in reply.json()["error"]

    past_end = {"name": "OUTPUT0", "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 64, "shared_memory_offset": 96}}
    reply = _post(example_server, {"inputs": good_inputs, "outputs": [past_end]})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == f"Invalid offset + byte size for shared memory region: '{region}'"

    reply = requests.post(
        f"{example_server.base}/v2/systemsharedmemory/region/too_big/register",
        json={"key": f"/nereid_bad_input_{os.getpid()}", "offset": 0, "byte_size": 4096},
        timeout=10,
    )
    assert reply.status_code == 400 and "'too_big'" in reply.json()["error"], reply.text
    _assert_http_still_serves(example_server)


# -- gRPC ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub(example_server: RunningServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _grpc_request(
    model: str = "simple",
    version: str = "",
    inputs: tuple[tuple[str, str, list[int]], ...] = (("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])),
    raw: list[bytes] | None = None,
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw if raw is not None else [ONES.tobytes()] * len(inputs))
    return request


def _assert_grpc_still_serves(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    response = stub.ModelInfer(_grpc_request(), timeout=30)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.int32), [2] * 16)


def _typed_contents_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend([1] * 15)
    return request


def _raw_and_typed_contents_request() -> pb.ModelInferRequest:
    request = _grpc_request()
    request.inputs[0].contents.int_contents.extend([1] * 16)
    return request


def _string_timeout_request() -> pb.ModelInferRequest:
    request = _grpc_request()
    request.parameters["timeout"].string_param = "soon"
    return request


def _shm_request(region: str, byte_size: int, offset: int) -> pb.ModelInferRequest:
    request = _grpc_request(raw=[ONES.tobytes()])
    params = request.inputs[0].parameters
    params["shared_memory_region"].string_param = region
    params["shared_memory_byte_size"].int64_param = byte_size
    params["shared_memory_offset"].int64_param = offset
    return request


GRPC_CASES: list[tuple[str, Any, grpc.StatusCode, list[str]]] = [
    (
        "wrong_tensor_name",
        lambda: _grpc_request(inputs=(("INPUTX", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["unexpected inference input 'INPUTX' for model 'simple'"],
    ),
    (
        "missing_input",
        lambda: _grpc_request(inputs=(("INPUT0", "INT32", [1, 16]),)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["expected 2 inputs but got 1 inputs for model 'simple'", "['INPUT1']"],
    ),
    (
        "wrong_datatype",
        lambda: _grpc_request(inputs=(("INPUT0", "FP32", [1, 16]), ("INPUT1", "INT32", [1, 16]))),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"],
    ),
    (
        "shape_not_matching_config",
        lambda: _grpc_request(
            inputs=(("INPUT0", "INT32", [1, 8]), ("INPUT1", "INT32", [1, 8])), raw=[ONES.tobytes()[:32]] * 2
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]."],
    ),
    (
        "batch_size_over_max",
        lambda: _grpc_request(
            inputs=(("INPUT0", "INT32", [9, 16]), ("INPUT1", "INT32", [9, 16])), raw=[ONES.tobytes() * 9] * 2
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["inference request batch-size must be <= 8 for 'simple'"],
    ),
    (
        "raw_byte_size_not_matching_shape",
        lambda: _grpc_request(raw=[ONES.tobytes(), ONES.tobytes()[:60]]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60"],
    ),
    (
        "fewer_raw_contents_than_inputs",
        lambda: _grpc_request(raw=[ONES.tobytes()]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["'INPUT1'", "'simple'"],
    ),
    (
        "more_raw_contents_than_inputs",
        lambda: _grpc_request(raw=[ONES.tobytes()] * 3),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["'simple'", "raw input contents"],
    ),
    (
        "typed_contents_count_not_matching_shape",
        _typed_contents_request,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"],
    ),
    (
        "raw_and_typed_contents_for_one_input",
        _raw_and_typed_contents_request,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"],
    ),
    (
        "bytes_length_prefix_past_its_buffer",
        lambda: _grpc_request(
            "simple_string",
            inputs=(("INPUT0", "BYTES", [1, 2]),),
            raw=[struct.pack("<I", 3) + b"abc" + struct.pack("<I", 100)],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["'INPUT0'", "'simple_string'"],
    ),
    (
        "reserved_parameter_of_wrong_type",
        _string_timeout_request,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["'timeout'", "'simple'"],
    ),
    (
        "unknown_model",
        lambda: _grpc_request("nope"),
        grpc.StatusCode.NOT_FOUND,
        ["Request for unknown model: 'nope' is not found"],
    ),
    (
        "unknown_version",
        lambda: _grpc_request(version="7"),
        grpc.StatusCode.NOT_FOUND,
        ["Request for unknown model: 'simple' version 7 is not found"],
    ),
    (
        "shared_memory_region_never_registered",
        lambda: _shm_request("never_registered", 64, 0),
        grpc.StatusCode.NOT_FOUND,
        ["Unable to find shared memory region: 'never_registered'"],
    ),
]


@pytest.mark.parametrize(("build", "code", "fragments"), [pytest.param(*case[1:], id=case[0]) for case in GRPC_CASES])
def test_grpc_bad_input_gets_a_clear_status_and_the_server_keeps_serving(
    example_server: RunningServer,
    stub: pb_grpc.GRPCInferenceServiceStub,
    build: Any,
    code: grpc.StatusCode,
    fragments: list[str],
) -> None:
    log_mark = len(example_server.log())
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ModelInfer(build(), timeout=30)
    assert excinfo.value.code() == code, excinfo.value.details()
    for fragment in fragments:
        assert fragment in excinfo.value.details()
    _assert_grpc_still_serves(stub)
    assert "Traceback" not in example_server.log()[log_mark:]


@pytest.mark.parametrize(("byte_size", "offset"), [(64, 100), (200, 0)], ids=["offset_past_end", "size_past_end"])
def test_grpc_shared_memory_input_out_of_bounds_is_refused(
    stub: pb_grpc.GRPCInferenceServiceStub, region: str, byte_size: int, offset: int
) -> None:
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ModelInfer(_shm_request(region, byte_size, offset), timeout=30)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert excinfo.value.details() == f"Invalid offset + byte size for shared memory region: '{region}'"
    _assert_grpc_still_serves(stub)


def test_grpc_stream_reports_bad_input_per_request_and_keeps_the_stream_open(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    bad = _grpc_request(inputs=(("INPUTX", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])))
    bad.id = "bad-input"
    lost = _grpc_request("nope")
    lost.id = "bad-model"
    good = _grpc_request()
    good.id = "after-bad"
    responses = list(stub.ModelStreamInfer(iter([bad, lost, good]), timeout=30))
    # Each error names its request by id (as Triton does), so a client can tell which of its requests failed.
    errors = {r.infer_response.id: r.error_message for r in responses if r.error_message}
    assert errors == {
        "bad-model": "Request for unknown model: 'nope' is not found",
        "bad-input": "unexpected inference input 'INPUTX' for model 'simple'",
    }
    (ok,) = [r.infer_response for r in responses if not r.error_message]
    assert ok.id == "after-bad"
    np.testing.assert_array_equal(np.frombuffer(ok.raw_output_contents[0], np.int32), [2] * 16)
