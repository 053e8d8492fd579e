"""hypothesis against a real server: malformed v2 JSON bodies, binary-extension bodies and gRPC ModelInferRequests,
near-valid and random, to ONNX, Python, BYTES and ensemble models, plus random HTTP/2 frames on the gRPC port.
Every answer must be a 4xx or a well-formed model error (never UNKNOWN, never an unhandled exception in the log)
and the server must keep serving."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.fuzz_support import DERANDOMIZE, FUZZ_MODELS, assert_well_formed, fuzz_repository
from tests.servers import RunningServer, start_nereid

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=DERANDOMIZE)
_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
              "FP64", "BF16", "BYTES", "STRING", "", "int32"]
_NAMES = ["INPUT0", "INPUT1", "OUTPUT0", "", "input0", "\u00e9\u0000"]
_dims = st.one_of(st.integers(0, 20), st.sampled_from([1, 4, 16, 2**31, 2**40, 2**62, 2**63 - 1]), st.integers(-2, -1))
_shapes = st.lists(_dims, max_size=4)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=24,
)
_parameters = st.one_of(
    st.dictionaries(
        st.sampled_from(["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                         "binary_data_size", "shared_memory_region", "shared_memory_byte_size", "custom"]),
        _json,
        max_size=3,
    ),
    _json,
)
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(_NAMES), "datatype": st.sampled_from(_DATATYPES), "shape": _shapes},
    optional={
        "data": st.one_of(st.lists(st.integers(-5, 5), max_size=40), st.lists(st.text(max_size=4), max_size=8), _json),
        "parameters": _parameters,
    },
)
_doc = st.fixed_dictionaries(
    {"inputs": st.one_of(st.lists(_tensor, max_size=3), _json)},
    optional={
        "id": _json,
        "parameters": _parameters,
        "outputs": st.one_of(st.lists(st.fixed_dictionaries({"name": st.sampled_from(_NAMES)}, optional={"parameters": _parameters}), max_size=3), _json),
    },
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = fuzz_repository(tmp_path_factory.mktemp("fuzz_repo"))
    server = start_nereid(repo, "--log-verbose=0", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    log = server.log()
    assert server.stop() == 0, log
    assert "Traceback" not in log, log[-5000:]


_SESSION = requests.Session()


def _check(response: requests.Response, what: str) -> None:
    assert_well_formed(response.status_code, response.content, response.headers.get("content-type", ""), what)


# The shapes that broke servers: [1, 2^40] kills Triton 2.51; an empty tensor whose other dims overflow numpy.
_NASTY_SHAPES = [[1, 2**40], [0, 2**62, 2**62], [2**63 - 1, 0, 3], [2**31, 2**31, 4]]


def _nasty_doc(shape: list[int], datatype: str = "FP32", data: Any = None) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data or []}
    return {"inputs": [tensor, dict(tensor, name="INPUT1")]}


@_FUZZ
@given(model=st.sampled_from(FUZZ_MODELS), doc=st.one_of(_doc, _json))
@example(model="add_sub_python", doc=_nasty_doc([1, 2**40]))
@example(model="add_sub_python", doc=_nasty_doc([0, 2**62, 2**62]))
@example(model="simple_string", doc=_nasty_doc([0, 2**62, 2**62], "BYTES"))
@example(model="identity_fp32", doc=_nasty_doc([2**63 - 1, 0, 3], "FP32"))
def test_malformed_json_requests_get_a_client_error(fuzz_server: RunningServer, model: str, doc: Any) -> None:
    response = _SESSION.post(f"{fuzz_server.base}/v2/models/{model}/infer", data=orjson.dumps(doc), timeout=30)
    _check(response, f"{model}: {doc!r}")


@_FUZZ
@given(
    model=st.sampled_from(FUZZ_MODELS),
    doc=_doc,
    binary=st.binary(max_size=300),
    header_length=st.one_of(st.none(), st.integers(-3, 2000), st.sampled_from(["", "x", "1e3", "99999999999999999999"])),
)
@example(model="simple", doc={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [0, 2**62, 2**62],
        "parameters": {"binary_data_size": 0}}]}, binary=b"", header_length=None)
@example(model="simple_string", doc={"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2**40],
        "parameters": {"binary_data_size": 4}}]}, binary=b"\xff\xff\xff\x7f", header_length=None)
def test_malformed_binary_requests_get_a_client_error(
    fuzz_server: RunningServer, model: str, doc: dict[str, Any], binary: bytes, header_length: int | str | None
) -> None:
    header = orjson.dumps(doc)
    headers = {"Content-Type": "application/octet-stream"}
    headers["Inference-Header-Content-Length"] = str(len(header) if header_length is None else header_length)
    response = _SESSION.post(f"{fuzz_server.base}/v2/models/{model}/infer", data=header + binary, headers=headers, timeout=30)
    _check(response, f"{model}: {doc!r} + {len(binary)} bytes")


@_FUZZ
@given(model=st.sampled_from(FUZZ_MODELS), body=st.binary(max_size=400), encoding=st.sampled_from([None, "gzip", "deflate", "br"]))
def test_random_bodies_get_a_client_error(fuzz_server: RunningServer, model: str, body: bytes, encoding: str | None) -> None:
    headers = {"Content-Encoding": encoding} if encoding else {}
    response = _SESSION.post(f"{fuzz_server.base}/v2/models/{model}/infer", data=body, headers=headers, timeout=30)
    _check(response, f"{model}: {body[:60]!r}")


# -- gRPC ------------------------------------------------------------------------------------------------------------
def _contents(tensor: Any, datatype: str, values: list[int]) -> None:
    field = {"BOOL": "bool_contents", "INT32": "int_contents", "INT64": "int64_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
    target = getattr(tensor.contents, field.get(datatype, "int_contents"))
    if datatype == "BYTES":
        target.extend(str(v).encode() for v in values)
    elif datatype == "BOOL":
        target.extend(bool(v) for v in values)
    elif datatype in ("FP32", "FP64"):
        target.extend(float(v) for v in values)
    else:
        target.extend(min(abs(v), 2**31 - 1) for v in values)  # abs(-2**31) does not fit int_contents


_grpc_tensor = st.fixed_dictionaries(
    {
        "name": st.sampled_from(_NAMES),
        "datatype": st.sampled_from(_DATATYPES),
        "shape": st.lists(st.one_of(st.integers(0, 20), st.sampled_from([2**40, 2**62, 2**63 - 1]), st.integers(-3, -1)), max_size=4),
        "source": st.sampled_from(["raw", "contents", "none", "shm"]),
        "values": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40),
        "raw": st.binary(max_size=128),
        "param": st.sampled_from([None, "sequence_id", "shared_memory_byte_size", "binary_data_size"]),
    }
)


def _infer_request(model: str, version: str, tensors: list[dict[str, Any]], extra_raw: int, params: dict[str, Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id="fuzz")
    for spec in tensors:
        tensor = request.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        if spec["source"] == "raw":
            request.raw_input_contents.append(spec["raw"])
        elif spec["source"] == "contents":
            _contents(tensor, spec["datatype"], spec["values"])
        elif spec["source"] == "shm":
            tensor.parameters["shared_memory_region"].string_param = "no_region"
            tensor.parameters["shared_memory_byte_size"].int64_param = len(spec["raw"])
        if spec["param"] is not None:
            tensor.parameters[spec["param"]].string_param = "x"
    for _ in range(extra_raw):
        request.raw_input_contents.append(b"\x00" * 4)
    for key, value in params.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = str(value)
    request.outputs.add(name="OUTPUT0")
    return request


@pytest.fixture(scope="module")
def grpc_stub(fuzz_server: RunningServer) -> Iterator[Any]:
    channel = grpc.insecure_channel(fuzz_server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


_BAD_GRPC = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.DATA_LOSS}


@_FUZZ
@given(
    model=st.sampled_from(FUZZ_MODELS + ["", "no_such_model"]),
    version=st.sampled_from(["", "1", "2", "x", "-1"]),
    tensors=st.lists(_grpc_tensor, max_size=3),
    extra_raw=st.integers(0, 2),
    params=st.dictionaries(
        st.sampled_from(["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "x"]),
        st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=4)),
        max_size=3,
    ),
)
@example(model="simple", version="", extra_raw=0, params={},
         tensors=[{"name": "INPUT0", "datatype": "INT32", "shape": [0, 2**62, 2**62], "source": "contents", "values": [],
                   "raw": b"", "param": None}])
@example(model="simple", version="", extra_raw=0, params={},
         tensors=[{"name": "INPUT0", "datatype": "INT32", "shape": [0, 2**62, 2**62], "source": "raw", "values": [],
                   "raw": b"", "param": None}])
def test_malformed_grpc_infer_requests_get_a_clean_status(
    grpc_stub: Any, model: str, version: str, tensors: list[dict[str, Any]], extra_raw: int, params: dict[str, Any]
) -> None:
    request = _infer_request(model, version, tensors, extra_raw, params)
    try:
        grpc_stub.ModelInfer(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() not in _BAD_GRPC, f"{exc.code()}: {exc.details()} for {request}"
        if exc.code() == grpc.StatusCode.INTERNAL:
            assert "Unexpected error" not in (exc.details() or ""), exc.details()


@_FUZZ
@given(payload=st.binary(max_size=300))
def test_random_grpc_message_bytes_get_a_clean_status(fuzz_server: RunningServer, payload: bytes) -> None:
    channel = grpc.insecure_channel(fuzz_server.grpc_url)
    try:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        call(payload, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() not in _BAD_GRPC, f"{exc.code()}: {exc.details()}"
    finally:
        channel.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=DERANDOMIZE)
@given(
    frames=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 255), st.integers(0, 9), st.binary(max_size=48)), max_size=10
    )
)
def test_random_http2_frames_leave_the_grpc_port_serving(fuzz_server: RunningServer, frames: list[tuple[int, int, int, bytes]]) -> None:
    wire = bytearray(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    for kind, flags, stream_id, payload in frames:
        wire += struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + payload
    with socket.create_connection(("127.0.0.1", fuzz_server.grpc_port), timeout=10) as sock:
        sock.sendall(bytes(wire))
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):  # the server answers and closes, or closes when we do: never hangs
                pass
        except ConnectionResetError:
            pass


def test_server_serves_both_protocols_after_the_fuzzing(fuzz_server: RunningServer, grpc_stub: Any) -> None:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]}
    response = requests.post(f"{fuzz_server.base}/v2/models/add_sub_python/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    reply = grpc_stub.ModelInfer(request, timeout=30)
    assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == [2 * i for i in range(16)]
