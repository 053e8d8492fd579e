"""Models the orchestration tests build into temporary repositories: a Python model whose load time, memory and
failure are set by config parameters (and whose requests sleep for as long as they ask, to hold a model busy),
and small ONNX adders."""

from __future__ import annotations

import re
from pathlib import Path

import requests

from tests.integration.onnx_builders import add_constant, write

__all__ = ["python_model", "onnx_adder", "metric_value", "sum_samples", "index_rows"]

_MODEL_PY = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # A request that sleeps marks its start in the model's folder, so a test knows it is executing.
        self.marker = os.path.join(args["model_repository"], "executing")
        params = json.loads(args["model_config"]).get("parameters", {})
        value = lambda key, default: params.get(key, {}).get("string_value", default)
        mib = int(value("alloc_mib", "0"))
        # Touched pages, so the worker really holds them (USS grows by about this much).
        self.ballast = np.ones(mib << 18, dtype=np.float32) if mib else None
        self.grow = int(value("grow_mib", "0"))  # each request keeps this much more memory
        self.kept = []
        self.out = int(value("out_mib", "0")) << 18  # OUT's length: its bytes grow the worker's output arena
        started = time.time()
        time.sleep(float(value("init_secs", "0")))
        if value("load_log", "false") == "true":  # when this load ran, for tests of how loads overlap
            with open(os.path.join(args["model_repository"], "loads"), "a") as log:
                log.write(f"{started} {time.time()}\\n")
        if value("fail", "false") == "true":
            raise RuntimeError("this model refuses to load")

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            if self.grow:
                self.kept.append(np.ones(self.grow << 18, dtype=np.float32))
            if seconds[0] > 0:
                with open(self.marker, "w") as marker:
                    marker.write("1")
                time.sleep(float(seconds[0]))
            out = np.full(self.out, seconds[0] * 2, dtype=np.float32) if self.out else seconds * 2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''


def python_model(repository: Path, name: str, **parameters: str) -> Path:
    """SECONDS FP32 [1] -> OUT = 2 * SECONDS, after sleeping SECONDS (and writing <folder>/executing first).
    Parameters: alloc_mib, grow_mib (per request), out_mib (OUT's size; OUT[0] is still 2 * SECONDS), init_secs,
    load_log (each load appends its start and end times to <folder>/loads), fail,
    and the residency keys (nereid.pin, nereid.group, nereid.memory_footprint)."""
    folder = repository / name
    write(folder / "1" / "model.py", _MODEL_PY)
    params = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    write(
        folder / "config.pbtxt",
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "SECONDS" data_type: TYPE_FP32 dims: [1] }]\n'
        f'output [{{ name: "OUT" data_type: TYPE_FP32 dims: [{-1 if "out_mib" in parameters else 1}] }}]\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\n" + params,
    )
    return folder


def onnx_adder(repository: Path, name: str, constant: float, extra_config: str = "") -> Path:
    """INPUT0 FP32 [batch, 4] -> OUTPUT0 = INPUT0 + constant."""
    folder = repository / name
    add_constant(folder / "1" / "model.onnx", constant)
    write(folder / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 8\n' + extra_config)
    return folder


def metric_value(metrics_port: int, name: str, **labels: str) -> float:
    """One sample of the metrics endpoint (0 when absent)."""
    return sum_samples(requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text, name, labels)


def sum_samples(text: str, name: str, labels: dict[str, str]) -> float:
    """The sum of a Prometheus text's samples of `name` whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def index_rows(base_url: str) -> dict[str, dict[str, object]]:
    """The HTTP repository index by model name (the last row of each)."""
    rows = requests.post(base_url + "/v2/repository/index", timeout=10).json()
    return {row["name"]: row for row in rows}
