"""Statistics of decoupled models per response (`response_stats`) and the `memory_usage` list, over HTTP JSON and
gRPC, in the layout real Triton 2.51 reports them (its Python backend reports no response statistics; Nereid
reports them for every decoupled model, in the schema Triton's backends that report them use)."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import reference_triton
from tests.servers import RunningServer, start_nereid, start_real_triton

MODELS = Path(__file__).parent.parent / "models" / "python"
RESPONSE_FIELDS = ["cancel", "compute_infer", "compute_output", "empty_response", "fail", "success"]

# Run by a newer official tritonclient (the one real Triton's tool installs), whose service protobuf has
# response_stats: prints the gRPC statistics of one model as JSON.
_NEWER_CLIENT = """
import sys, tritonclient.grpc as g
from google.protobuf import json_format
client = g.InferenceServerClient(sys.argv[1])
stats = client.get_inference_statistics(sys.argv[2])
print(json_format.MessageToJson(stats, preserving_proto_field_name=True, including_default_value_fields=True)
      if "including_default_value_fields" in json_format.MessageToJson.__code__.co_varnames
      else json_format.MessageToJson(stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True))
"""


def _newer_client_python() -> str:
    """The Python of real Triton's venv, which has a tritonclient whose protobuf knows response_stats."""
    return str(reference_triton.require().python)


def _grpc_stats_by_newer_client(python: str, server: RunningServer, model: str) -> dict[str, Any]:
    out = subprocess.run(
        [python, "-c", _NEWER_CLIENT, server.grpc_url, model], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def _put(responses: queue.Queue[Any], result: Any, error: Any) -> None:
    responses.put(error if error is not None else result)


def _stream(server: RunningServer) -> list[Any]:
    """Two streams to `repeat`: [1, -2, 3] (a success, an error, a success, then a bare final flag) and []
    (only the bare final flag, asked for with enable_empty_final_response)."""
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=partial(_put, responses))
    try:
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([1, -2, 3], dtype=np.int32))
        client.async_stream_infer("repeat", [tensor], request_id="three")
        got = [responses.get(timeout=30) for _ in range(3)]
        empty = grpcclient.InferInput("IN", [0], "INT32")
        empty.set_data_from_numpy(np.array([], dtype=np.int32))
        client.async_stream_infer("repeat", [empty], request_id="none", enable_empty_final_response=True)
        got.append(responses.get(timeout=30))
    finally:
        client.stop_stream()
    return got


def _infer_add_sub(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        client.infer("add_sub", inputs)


def _repository(tmp_path: Path) -> Path:
    repository = tmp_path / "repository"
    for name in ("repeat", "add_sub"):
        shutil.copytree(MODELS / name, repository / name)
    return repository


def _http_stats(server: RunningServer, model: str) -> dict[str, Any]:
    """The model's statistics once its requests are counted: real Triton counts a request a moment after the
    client has its last response (it read inference_count 0 at times, right after a stream ended)."""
    deadline = time.monotonic() + 10
    while True:
        (stats,) = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
        if int(stats.get("inference_count", 0)) > 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_decoupled_responses_are_counted_per_response_index(tmp_path: Path) -> None:
    server = start_nereid(_repository(tmp_path), log_dir=tmp_path)
    try:
        got = _stream(server)
        assert isinstance(got[1], Exception) and "negative element -2" in str(got[1])
        _infer_add_sub(server)
        stats = _http_stats(server, "repeat")
        response_stats = stats["response_stats"]
        assert list(response_stats) == ["0", "1", "2", "3"]
        assert all(sorted(entry) == RESPONSE_FIELDS for entry in response_stats.values())
        counts = {key: {name: entry[name]["count"] for name in RESPONSE_FIELDS} for key, entry in response_stats.items()}
        nothing = dict.fromkeys(RESPONSE_FIELDS, 0)
        # Index 0: the first stream's success and the second stream's bare final flag (an empty response).
        assert counts["0"] == {**nothing, "compute_infer": 1, "compute_output": 1, "success": 1, "empty_response": 1}
        assert counts["1"] == {**nothing, "compute_infer": 1, "compute_output": 1, "fail": 1}
        assert counts["2"] == {**nothing, "compute_infer": 1, "compute_output": 1, "success": 1}
        assert counts["3"] == {**nothing, "empty_response": 1}
        first = response_stats["0"]
        assert first["success"]["ns"] >= first["compute_infer"]["ns"] > 0
        assert stats["memory_usage"] == []
        # An ordinary model reports no response statistics, as in Triton.
        assert _http_stats(server, "add_sub")["response_stats"] == {}

        # gRPC: the tritonclient Nereid ships with parses the message (it does not know the field) ...
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.get_inference_statistics("repeat").model_stats[0].inference_count == 2
        # ... and a client whose protobuf has response_stats reads the same numbers as the HTTP JSON.
        python = _newer_client_python()
        grpc_stats = _grpc_stats_by_newer_client(python, server, "repeat")["model_stats"][0]["response_stats"]
        assert {key: {n: int(v[n].get("count", 0)) for n in RESPONSE_FIELDS} for key, v in grpc_stats.items()} == counts
        assert int(grpc_stats["0"]["success"]["ns"]) == first["success"]["ns"]
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.differential
def test_statistics_layout_matches_real_triton(tmp_path: Path) -> None:
    """Field for field: the same keys on HTTP, the same gRPC fields (read by the newer client), the same
    InferResponseStatistics fields per response index, and an empty memory_usage for Python models."""
    repository = _repository(tmp_path)
    python = _newer_client_python()
    seen: dict[str, dict[str, Any]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        server = start(repository) if name == "triton" else start(repository, log_dir=tmp_path)
        try:
            _stream(server)
            _infer_add_sub(server)
            seen[name] = {
                "http": {model: _http_stats(server, model) for model in ("repeat", "add_sub")},
                "grpc": {
                    model: _grpc_stats_by_newer_client(python, server, model)["model_stats"][0]
                    for model in ("repeat", "add_sub")
                },
            }
        finally:
            server.stop()
    triton, nereid = seen["triton"], seen["nereid"]
    for model in ("repeat", "add_sub"):
        assert list(nereid["http"][model]) == list(triton["http"][model])
        assert sorted(nereid["http"][model]["inference_stats"]) == sorted(triton["http"][model]["inference_stats"])
        assert nereid["http"][model]["memory_usage"] == triton["http"][model]["memory_usage"] == []
        assert sorted(nereid["grpc"][model]) == sorted(triton["grpc"][model])
        for key in ("inference_count", "execution_count"):
            assert nereid["http"][model][key] == triton["http"][model][key]
    # Triton 2.51's Python backend reports no response statistics; Nereid's entries have the proto's fields.
    assert triton["http"]["repeat"]["response_stats"] == {}
    assert all(sorted(entry) == RESPONSE_FIELDS for entry in nereid["grpc"]["repeat"]["response_stats"].values())
    assert nereid["http"]["add_sub"]["response_stats"] == triton["http"]["add_sub"]["response_stats"] == {}
