"""`model_warmup`: samples run on every instance before a model is READY, from zeros, random data or a file
in the model's warmup/ folder; a failing sample fails the load; warmup does not count as inference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.servers import RunningServer, start_nereid

# Records every execution (request count and the values it saw), and refuses negative inputs.
RECORDING_MODEL = """
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executions.jsonl")
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        seen = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().tolist() for r in requests]
        with open(self.log, "a") as handle:
            handle.write(json.dumps({"instance": self.instance, "ids": [r.request_id() for r in requests], "inputs": seen}) + "\\n")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


def _model(repository: Path, name: str, warmup: str, max_batch_size: int = 8, instances: int = 1) -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(RECORDING_MODEL)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n{warmup}"
    )
    return folder


def _executions(folder: Path) -> list[dict[str, object]]:
    log = folder / "executions.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup_repository")
    zeros = 'model_warmup [ { name: "zeros" batch_size: 2 count: 3 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]\n'
    _model(root, "warm_zeros", zeros, instances=2)
    from_file = 'model_warmup [ { name: "sample" inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "input0.bin" } } } ]\n'
    folder = _model(root, "warm_file", from_file, max_batch_size=0)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "input0.bin").write_bytes(np.array([1.5, 2.5, 3.5], dtype=np.float32).tobytes())
    failing = 'model_warmup [ { name: "negative" inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "bad.bin" } } } ]\n'
    folder = _model(root, "warm_failing", failing)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "bad.bin").write_bytes(np.array([-1, -1, -1], dtype=np.float32).tobytes())
    missing = 'model_warmup [ { name: "nofile" inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "absent.bin" } } } ]\n'
    _model(root, "warm_missing_file", missing)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(repository, "--exit-on-error=false", log_dir=tmp_path_factory.mktemp("logs"), need_ready=False)
    yield running
    assert running.stop() == 0, running.log()


def _index(server: RunningServer) -> dict[str, dict[str, str]]:
    entries = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=10).json()
    return {entry["name"]: entry for entry in entries}


def test_zero_data_sample_runs_count_times_with_batch_size_requests_on_every_instance(
    server: RunningServer, repository: Path
) -> None:
    assert _index(server)["warm_zeros"]["state"] == "READY"
    runs = _executions(repository / "warm_zeros")
    assert len(runs) == 3 * 2  # count 3, on each of the 2 instances
    assert len({run["instance"] for run in runs}) == 2
    for run in runs:
        assert run["inputs"] == [[[0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]]  # batch_size 2: two one-item requests


def test_file_data_comes_from_the_models_warmup_folder(server: RunningServer, repository: Path) -> None:
    assert _index(server)["warm_file"]["state"] == "READY"
    assert [run["inputs"] for run in _executions(repository / "warm_file")] == [[[1.5, 2.5, 3.5]]]


def test_warmup_is_not_counted_as_inference(server: RunningServer) -> None:
    stats = requests.get(f"{server.base}/v2/models/warm_zeros/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0


def test_a_failing_or_unreadable_sample_fails_the_load_and_names_the_sample(server: RunningServer) -> None:
    index = _index(server)
    assert index["warm_failing"]["state"] == "UNAVAILABLE"
    assert "warmup 'negative' failed: negative input" in index["warm_failing"]["reason"]
    assert index["warm_missing_file"]["state"] == "UNAVAILABLE"
    assert "warmup 'nofile'" in index["warm_missing_file"]["reason"] and "absent.bin" in index["warm_missing_file"]["reason"]
