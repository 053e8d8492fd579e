"""Differential tests of wire-level details: real Triton 2.51 and Nereid give the same answers to the same bytes.

Both servers load the same Python-backend models (the only kind real Triton runs here). The questions are the
edges of the protocols: gRPC tensors that carry data twice, HTTP request ids of the wrong kind, NaN and Infinity
literals in JSON, bodies that are only one input's raw bytes, which errors are text/plain, the gRPC health service,
and Triton's wording of errors. Where Nereid differs on purpose, the test says so next to the assertion.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.differential.pair import Pair, start_pair

pytestmark = pytest.mark.differential

_SIMPLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

_DECOUPLED = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", tensor.as_numpy())])
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Identity models with one input INPUT0 [-1] of each of these types (no batching).
_IDENTITY_TYPES = ["FP16", "BF16", "FP32", "FP64", "INT32", "INT64", "UINT8", "BOOL", "STRING"]


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


def _one_input_config(name: str, dtype: str, extra: str = "", backend: str = "python") -> str:
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_{dtype} dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_{dtype} dims: [ -1 ] }} ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{extra}"
    )


def _identity_code(dtype: str) -> str:
    make = (
        'pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())'
        if dtype == "BF16"  # numpy has no bfloat16: Triton's as_numpy() refuses BF16
        else 'pb_utils.Tensor("OUTPUT0", tensor.as_numpy())'
    )
    return (
        "import triton_python_backend_utils as pb_utils\n\n\nclass TritonPythonModel:\n"
        "    def execute(self, requests):\n        responses = []\n        for request in requests:\n"
        '            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")\n'
        f"            responses.append(pb_utils.InferenceResponse(output_tensors=[{make}]))\n"
        "        return responses\n"
    )


def build_repository(repo: Path) -> list[str]:
    """The models of this module; returns the names to load at start."""
    simple = (
        'name: "simple"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    _write(repo, "simple", simple, _SIMPLE)
    names = ["simple"]
    for dtype in _IDENTITY_TYPES:
        name = f"id_{dtype.lower()}"
        _write(repo, name, _one_input_config(name, dtype), _identity_code(dtype))
        names.append(name)
    _write(repo, "decoupled", _one_input_config("decoupled", "INT32", "model_transaction_policy { decoupled: true }"), _DECOUPLED)
    names.append("decoupled")
    _write(repo, "nobackend", _one_input_config("nobackend", "INT32", backend="nosuch"), _SIMPLE)  # loaded by a test
    return names


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repo = tmp_path_factory.mktemp("wire") / "repo"
    repo.mkdir()
    names = build_repository(repo) + build_raw_models(repo)
    flags = ["--model-control-mode=explicit", *[f"--load-model={n}" for n in names], "--strict-readiness=false"]
    both = start_pair(repo, *flags)
    yield both
    both.close()


@pytest.fixture
def shm_key() -> Iterator[str]:
    """A 64-byte POSIX shared-memory object both servers can map."""
    key = f"nereid_wiretest_{os.getpid()}"
    path = Path("/dev/shm") / key
    path.write_bytes(bytes(64))
    yield key
    path.unlink(missing_ok=True)


def _same(triton: Any, nereid: Any) -> None:
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)


# -- which /infer errors are text/plain --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v2/models/nope/infer", 404),
        ("/v2/models/nope/versions/1/infer", 404),
        ("/v2/models/simple/versions/7/infer", 404),
        ("/v2/models/decoupled/infer", 501),
        ("/v2/models/decoupled/versions/1/infer", 501),
    ],
)
def test_infer_errors_about_the_model_are_text_plain_alike(pair: Pair, path: str, status: int) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    triton, nereid = pair.http("POST", path, body)
    assert triton.status == status
    assert triton.content_type == "text/plain"
    _same(triton, nereid)


def test_infer_errors_about_the_body_stay_json_alike(pair: Pair) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}
    triton, nereid = pair.http("POST", "/v2/models/simple/infer", body)
    assert triton.status == nereid.status == 400
    assert triton.content_type == nereid.content_type == "application/json"
    assert triton.error == nereid.error
    triton, nereid = pair.http("POST", "/v2/models/nope/generate", {"x": 1})
    _same(triton, nereid)
    assert triton.content_type == "application/json"


def test_infer_on_a_version_that_failed_to_load_is_text_plain_alike(pair: Pair) -> None:
    triton, nereid = pair.http("POST", "/v2/repository/models/nobackend/load")
    assert triton.status == nereid.status == 400
    # Triton's reason for a missing backend, word for word, then Nereid's list of the backends it has.
    reason = (
        "Invalid argument: unable to find backend library for backend 'nosuch', try specifying runtime on the model "
        "configuration."
    )
    assert reason in triton.error and reason in nereid.error
    t_entries, n_entries = pair.index_entries("nobackend")
    assert t_entries[0]["reason"] == reason
    assert n_entries[0]["reason"].startswith(reason)
    for path in ("/v2/models/nobackend/infer", "/v2/models/nobackend/versions/1/infer"):
        triton, nereid = pair.http("POST", path, {"inputs": []})
        assert triton.content_type == "text/plain"
        _same(triton, nereid)


# -- gRPC health ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", "inference", "inference.GRPCInferenceService", "anything", "grpc.health.v1.Health"])
def test_grpc_health_answers_serving_for_any_service_name_alike(pair: Pair, service: str) -> None:
    assert pair.health(service) == ("SERVING", "SERVING")


# -- Triton's wording ----------------------------------------------------------------------------------------------------


def _starts_with_tritons(triton: str, nereid: str) -> None:
    """Nereid says what Triton says, and may add detail after it."""
    assert nereid.startswith(triton), (triton, nereid)


def test_changing_the_log_file_is_refused_in_tritons_words(pair: Pair) -> None:
    triton, nereid = pair.http("POST", "/v2/logging", {"log_file": "/tmp/elsewhere.log"})
    assert triton.status == nereid.status == 501
    assert triton.error == "log file location can not be updated through network protocol"
    _starts_with_tritons(triton.error, nereid.error)
    for kind, value in (("string_param", "/tmp/elsewhere.log"), ("bool_param", True)):
        request = pb.LogSettingsRequest()
        setattr(request.settings["log_file"], kind, value)
        t_rpc, n_rpc = pair.rpc("LogSettings", request)
        assert t_rpc.code == n_rpc.code == "UNIMPLEMENTED"
        _starts_with_tritons(t_rpc.details, n_rpc.details)


@pytest.mark.parametrize(
    ("key", "kind", "value"),
    [
        ("log_verbose_level", "string_param", "1"),
        ("log_verbose_level", "bool_param", True),
        ("log_format", "uint32_param", 1),
        ("log_format", "string_param", "bogus"),
        ("log_info", "string_param", "yes"),
    ],
)
def test_a_grpc_log_setting_of_the_wrong_kind_is_refused_in_tritons_words(pair: Pair, key: str, kind: str, value: Any) -> None:
    request = pb.LogSettingsRequest()
    setattr(request.settings[key], kind, value)
    t_rpc, n_rpc = pair.rpc("LogSettings", request)
    assert t_rpc.code == n_rpc.code == "INVALID_ARGUMENT"
    _starts_with_tritons(t_rpc.details, n_rpc.details)
    t_rpc, n_rpc = pair.rpc("LogSettings", pb.LogSettingsRequest())
    assert n_rpc.response == t_rpc.response  # nothing changed


@pytest.mark.parametrize(("offset", "byte_size"), [(0, 1000), (60, 8), (100, 8)])
def test_out_of_bounds_shared_memory_registration_is_refused_in_tritons_words(
    pair: Pair, shm_key: str, offset: int, byte_size: int
) -> None:
    body = {"key": shm_key, "offset": offset, "byte_size": byte_size}
    try:
        triton, nereid = pair.http("POST", "/v2/systemsharedmemory/region/r/register", body)
        assert triton.status == nereid.status == 400
        assert triton.error == "failed to register shared memory region 'r': invalid args"
        _starts_with_tritons(triton.error, nereid.error)
        assert str(byte_size) in nereid.error  # Nereid's detail: the sizes
        request = pb.SystemSharedMemoryRegisterRequest(name="r", key=shm_key, offset=offset, byte_size=byte_size)
        t_rpc, n_rpc = pair.rpc("SystemSharedMemoryRegister", request)
        assert t_rpc.code == n_rpc.code == "INVALID_ARGUMENT"
        _starts_with_tritons(t_rpc.details, n_rpc.details)
    finally:
        pair.http("POST", "/v2/systemsharedmemory/unregister")


def test_decoupled_models_are_refused_in_tritons_words_on_both_protocols(pair: Pair) -> None:
    triton, nereid = pair.http(
        "POST", "/v2/models/decoupled/infer", {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    )
    _same(triton, nereid)
    assert triton.error == "HTTP end point doesn't support models with decoupled transaction policy"
    request = pb.ModelInferRequest(model_name="decoupled")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    t_rpc, n_rpc = pair.rpc("ModelInfer", request)
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
    assert t_rpc.code == "UNIMPLEMENTED"
    assert t_rpc.details == "ModelInfer RPC doesn't support models with decoupled transaction policy"


# -- gRPC tensors whose data comes twice, or in the wrong field --------------------------------------------------------

_RAW16 = np.arange(16, dtype=np.int32).tobytes()


def _infer_request(model: str, *inputs: tuple[str, str, list[int]]) -> Any:
    request = pb.ModelInferRequest(model_name=model)
    for name, datatype, shape in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    return request


def _simple(raw: int = 0) -> Any:
    request = _infer_request("simple", ("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16]))
    request.raw_input_contents.extend([_RAW16] * raw)
    return request


def _in_shm(tensor: Any) -> None:
    tensor.parameters["shared_memory_region"].string_param = "wire_region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 64


def _case_raw_and_contents(raw: int, which: int) -> Any:
    request = _simple(raw)
    request.inputs[which].contents.int_contents.extend(range(16))
    return request


def _case_raw_and_empty_contents() -> Any:
    request = _simple(2)
    request.inputs[0].contents.SetInParent()
    return request


def _case_contents(model: str, datatype: str, shape: list[int], **fields: list[Any]) -> Any:
    request = _infer_request(model, ("INPUT0", datatype, shape))
    request.inputs[0].contents.SetInParent()
    for field, values in fields.items():
        getattr(request.inputs[0].contents, field).extend(values)
    return request


def _case_simple_contents(request_id: str = "", **fields: list[Any]) -> Any:
    request = _simple()
    request.id = request_id
    for field, values in fields.items():
        getattr(request.inputs[0].contents, field).extend(values)
    request.inputs[1].contents.int_contents.extend(range(16))
    return request


def _case_shm_and_contents(empty: bool) -> Any:
    request = _simple()
    _in_shm(request.inputs[0])
    if empty:
        request.inputs[0].contents.SetInParent()
    else:
        request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend(range(16))
    return request


def _case_no_data() -> Any:
    request = _simple()
    request.inputs[1].contents.int_contents.extend(range(16))
    return request


_CONTENT_CASES = {
    "raw_for_both_and_contents_on_the_first": lambda: _case_raw_and_contents(2, 0),
    "one_raw_and_contents_on_the_first": lambda: _case_raw_and_contents(1, 0),
    "raw_for_the_first_and_contents_on_the_second": lambda: _case_raw_and_contents(1, 1),
    "raw_and_an_empty_contents_message": _case_raw_and_empty_contents,
    "fp32_contents_for_int32": lambda: _case_simple_contents(fp32_contents=[1.0] * 16),
    "int64_contents_for_int32": lambda: _case_simple_contents(int64_contents=[1] * 16),
    "int_and_fp32_contents_both": lambda: _case_simple_contents(int_contents=list(range(16)), fp32_contents=[1.0] * 16),
    "int_and_int64_contents_both": lambda: _case_simple_contents(int_contents=list(range(16)), int64_contents=[1] * 16),
    "fewer_elements_than_the_shape": lambda: _case_simple_contents(int_contents=list(range(15))),
    "more_elements_than_the_shape": lambda: _case_simple_contents(int_contents=list(range(17))),
    "fewer_elements_with_a_request_id": lambda: _case_simple_contents("req-7", int_contents=list(range(15))),
    "an_empty_contents_message": lambda: _case_simple_contents(),
    "no_data_at_all": _case_no_data,
    "fp16_in_fp32_contents": lambda: _case_contents("id_fp16", "FP16", [1], fp32_contents=[1.0]),
    "fp16_with_empty_contents": lambda: _case_contents("id_fp16", "FP16", [1]),
    "bf16_in_fp32_contents": lambda: _case_contents("id_bf16", "BF16", [1], fp32_contents=[1.0]),
    "int64_in_int_contents": lambda: _case_contents("id_int64", "INT64", [1], int_contents=[1]),
    "int64_count_short": lambda: _case_contents("id_int64", "INT64", [2], int64_contents=[1]),
    "uint8_in_int_contents": lambda: _case_contents("id_uint8", "UINT8", [1], int_contents=[1]),
    "bool_in_int_contents": lambda: _case_contents("id_bool", "BOOL", [1], int_contents=[1]),
    "fp64_in_fp32_contents": lambda: _case_contents("id_fp64", "FP64", [1], fp32_contents=[1.0]),
    "bytes_in_int_contents": lambda: _case_contents("id_string", "BYTES", [1], int_contents=[1]),
    "bytes_fewer_strings": lambda: _case_contents("id_string", "BYTES", [2], bytes_contents=[b"a"]),
    "bytes_more_strings": lambda: _case_contents("id_string", "BYTES", [1], bytes_contents=[b"a", b"b"]),
    "shared_memory_and_contents": lambda: _case_shm_and_contents(False),
    "shared_memory_and_an_empty_contents_message": lambda: _case_shm_and_contents(True),
}


@pytest.mark.parametrize("case", list(_CONTENT_CASES))
def test_grpc_tensor_data_given_twice_or_in_the_wrong_field_is_refused_alike(pair: Pair, case: str) -> None:
    t_rpc, n_rpc = pair.rpc("ModelInfer", _CONTENT_CASES[case]())
    assert t_rpc.code == "INVALID_ARGUMENT"
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)


def test_the_issues_example_gets_tritons_exact_message(pair: Pair) -> None:
    t_rpc, n_rpc = pair.rpc("ModelInfer", _case_raw_and_contents(2, 0))
    expected = "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    assert t_rpc.details == n_rpc.details == expected


@pytest.mark.parametrize(
    "case",
    [
        lambda: _case_contents("id_uint8", "UINT8", [2], uint_contents=[1, 2]),
        lambda: _case_contents("id_bool", "BOOL", [1], bool_contents=[True]),
        lambda: _case_contents("id_string", "BYTES", [2], bytes_contents=[b"a", b""]),
        lambda: _case_contents("id_bf16", "BF16", [0]),  # an empty contents message is data for no elements
    ],
    ids=["uint8", "bool", "bytes", "bf16_empty"],
)
def test_grpc_typed_contents_that_fit_are_served_alike(pair: Pair, case: Any) -> None:
    t_rpc, n_rpc = pair.rpc("ModelInfer", case())
    assert t_rpc.code == n_rpc.code == "OK", (t_rpc.details, n_rpc.details)
    assert list(n_rpc.response.raw_output_contents) == list(t_rpc.response.raw_output_contents)
    assert [(o.name, o.datatype, list(o.shape)) for o in n_rpc.response.outputs] == [
        (o.name, o.datatype, list(o.shape)) for o in t_rpc.response.outputs
    ]


_CONTENTS_FIELDS = {
    "bool_contents": [True],
    "int_contents": [1],
    "int64_contents": [1],
    "uint_contents": [1],
    "uint64_contents": [1],
    "fp32_contents": [1.0],
    "fp64_contents": [1.0],
    "bytes_contents": [b"a"],
}
_WIRE_TYPES = {dtype: "BYTES" if dtype == "STRING" else dtype for dtype in _IDENTITY_TYPES}


@pytest.mark.parametrize("field", list(_CONTENTS_FIELDS))
@pytest.mark.parametrize("dtype", list(_WIRE_TYPES))
def test_every_contents_field_for_every_datatype_is_taken_or_refused_alike(pair: Pair, dtype: str, field: str) -> None:
    """One element in each typed field, for each data type the identity models have: the field of the type is
    served, every other one refused, with Triton's code and words; and one element short of the shape likewise."""
    for shape in ([1], [2]):
        request = _case_contents(f"id_{dtype.lower()}", _WIRE_TYPES[dtype], shape, **{field: _CONTENTS_FIELDS[field]})
        t_rpc, n_rpc = pair.rpc("ModelInfer", request)
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details), (shape, t_rpc.details, n_rpc.details)
        if t_rpc.code == "OK":
            assert list(n_rpc.response.raw_output_contents) == list(t_rpc.response.raw_output_contents)
        else:
            assert t_rpc.code == "INVALID_ARGUMENT"


def test_grpc_shared_memory_input_beside_a_raw_one_is_served_alike(pair: Pair, shm_key: str) -> None:
    body = {"key": shm_key, "offset": 0, "byte_size": 64}
    try:
        triton, nereid = pair.http("POST", "/v2/systemsharedmemory/region/wire_region/register", body)
        assert triton.status == nereid.status == 200
        request = _simple(1)
        _in_shm(request.inputs[0])
        t_rpc, n_rpc = pair.rpc("ModelInfer", request)
        assert t_rpc.code == n_rpc.code == "OK"
        assert list(n_rpc.response.raw_output_contents) == list(t_rpc.response.raw_output_contents)
        # Contents beside shared memory are refused before the region is even looked at; so with a region.
        t_rpc, n_rpc = pair.rpc("ModelInfer", _case_shm_and_contents(False))
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
        assert t_rpc.code == "INVALID_ARGUMENT"
        # Deliberate: a raw entry that no input reads is refused by Nereid; Triton ignores it.
        request = _simple(2)
        _in_shm(request.inputs[0])
        t_rpc, n_rpc = pair.rpc("ModelInfer", request)
        assert (t_rpc.code, n_rpc.code) == ("OK", "INVALID_ARGUMENT")
    finally:
        pair.http("POST", "/v2/systemsharedmemory/unregister")


# -- HTTP: the request id's kind, NaN and Infinity literals ---------------------------------------------------------------


def _fp32_body(**extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}], **extra}


@pytest.mark.parametrize("request_id", [5, 1.5, {"a": 1}, [1], True, None], ids=["int", "float", "object", "list", "bool", "null"])
def test_a_request_id_that_is_not_a_string_is_refused_naming_the_field(pair: Pair, request_id: Any) -> None:
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", _fp32_body(id=request_id))
    # Deliberate: Triton answers this bad input with 500; Nereid with 400, in Triton's words.
    assert (triton.status, nereid.status) == (500, 400)
    assert triton.error == "Unable to parse 'id': attempt to access JSON non-string as string"
    _starts_with_tritons(triton.error, nereid.error)


def test_a_string_request_id_is_echoed_alike(pair: Pair) -> None:
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", _fp32_body(id="req-1"))
    assert triton.status == nereid.status == 200
    assert nereid.json() == triton.json()
    assert triton.json()["id"] == "req-1"


@pytest.mark.parametrize("model", ["id_fp32", "id_fp64"])
@pytest.mark.parametrize("binary_output", [False, True], ids=["json_output", "binary_output"])
def test_nan_and_infinity_literals_in_float_data_are_read_and_written_alike(pair: Pair, model: str, binary_output: bool) -> None:
    datatype = model[3:].upper()
    body: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [4], "data": [math.nan, math.inf, -math.inf, 0.5]}]}
    if binary_output:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    data = json.dumps(body).encode()  # Python's json writes NaN, Infinity and -Infinity by default
    assert b"NaN" in data and b"-Infinity" in data
    triton, nereid = pair.http("POST", f"/v2/models/{model}/infer", data=data)
    assert triton.status == nereid.status == 200
    if not binary_output:
        assert (nereid.content_type, nereid.body) == (triton.content_type, triton.body)
        assert '"data":[NaN,Infinity,-Infinity,0.5]' in triton.body
        return
    replies = {}
    for label, server in pair.servers():
        reply = requests.post(f"{server.base}/v2/models/{model}/infer", data=data, timeout=30)
        length = int(reply.headers["Inference-Header-Content-Length"])
        replies[label] = (json.loads(reply.content[:length]), reply.content[length:])
    assert replies["nereid"] == replies["triton"]
    values = np.frombuffer(replies["nereid"][1], np.float32 if datatype == "FP32" else np.float64)
    assert np.isnan(values[0]) and list(values[1:]) == [math.inf, -math.inf, 0.5]


@pytest.mark.parametrize("spelling", ["-NaN", "Inf", "-Inf"])
def test_the_other_spellings_tritons_parser_reads_are_read_alike(pair: Pair, spelling: str) -> None:
    data = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[%s, 2.5]}]}' % spelling.encode()
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=data)
    assert triton.status == 200
    _same(triton, nereid)


def test_nan_and_infinity_in_request_parameters_are_accepted_alike(pair: Pair) -> None:
    data = json.dumps(_fp32_body(parameters={"scale": math.nan, "limit": math.inf})).encode()
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=data)
    assert triton.status == nereid.status == 200
    assert nereid.json() == triton.json()


@pytest.mark.parametrize("model", ["id_int32", "id_int64", "id_bool", "id_string"])
def test_nan_and_infinity_literals_in_other_data_are_refused(pair: Pair, model: str) -> None:
    datatype = "BYTES" if model == "id_string" else model[3:].upper()
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [2], "data": [math.nan, math.inf]}]}
    triton, nereid = pair.http("POST", f"/v2/models/{model}/infer", data=json.dumps(body).encode())
    # Deliberate: Triton answers these with 500; Nereid with 400 naming the input, the model and the type.
    assert (triton.status, nereid.status) == (500, 400)
    assert triton.error.startswith("Unable to parse")
    assert f"'INPUT0' for model '{model}': expected {datatype} values, got NaN" in nereid.error


@pytest.mark.parametrize(
    "data",
    [
        b'{"id": NaN, "inputs": []}',
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[NaN],"data":[1.0]}]}',
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1e999, 1.0]}]}',
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[nan]}]}',
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[+Infinity]}]}',
    ],
    ids=["id", "shape", "too_big_for_a_double", "lower_case_nan", "plus_infinity"],
)
def test_non_finite_numbers_outside_float_data_are_refused(pair: Pair, data: bytes) -> None:
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=data)
    # Deliberate: Triton answers 500 for bad input; Nereid 400.
    assert (triton.status, nereid.status) == (500, 400)


def test_nan_elsewhere_than_inference_stays_refused(pair: Pair) -> None:
    triton, nereid = pair.http("POST", "/v2/repository/index", data=b'{"ready": NaN}')
    # Deliberate: Triton answers 500 for bad input; Nereid 400.
    assert (triton.status, nereid.status) == (500, 400)
    assert nereid.error.startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize(
    "model, data, kind",
    [
        ("id_fp32", [True, 1.0], "non-number as double"),
        ("id_fp32", [None, 1.0], "non-number as double"),
        ("id_fp64", ["1.0", 1.0], "non-number as double"),
        ("id_int32", [1.5, 2], "non-signed-integer as signed-integer"),
        ("id_int64", [1.0, 2], "non-signed-integer as signed-integer"),
        ("id_int32", [True, 2], "non-signed-integer as signed-integer"),
        ("id_uint8", [-1, 1], "non-unsigned-integer as unsigned-integer"),
        ("id_bool", [1, 0], "non-boolean as boolean"),
    ],
)
def test_json_data_of_the_wrong_kind_is_refused_alike(pair: Pair, model: str, data: list[Any], kind: str) -> None:
    datatype = model[3:].upper()
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [2], "data": data}]}
    triton, nereid = pair.http("POST", f"/v2/models/{model}/infer", data=json.dumps(body).encode())
    # Deliberate: Triton answers 500 for bad input; Nereid 400, naming the input, the model, the type and the value.
    assert (triton.status, nereid.status) == (500, 400)
    assert triton.error == f"Unable to parse 'data': attempt to access JSON {kind}"
    assert nereid.error.startswith(f"Unable to parse 'data' of input 'INPUT0' for model '{model}': expected {datatype} values")


@pytest.mark.parametrize("data", [[[1.0], [2.0, 3.0]], [[[1.0, 2.0]], [[3.0]]]], ids=["ragged", "deeper"])
def test_nested_json_data_of_any_shape_is_read_alike(pair: Pair, data: list[Any]) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": data}]}
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=json.dumps(body).encode())
    assert triton.status == nereid.status == 200
    assert nereid.json()["outputs"] == triton.json()["outputs"]


@pytest.mark.parametrize(
    "model, value, kind",
    [
        ("id_fp32", [True, 1.0], "'data': attempt to access JSON non-number as double"),
        ("id_fp32", [None, 1.0], "'data': attempt to access JSON non-number as double"),
        ("id_int32", [1.5, 2], "'data': attempt to access JSON non-signed-integer as signed-integer"),
        ("id_bool", [1, 0], "'data': attempt to access JSON non-boolean as boolean"),
        ("id_string", [1, "a"], "JSON bytes array: attempt to access JSON non-string as string"),
    ],
)
def test_generate_values_of_the_wrong_kind_are_refused_alike(pair: Pair, model: str, value: list[Any], kind: str) -> None:
    triton, nereid = pair.http("POST", f"/v2/models/{model}/generate", data=json.dumps({"INPUT0": value}).encode())
    # Deliberate: Triton answers 500 for bad input; Nereid 400, naming the model, the input, the type and the value.
    assert (triton.status, nereid.status) == (500, 400)
    assert triton.error == f"Unable to parse {kind}"
    assert f"model '{model}': input 'INPUT0' expects" in nereid.error


@pytest.mark.parametrize("body", [b'{"INPUT0": [NaN, -Infinity, 1.0]}', b'{"INPUT0": [1e39, 1.0]}'], ids=["literals", "overflow"])
def test_generate_reads_and_writes_non_finite_floats_alike(pair: Pair, body: bytes) -> None:
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/generate", data=body)
    assert triton.status == nereid.status == 200
    # Python's json reads the literals both write (orjson's null would read as None); repr makes NaN equal NaN.
    assert repr(nereid.json()["OUTPUT0"]) == repr(triton.json()["OUTPUT0"])


def test_an_integer_outside_its_type_is_refused_by_nereid(pair: Pair) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [2], "data": [300, 1]}]}
    triton, nereid = pair.http("POST", "/v2/models/id_uint8/infer", data=json.dumps(body).encode())
    # Deliberate: Triton wraps 300 into 44; Nereid refuses a value the type cannot hold.
    assert triton.status == 200 and triton.json()["outputs"][0]["data"] == [44, 1]
    assert nereid.status == 400 and "expected UINT8 values" in nereid.error


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_nan_and_infinity_in_fp16_and_bf16_json_data_are_read_by_nereid(pair: Pair, datatype: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [3], "data": [math.nan, math.inf, -math.inf]}]}
    triton, nereid = pair.http("POST", f"/v2/models/id_{datatype.lower()}/infer", data=json.dumps(body).encode())
    # Deliberate: Triton takes FP16 and BF16 data only in binary form; Nereid also takes JSON numbers, NaN included.
    assert triton.status == 400 and triton.error.startswith(f"receiving {datatype} data via JSON is not supported")
    assert nereid.status == 200
    assert '"data":[NaN,Infinity,-Infinity]' in nereid.body


# -- a body that is only one input's raw data (Inference-Header-Content-Length: 0) ---------------------------------------

_RAW_MODELS = {
    # name: (data type, dims, max_batch_size)
    "raw_var": ("TYPE_INT16", "2, -1", 0),
    "raw_two_var": ("TYPE_FP32", "-1, -1", 0),
    "raw_fixed_batched": ("TYPE_FP32", "2, 3", 4),
    "raw_bytes": ("TYPE_STRING", "1", 0),
    "raw_bytes_batched": ("TYPE_STRING", "1", 8),
    "raw_bytes_var": ("TYPE_STRING", "-1", 0),
    "raw_fp16_batched": ("TYPE_FP16", "-1", 8),
}

_RAW_CODE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.batched = json.loads(args["model_config"])["max_batch_size"] > 0

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            rank = np.full((data.shape[0], 1), data.ndim, np.int32) if self.batched else np.array([data.ndim], np.int32)
            outputs = [pb_utils.Tensor("OUTPUT0", data), pb_utils.Tensor("RANK", rank)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def build_raw_models(repo: Path) -> list[str]:
    for name, (dtype, dims, batch) in _RAW_MODELS.items():
        config = (
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: {batch}\n'
            f'input [ {{ name: "INPUT0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dims} ] }}, '
            '{ name: "RANK" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        )
        _write(repo, name, config, _RAW_CODE)
    return list(_RAW_MODELS)


def _raw_answers(pair: Pair, model: str, body: bytes, header: str = "0") -> dict[str, tuple[int, str, Any, bytes]]:
    """Per server: status, content type, the JSON part and the binary part of the answer."""
    answers = {}
    for label, server in pair.servers():
        reply = requests.post(
            f"{server.base}/v2/models/{model}/infer",
            data=body,
            headers={"Inference-Header-Content-Length": header, "Content-Type": "application/octet-stream"},
            timeout=30,
        )
        length = int(reply.headers.get("Inference-Header-Content-Length", len(reply.content)))
        answers[label] = (
            reply.status_code,
            reply.headers.get("content-type", ""),
            json.loads(reply.content[:length]),
            reply.content[length:],
        )
    return answers


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("id_fp32", np.array([1.5, -2.0, 3.25], np.float32).tobytes()),
        ("id_fp32", b""),  # a zero-size tensor: a JSON answer, no binary part
        ("raw_var", np.arange(6, dtype=np.int16).tobytes()),
        ("raw_fixed_batched", np.arange(6, dtype=np.float32).tobytes()),  # a batch of one
        ("raw_bytes", b"hello"),  # the element's bytes, without a length prefix
        ("raw_bytes", b"\x05\x00\x00\x00hello"),  # ... so a prefix is part of the element
        ("raw_bytes_batched", "ünï".encode()),
        ("raw_fp16_batched", np.array([1, 2, 3], np.float16).tobytes()),
    ],
    ids=["fp32", "fp32_empty", "int16_one_variable_dim", "fixed_batched", "bytes", "bytes_with_prefix", "bytes_batched", "fp16_batched"],
)
def test_a_raw_binary_body_is_served_alike(pair: Pair, model: str, body: bytes) -> None:
    answers = _raw_answers(pair, model, body)
    assert answers["triton"][0] == 200, answers["triton"]
    assert answers["nereid"] == answers["triton"]


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("simple", bytes(64)),  # two inputs
        ("raw_two_var", bytes(8)),
        ("raw_bytes_var", b"hello"),
        ("id_fp32", bytes(7)),  # not a whole number of elements
        ("raw_fixed_batched", bytes(48)),  # the fixed shape holds 24 bytes
        ("raw_var", bytes(10)),  # [2, -1] of INT16 in 10 bytes
        ("id_fp32", b'{"inputs": []}'),  # with a zero header length, JSON is data too
    ],
    ids=["two_inputs", "two_variable_dims", "bytes_not_shape_1", "partial_element", "fixed_shape_size", "variable_dim_remainder", "json_as_data"],
)
def test_a_raw_binary_body_that_cannot_be_deduced_is_refused_alike(pair: Pair, model: str, body: bytes) -> None:
    answers = _raw_answers(pair, model, body)
    assert answers["triton"][0] == 400
    assert answers["nereid"] == answers["triton"]


@pytest.mark.parametrize("header", ["-1", "100"])
def test_an_inference_header_length_outside_the_body_is_refused_alike(pair: Pair, header: str) -> None:
    data = np.ones(2, np.float32).tobytes()
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=data, headers={"Inference-Header-Content-Length": header})
    assert triton.status == 400
    _same(triton, nereid)


def test_an_inference_header_length_that_is_not_a_number_is_refused_by_nereid(pair: Pair) -> None:
    data = np.ones(2, np.float32).tobytes()
    triton, nereid = pair.http("POST", "/v2/models/id_fp32/infer", data=data, headers={"Inference-Header-Content-Length": "x"})
    # Deliberate: Triton reads a header that is not a number as 0 (a raw body); Nereid refuses it.
    assert (triton.status, nereid.status) == (200, 400)
    assert "Inference-Header-Content-Length" in nereid.error
