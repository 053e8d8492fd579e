"""Differential tests: the same Python models on Nereid and on real Triton 2.51 give the same answers.

Both servers load the same models from tests/models/python and get the same requests: outputs, what a model sees
of its requests and initialize() arguments, the completed configuration, error statuses, load failures and
custom metrics must agree. Where Nereid differs on purpose, the test says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.grpc_streams import repeat_inputs, stream
from tests.servers import ROOT, RunningServer, start_nereid, start_real_triton

pytestmark = pytest.mark.differential

REPOSITORY = ROOT / "tests" / "models" / "python"
MODELS = [
    "add_sub",
    "auto_complete",
    "bytes_io",
    "dtypes",
    "request_info",
    "errors",
    "init_fail",
    "auto_complete_conflict",
    "init_args",
    "dlpack",
    "custom_metrics",
    "repeat",
    "single_sender",
]
FLAGS = [
    "--model-control-mode=explicit",
    *[f"--load-model={m}" for m in MODELS],
    "--exit-on-error=false",
    "--strict-readiness=false",
    "--exit-timeout-secs=2",
]


@dataclass
class Pair:
    nereid: RunningServer
    triton: RunningServer

    def each(self) -> list[tuple[str, RunningServer]]:
        return [("triton", self.triton), ("nereid", self.nereid)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    triton = start_real_triton(REPOSITORY, *FLAGS)
    try:
        nereid = start_nereid(REPOSITORY, *FLAGS, log_dir=tmp_path_factory.mktemp("logs"))
    except BaseException:
        triton.stop()
        raise
    yield Pair(nereid, triton)
    nereid.stop()
    triton.stop()


def _input(module: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _both(pair: Pair, module: Any, model: str, make_inputs: Any, **kwargs: Any) -> dict[str, Any]:
    """The result of the same request on each server, over one protocol."""
    results = {}
    for label, server in pair.each():
        url = server.http_url if module is httpclient else server.grpc_url
        client = module.InferenceServerClient(url)
        try:
            results[label] = client.infer(model, make_inputs(module), **kwargs)
        finally:
            client.close()
    return results


def _assert_same_outputs(results: dict[str, Any], names: list[str]) -> None:
    triton, nereid = results["triton"], results["nereid"]
    for name in names:
        expected, got = triton.as_numpy(name), nereid.as_numpy(name)
        assert (got is None) == (expected is None), name
        if expected is None:
            continue
        if name == "PARAMETERS":  # JSON objects: gRPC parameter maps have no order
            assert [json.loads(v) for v in got.reshape(-1)] == [json.loads(v) for v in expected.reshape(-1)]
            continue
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        assert list(got.reshape(-1)) == list(expected.reshape(-1)), name
        assert _datatype(nereid, name) == _datatype(triton, name), name


def _datatype(result: Any, name: str) -> str:
    output = result.get_output(name)
    return str(output["datatype"] if isinstance(output, dict) else output.datatype)


# -- outputs ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_add_sub_gives_the_same_outputs(pair: Pair, module: Any) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3.25, dtype=np.float32)

    def inputs(m: Any) -> list[Any]:
        return [_input(m, "INPUT0", a, "FP32"), _input(m, "INPUT1", b, "FP32")]

    _assert_same_outputs(_both(pair, module, "add_sub", inputs), ["OUTPUT0", "OUTPUT1"])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_every_data_type_and_zero_size_tensors_give_the_same_outputs(pair: Pair, module: Any) -> None:
    types = {
        "BOOL": np.array([True, False, True]),
        "INT8": np.array([-128, 0, 127], np.int8),
        "INT16": np.array([-32768, 1, 32767], np.int16),
        "INT32": np.array([-(2**31), 2, 2**31 - 1], np.int32),
        "INT64": np.array([-(2**63), 3, 2**63 - 1], np.int64),
        "UINT8": np.array([0, 4, 255], np.uint8),
        "UINT16": np.array([0, 5, 65535], np.uint16),
        "UINT32": np.array([0, 6, 2**32 - 1], np.uint32),
        "UINT64": np.array([0, 7, 2**64 - 1], np.uint64),
        "FP16": np.array([-1.5, 0.0, 65504.0], np.float16),
        "FP32": np.array([-1.25, np.inf, 3.0e38], np.float32),
        "FP64": np.array([-2.5, 1e-300, 1e300], np.float64),
        "STRING": np.array([b"", b"\x00\xff", "ünï".encode()], np.object_),
    }

    def inputs(m: Any) -> list[Any]:
        return [_input(m, f"IN_{t}", a, "BYTES" if t == "STRING" else t) for t, a in types.items()]

    _assert_same_outputs(_both(pair, module, "dtypes", inputs), [f"OUT_{t}" for t in types])

    def empty(m: Any) -> list[Any]:
        return [_input(m, "IN_FP32", np.zeros(0, np.float32), "FP32"), _input(m, "IN_STRING", np.zeros(0, np.object_), "BYTES")]

    _assert_same_outputs(_both(pair, module, "dtypes", empty), ["OUT_FP32", "OUT_STRING"])


def test_bytes_and_dlpack_models_give_the_same_outputs(pair: Pair) -> None:
    text = np.array([[b"abc", b"", "ß".encode()]], dtype=np.object_)
    _assert_same_outputs(
        _both(pair, grpcclient, "bytes_io", lambda m: [_input(m, "TEXT", text, "BYTES")]), ["UPPER", "LENGTH"]
    )
    data = np.linspace(-1, 1, 7, dtype=np.float32)
    _assert_same_outputs(_both(pair, httpclient, "dlpack", lambda m: [_input(m, "IN", data, "FP32")]), ["OUT"])


# -- decoupled models --------------------------------------------------------------------------------------------------
def _comparable(responses: list[Any]) -> list[Any]:
    return [
        r if isinstance(r, str) else ({name: value.tolist() for name, value in r[0].items()}, r[1]) for r in responses
    ]


@pytest.mark.parametrize("threaded", [False, True], ids=["from_execute", "from_a_thread_after_execute"])
def test_a_decoupled_model_streams_the_same_responses(pair: Pair, threaded: bool) -> None:
    streams = {
        label: _comparable(stream(server, "repeat", repeat_inputs([3, -4, 5], data_size=3, threaded=threaded)))
        for label, server in pair.each()
    }
    assert streams["nereid"] == streams["triton"]
    assert len(streams["nereid"]) == 4


def test_an_empty_decoupled_stream_is_the_same(pair: Pair) -> None:
    inputs = [_input(grpcclient, "IN", np.zeros(0, np.int32), "INT32")]
    streams = {label: _comparable(stream(server, "repeat", inputs)) for label, server in pair.each()}
    assert streams["nereid"] == streams["triton"] == [({}, True)]


def test_a_decoupled_model_is_refused_on_http_infer_alike(pair: Pair) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    replies = {
        label: requests.post(f"{server.base}/v2/models/repeat/infer", json=body, timeout=30)
        for label, server in pair.each()
    }
    assert replies["nereid"].status_code == replies["triton"].status_code


def test_an_answer_through_the_sender_of_a_model_that_is_not_decoupled_is_the_same(pair: Pair) -> None:
    values = np.array([2.0, -3.0], np.float32)
    _assert_same_outputs(
        _both(pair, httpclient, "single_sender", lambda m: [_input(m, "IN", values, "FP32")]), ["OUT"]
    )


# -- what the model sees -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_models_see_the_same_request_id_parameters_flags_timeout_and_outputs(pair: Pair, module: Any) -> None:
    def inputs(m: Any) -> list[Any]:
        return [_input(m, "IN", np.array([1], np.int32), "INT32")]

    names = ["PARAMETERS", "REQUEST_ID", "CORRELATION_ID", "FLAGS", "TIMEOUT", "REQUESTED"]
    results = _both(
        pair,
        module,
        "request_info",
        inputs,
        request_id="rid-9",
        sequence_id=77,
        sequence_start=True,
        sequence_end=True,
        timeout=5_000_000,
        parameters={"custom": "yes", "n": 3, "flag": True},
    )
    _assert_same_outputs(results, names)
    asked = [module.InferRequestedOutput("REQUESTED"), module.InferRequestedOutput("TIMEOUT")]
    _assert_same_outputs(_both(pair, module, "request_info", inputs, outputs=asked), names)


def test_initialize_gets_the_same_arguments(pair: Pair) -> None:
    replies = {}
    for label, server in pair.each():
        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("init_args", [_input(httpclient, "IN", np.array([1], np.int32), "INT32")])
        replies[label] = json.loads(result.as_numpy("ARGS")[0])
        client.close()
    triton, nereid = replies["triton"], replies["nereid"]
    for reply in (triton, nereid):
        for key in ("input", "output"):
            # Deliberate: tritonclient 2.41's model_config.proto, which Nereid uses, predates this field.
            reply["helpers"][key].pop("is_non_linear_format_io", None)
    assert nereid["helpers"] == triton["helpers"]
    assert set(nereid["args"]) == set(triton["args"])
    for key in set(triton["args"]) - {"model_config"}:
        assert nereid["args"][key] == triton["args"][key], key
    assert _essentials(json.loads(nereid["args"]["model_config"])) == _essentials(json.loads(triton["args"]["model_config"]))


# -- configuration ------------------------------------------------------------------------------------------------------
def _essentials(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config that decide how a model is served."""
    tensor_keys = ("name", "data_type", "dims", "optional", "format", "allow_ragged_batch", "is_shape_tensor", "reshape")
    batching = config.get("dynamic_batching")
    return {
        "name": config["name"],
        "backend": config["backend"],
        "platform": config.get("platform", ""),
        "max_batch_size": config["max_batch_size"],
        "input": [{k: t.get(k) for k in tensor_keys} for t in config["input"]],
        "output": [{k: t.get(k) for k in tensor_keys} for t in config["output"]],
        "dynamic_batching": None if batching is None else bool(batching is not None),
        "sequence_batching": "sequence_batching" in config,
        "model_transaction_policy": config.get("model_transaction_policy", {}).get("decoupled", False),
        "default_model_filename": config["default_model_filename"],
        "instance_group": [(g["kind"], g["count"]) for g in config["instance_group"]],
        "parameters": config.get("parameters", {}),
        "version_policy": config["version_policy"],
    }


@pytest.mark.parametrize("model", ["add_sub", "auto_complete", "errors", "init_args", "dtypes"])
def test_the_completed_configuration_is_the_same(pair: Pair, model: str) -> None:
    configs = {
        label: requests.get(f"{server.base}/v2/models/{model}/config", timeout=10).json() for label, server in pair.each()
    }
    assert _essentials(configs["nereid"]) == _essentials(configs["triton"])


# -- errors -------------------------------------------------------------------------------------------------------------
def _statuses(pair: Pair, mode: str) -> dict[str, tuple[int, str]]:
    body = {"inputs": [{"name": "MODE", "shape": [1, 1], "datatype": "BYTES", "data": [mode]}]}
    found = {}
    for label, server in pair.each():
        reply = requests.post(f"{server.base}/v2/models/errors/infer", json=body, timeout=30)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            client.infer("errors", [_input(grpcclient, "MODE", np.array([[mode.encode()]], np.object_), "BYTES")])
            code = "OK"
        except InferenceServerException as exc:
            code = str(exc.status())
        finally:
            client.close()
        found[label] = (reply.status_code, code)
    return found


@pytest.mark.parametrize(
    "mode",
    [
        "ok",
        "raise",
        "model_exception",
        "code:INVALID_ARG",
        "code:NOT_FOUND",
        "code:UNAVAILABLE",
        "code:UNSUPPORTED",
        "code:INTERNAL",
        "code:UNKNOWN",
        "code:ALREADY_EXISTS",
        "code:CANCELLED",
        "default_code",
        "too_few",
        "too_many",
        "wrong_type",
        # Not "none": Triton never answers a request whose execute() returns None; Nereid answers with an error.
    ],
)
def test_errors_get_the_same_http_status_and_grpc_code(pair: Pair, mode: str) -> None:
    statuses = _statuses(pair, mode)
    assert statuses["nereid"] == statuses["triton"]


def test_outputs_not_asked_for_are_dropped_alike(pair: Pair) -> None:
    bodies = [
        {"inputs": [{"name": "MODE", "shape": [1, 1], "datatype": "BYTES", "data": ["extra_output"]}]},
        {
            "inputs": [{"name": "MODE", "shape": [1, 1], "datatype": "BYTES", "data": ["both"]}],
            "outputs": [{"name": "OUT2"}],
        },
    ]
    for body in bodies:
        replies = {
            label: requests.post(f"{server.base}/v2/models/errors/infer", json=body, timeout=30).json()
            for label, server in pair.each()
        }
        assert replies["nereid"]["outputs"] == replies["triton"]["outputs"]


def test_a_failing_initialize_leaves_the_model_unavailable_alike(pair: Pair) -> None:
    for _, server in pair.each():
        index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
        entry = next(e for e in index if e["name"] == "init_fail")
        assert entry["state"] == "UNAVAILABLE"
        assert "ValueError: initialize exploded on purpose" in entry["reason"]
        assert requests.get(f"{server.base}/v2/models/init_fail/ready", timeout=10).status_code != 200


def test_an_auto_complete_that_contradicts_the_configuration_fails_alike(pair: Pair) -> None:
    for _, server in pair.each():
        index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
        entry = next(e for e in index if e["name"] == "auto_complete_conflict")
        assert entry["state"] == "UNAVAILABLE"
        assert "ValueError" in entry["reason"] and "auto_complete_conflict" in entry["reason"]


# -- custom metrics -----------------------------------------------------------------------------------------------------
def _custom_samples(server: RunningServer) -> dict[str, Any]:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    samples: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith(("custom_", "# TYPE custom_")):
            continue
        if line.startswith("#"):
            _, _, name, kind = line.split()
            samples[f"type:{name}"] = kind
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{")[0]
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', head)))
        samples[f"{name}{labels}"] = float(value)
    return samples


def test_custom_metrics_are_exported_alike(pair: Pair) -> None:
    for _, server in pair.each():
        client = httpclient.InferenceServerClient(server.http_url)
        for value in (0.5, 3.0):
            client.infer("custom_metrics", [_input(httpclient, "VALUE", np.array([value], np.float32), "FP32")])
        client.close()
    triton, nereid = _custom_samples(pair.triton), _custom_samples(pair.nereid)
    assert triton  # the families are there at all
    assert nereid == triton
