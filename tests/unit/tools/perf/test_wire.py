"""Request bytes: HTTP/1.1 requests and gRPC messages built from templates, with ids and sequence parameters
spliced in, must parse back to exactly what a client library would have sent."""

from __future__ import annotations

import dataclasses
import json

import httptools
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from nereid.tools.perf import PerfConfig
from nereid.tools.perf.control_client import ModelInfo, TensorSpec
from nereid.tools.perf.input_data import build_inputs
from nereid.tools.perf.load_modes import SequencePlan, SequenceSource, send_times, sequence_parameters, split_level
from nereid.tools.perf.payloads import encode_grpc, encode_http, http_target
from nereid.tools.perf.wire import grpc_request_suffix, http_request

MODEL = ModelInfo(
    "simple", "", "onnx", 8, [TensorSpec("INPUT0", "INT32", [4]), TensorSpec("INPUT1", "INT32", [4])],
    [TensorSpec("OUTPUT0", "INT32", [4])], False, False,
)  # fmt: skip


class _Request:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = b""
        self.url = b""
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


def _parse_http(data: bytes) -> _Request:
    request = _Request()
    httptools.HttpRequestParser(request).feed_data(data)
    assert request.done
    return request


def test_http_json_request_round_trips() -> None:
    config = PerfConfig("simple", url="127.0.0.1:8000", input_tensor_format="json", output_tensor_format="json")
    inputs = build_inputs(MODEL, config)
    template = encode_http(MODEL, inputs, config, None)[0][0]
    data = http_request(http_target(MODEL, config), template, parameters={"sequence_id": 7, "sequence_start": True})
    request = _parse_http(data)
    assert request.url == b"/v2/models/simple/infer"
    assert request.headers["host"] == "127.0.0.1:8000" and request.headers["content-type"] == "application/json"
    doc = json.loads(request.body)
    assert doc["parameters"] == {"sequence_id": 7, "sequence_start": True}
    assert [i["name"] for i in doc["inputs"]] == ["INPUT0", "INPUT1"]
    assert doc["inputs"][0]["shape"] == [1, 4] and doc["inputs"][0]["data"] == inputs.streams[0][0][0].values
    assert "outputs" not in doc


def test_http_binary_request_carries_tensors_after_the_header() -> None:
    config = PerfConfig("simple", url="h:1", model_version="3", headers={"X-Trace": "on"})
    model = dataclasses.replace(MODEL, version="3")
    inputs = build_inputs(model, config)
    data = http_request(http_target(model, config), encode_http(model, inputs, config, None)[0][0])
    request = _parse_http(data)
    assert request.url == b"/v2/models/simple/versions/3/infer" and request.headers["x-trace"] == "on"
    header_length = int(request.headers["inference-header-content-length"])
    header = json.loads(request.body[:header_length])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 16}
    assert header["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    raw = request.body[header_length:]
    assert raw == inputs.streams[0][0][0].raw + inputs.streams[0][0][1].raw


def test_grpc_suffix_merges_id_and_parameters_into_the_template() -> None:
    config = PerfConfig("simple", protocol="grpc")
    inputs = build_inputs(MODEL, config)
    template = encode_grpc(MODEL, inputs, config, None, {"triton_enable_empty_final_response": True})[0][0]
    suffix = grpc_request_suffix("0.42", {"sequence_id": 2**40, "sequence_start": True, "sequence_end": False, "tag": "x"})
    request = pb.ModelInferRequest.FromString(template.message + suffix)
    assert request.model_name == "simple" and request.id == "0.42"
    assert request.parameters["sequence_id"].int64_param == 2**40
    assert request.parameters["sequence_start"].bool_param is True
    assert request.parameters["sequence_end"].bool_param is False
    assert request.parameters["tag"].string_param == "x"
    assert request.parameters["triton_enable_empty_final_response"].bool_param is True
    assert [list(i.shape) for i in request.inputs] == [[1, 4], [1, 4]]
    assert np.frombuffer(request.raw_input_contents[0], np.int32).tolist() == inputs.streams[0][0][0].values


def test_split_level_shares_concurrency_and_rate() -> None:
    assert [p.concurrency for p in split_level("concurrency", 5, 2, "constant", 0)] == [3, 2]
    plans = split_level("request_rate", 300.0, 3, "poisson", 0)
    assert [p.rate for p in plans] == [100.0, 100.0, 100.0] and len({p.phase for p in plans}) == 3


def test_send_times_keep_the_rate() -> None:
    plan = split_level("request_rate", 1000.0, 1, "constant", 0)[0]
    times = send_times(plan, 0)
    assert [next(times) for _ in range(3)] == [0, 1_000_000, 2_000_000]
    poisson = split_level("request_rate", 1000.0, 1, "poisson", 1)[0]
    gaps = np.diff([next(t) for t in [send_times(poisson, 0)] for _ in range(20001)])
    assert abs(gaps.mean() - 1e6) < 0.05e6 and gaps.std() > 0.8e6  # exponential: std ~ mean


def test_sequences_get_unique_ids_lengths_and_flags() -> None:
    plan = SequencePlan(id_start=10, id_end=None, length=10, variation=20.0, use_data_lengths=False, streams=2, stream_lengths=[3, 5])
    workers = [SequenceSource(plan, i, 2, seed=i) for i in range(2)]
    ids = [w.next_sequence()[0] for _ in range(3) for w in workers]
    assert sorted(ids) == list(range(10, 16))
    lengths = [workers[0].next_sequence()[1] for _ in range(200)]
    assert min(lengths) >= 8 and max(lengths) <= 12 and len(set(lengths)) > 1
    bounded = SequenceSource(SequencePlan(1, 4, 2, 0.0, True, 2, [3, 5]), 0, 1, seed=0)
    assert [bounded.next_sequence() for _ in range(4)] == [(1, 3, 0), (2, 5, 1), (3, 3, 0), (1, 3, 0)]
    assert sequence_parameters(5, 0, 3) == {"sequence_id": 5, "sequence_start": True}
    assert sequence_parameters(5, 1, 3) == {"sequence_id": 5}
    assert sequence_parameters(5, 2, 3) == {"sequence_id": 5, "sequence_end": True}
    assert sequence_parameters(5, 0, 1) == {"sequence_id": 5, "sequence_start": True, "sequence_end": True}
