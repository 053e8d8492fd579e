"""Differential tests: batch_input, batch_output, allow_ragged_batch and is_shape_tensor behave as in real Triton.

Real Triton here runs only Python-backend models, so these cover what that backend shows: which configs
load and which are refused (with Triton's wording), what /config reports, and what `model.py` sees when
ragged requests are dynamically batched (Triton's Python backend hands batch inputs to no model: it passes
requests one by one, so only backends that concatenate a batch, such as ONNX Runtime, receive them; the
integration tests cover that).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.servers import RunningServer, start_nereid, start_real_triton

pytestmark = pytest.mark.differential

# Reports, for each request, the inputs it carries and how many requests its execution held.
_ECHO_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {t.name(): [list(t.as_numpy().shape), t.as_numpy().tolist()] for t in request.inputs()}
            report = {
                "inputs": seen,
                "batch_input_visible": pb_utils.get_input_tensor_by_name(request, "INDEX") is not None,
                "requests_in_execution": len(requests),
            }
            rows = request.inputs()[0].as_numpy().shape[0]
            out = np.array([[json.dumps(report, sort_keys=True).encode()]] * rows, dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", out)]))
        return responses
"""

_HEAD = 'backend: "python"\nmax_batch_size: {mbs}\n'
_RAGGED_INPUT = 'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
_INPUT = 'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
_REPORT = 'output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
_ALL_KINDS = "".join(
    f'{{ kind: {kind} target_name: "{target}" data_type: {dtype} source_input: "INPUT" }},\n'
    for kind, target, dtype in (
        ("BATCH_ELEMENT_COUNT", "INDEX", "TYPE_FP32"),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", "ACC", "TYPE_INT32"),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ACC0", "TYPE_INT32"),
        ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "MAXSHAPE", "TYPE_INT32"),
        ("BATCH_ITEM_SHAPE", "SHAPE", "TYPE_INT32"),
        ("BATCH_ITEM_SHAPE_FLATTEN", "FLAT", "TYPE_FP32"),
    )
).rstrip(",\n")

# Configs real Triton loads (200) or refuses (400); the refusals' text must appear in Nereid's answer too.
_CONFIGS = {
    "ragged_echo": _HEAD.format(mbs=8)
    + "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 20000000 }\n"
    + _RAGGED_INPUT
    + f"batch_input [ {_ALL_KINDS} ]\n"
    + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "REPORT" source_input: "INPUT" } ]\n'
    + _REPORT,
    "bi_target_is_an_input": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "INPUT" data_type: TYPE_INT32 source_input: "INPUT" } ]\n'
    + _REPORT,
    "bi_without_target": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ITEM_SHAPE data_type: TYPE_INT32 source_input: "INPUT" } ]\n'
    + _REPORT,
    "bi_without_batching": _HEAD.format(mbs=0)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "EC" data_type: TYPE_INT32 source_input: "INPUT" } ]\n'
    + _REPORT,
    "bi_int64": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "EC" data_type: TYPE_INT64 source_input: "INPUT" } ]\n'
    + _REPORT,
    "bi_unknown_source": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "EC" data_type: TYPE_INT32 source_input: "NOPE" } ]\n'
    + _REPORT,
    "bi_two_sources": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "EC" data_type: TYPE_INT32 source_input: ["INPUT", "INPUT"] } ]\n'
    + _REPORT,
    "bi_no_source": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_input [ { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "EC" data_type: TYPE_INT32 } ]\n'
    + _REPORT,
    "bo_unknown_target": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "NOPE" source_input: "INPUT" } ]\n'
    + _REPORT,
    "bo_target_twice": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["REPORT", "REPORT"] source_input: "INPUT" } ]\n'
    + _REPORT,
    "bo_unknown_source": _HEAD.format(mbs=8)
    + _INPUT
    + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "REPORT" source_input: "X" } ]\n'
    + _REPORT,
    "shape_tensor_input": _HEAD.format(mbs=8)
    + 'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]\n'
    + _REPORT,
    "shape_tensor_output": _HEAD.format(mbs=0)
    + 'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
    + 'output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] is_shape_tensor: true } ]\n',
}


class Pair:
    def __init__(self, repo: Path) -> None:
        self.triton = start_real_triton(repo, "--model-control-mode=explicit", need_ready=False)
        try:
            self.nereid = start_nereid(repo, "--model-control-mode=explicit", need_ready=False)
        except Exception:
            self.triton.stop()
            raise

    def each(self) -> list[tuple[str, RunningServer]]:
        return [("triton", self.triton), ("nereid", self.nereid)]

    def close(self) -> None:
        self.nereid.stop()
        self.triton.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repo = tmp_path_factory.mktemp("batch-io") / "repo"
    for name, config in _CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(_ECHO_MODEL)
    pair = Pair(repo)
    yield pair
    pair.close()


def _load(server: RunningServer, model: str) -> requests.Response:
    return requests.post(f"{server.base}/v2/repository/models/{model}/load", timeout=120)


@pytest.mark.parametrize(
    "model",
    ["bi_int64", "bi_unknown_source", "bi_two_sources", "bi_no_source", "bo_unknown_target", "bo_target_twice",
     "bo_unknown_source", "shape_tensor_input", "shape_tensor_output"],
)
def test_a_bad_batch_io_or_shape_tensor_config_is_refused_with_tritons_words(pair: Pair, model: str) -> None:
    triton = _load(pair.triton, model)
    nereid = _load(pair.nereid, model)
    assert triton.status_code == nereid.status_code == 400
    # Triton: "load failed for model 'm': version 1 is at UNAVAILABLE state: Invalid argument: <reason>;\n"
    reason = triton.json()["error"].split("Invalid argument: ", 1)[1].rstrip(";\n")
    assert reason in nereid.json()["error"]
    for _, server in pair.each():
        assert requests.get(f"{server.base}/v2/models/{model}/ready", timeout=10).status_code == 400


@pytest.mark.parametrize("model", ["bi_target_is_an_input", "bi_without_target", "bi_without_batching", "ragged_echo"])
def test_a_good_batch_io_config_loads_and_reports_alike(pair: Pair, model: str) -> None:
    configs = {}
    for name, server in pair.each():
        assert _load(server, model).status_code == 200, name
        config = requests.get(f"{server.base}/v2/models/{model}/config", timeout=10).json()
        configs[name] = {key: config.get(key) for key in ("batch_input", "batch_output", "max_batch_size")}
        configs[name]["input"] = [(i["name"], i["allow_ragged_batch"], i["is_shape_tensor"]) for i in config["input"]]
    assert configs["nereid"] == configs["triton"]


def _ragged_input(module: Any, length: int) -> Any:
    tensor = module.InferInput("INPUT", [1, length], "FP32")
    tensor.set_data_from_numpy(np.arange(length, dtype=np.float32).reshape(1, length))
    return tensor


def _concurrent_reports(server: RunningServer, lengths: list[int], protocol: str) -> list[dict[str, Any]]:
    """Send one ragged request per length at once; the model's report for each, in the order sent."""
    results: list[Any] = []
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http_url, concurrency=len(lengths), network_timeout=120) as client:
            handles = [client.async_infer("ragged_echo", [_ragged_input(httpclient, n)]) for n in lengths]
            results = [handle.get_result() for handle in handles]
    else:
        done = threading.Semaphore(0)
        answers: dict[int, Any] = {}

        def keep(index: int, result: Any, error: Any) -> None:
            answers[index] = error if error is not None else result
            done.release()

        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            for index, n in enumerate(lengths):
                client.async_infer("ragged_echo", [_ragged_input(grpcclient, n)], partial(keep, index), client_timeout=120)
            for _ in lengths:
                assert done.acquire(timeout=120)
        results = [answers[i] for i in range(len(lengths))]
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors
    reports = []
    for result in results:
        out = result.as_numpy("REPORT")
        reports.append({"shape": list(out.shape), "report": json.loads(out[0][0])})
    return reports


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ragged_requests_batch_together_and_the_python_model_sees_only_its_own_inputs(pair: Pair, protocol: str) -> None:
    answers = {}
    for name, server in pair.each():
        assert _load(server, "ragged_echo").status_code == 200
        answers[name] = _concurrent_reports(server, [3, 4, 5], protocol)
    assert answers["nereid"] == answers["triton"]
    # What the comparison covers: three requests of different shapes ran in one execution (the inputs are
    # ragged), each saw its own unpadded input, and no batch input reached model.py.
    for entry, length in zip(answers["triton"], [3, 4, 5], strict=True):
        assert entry["report"]["requests_in_execution"] == 3
        assert entry["report"]["inputs"] == {"INPUT": [[1, length], [list(map(float, range(length)))]]}
        assert entry["report"]["batch_input_visible"] is False
