"""Small ONNX models the integration tests build into temporary repositories (onnx.helper, no downloads).

`busy_loop` does a controllable amount of real work, so tests can prove drains and overlap by timing
CPU work instead of sleeping; `busy_iterations` sizes that work and `pending_requests` tells when a request
is queued behind one that is executing.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import requests
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "save_model",
    "cpu_seconds",
    "busy_loop",
    "busy_body",
    "busy_iterations",
    "pending_requests",
    "add_constant",
    "reshaped",
    "scalar_io",
    "write",
    "BUSY_WIDTH",
]

_OPSET = [helper.make_opsetid("", 17)]
BUSY_WIDTH = 128


def save_model(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=_OPSET, producer_name="nereid-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write(path: Path, text: str) -> Path:
    """Write a text file (a config.pbtxt), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def busy_loop(path: Path) -> None:
    """ITERS INT64 [1] -> STATE FP32 [1, BUSY_WIDTH] after ITERS rounds of tanh(state @ W), and ITERS_OUT.

    No batch dimension (max_batch_size 0). The work grows linearly with ITERS, on one thread when the
    session has intra_op_thread_count 1.
    """
    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array((rng.standard_normal((BUSY_WIDTH, BUSY_WIDTH)) / BUSY_WIDTH).astype(np.float32), "W")
    state0 = numpy_helper.from_array(np.full((1, BUSY_WIDTH), 0.5, dtype=np.float32), "state0")
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["s_in", "W"], ["product"]),
            helper.make_node("Tanh", ["product"], ["s_out"]),
        ],
        "busy_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [1, BUSY_WIDTH]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, BUSY_WIDTH]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["ITERS", "axes0"], ["trip_count"]),
            helper.make_node("Loop", ["trip_count", "", "state0"], ["STATE"], body=body),
            helper.make_node("Identity", ["ITERS"], ["ITERS_OUT"]),
        ],
        "busy_loop",
        [helper.make_tensor_value_info("ITERS", TensorProto.INT64, [1])],
        [
            helper.make_tensor_value_info("STATE", TensorProto.FLOAT, [1, BUSY_WIDTH]),
            helper.make_tensor_value_info("ITERS_OUT", TensorProto.INT64, [1]),
        ],
        initializer=[weight, state0, axes],
    )
    save_model(graph, path)


def add_constant(path: Path, constant: float, width: int = 4, batch: bool = True) -> None:
    """OUTPUT0 = INPUT0 + constant, FP32 [batch, width] (or [width] without a batch dimension)."""
    shape: list[int | str] = ["batch", width] if batch else [width]
    c = numpy_helper.from_array(np.array(constant, dtype=np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "c"], ["OUTPUT0"])],
        "add_constant",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        initializer=[c],
    )
    save_model(graph, path)


def reshaped(path: Path) -> None:
    """INPUT0 FP32 [batch, 2, 3] -> OUTPUT0 = INPUT0 * 2, same shape (configs may present it as [6])."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    shape: list[int | str] = ["batch", 2, 3]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])],
        "reshaped",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        initializer=[two],
    )
    save_model(graph, path)


def scalar_io(path: Path) -> None:
    """INPUT0 INT64 [batch] -> OUTPUT0 = INPUT0 + 1: one scalar per batch item."""
    one = numpy_helper.from_array(np.array(1, dtype=np.int64), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "one"], ["OUTPUT0"])],
        "scalar_io",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT64, ["batch"])],
        initializer=[one],
    )
    save_model(graph, path)


def busy_body(iterations: int) -> dict[str, object]:
    """The JSON inference request body for the busy_loop model."""
    return {"inputs": [{"name": "ITERS", "datatype": "INT64", "shape": [1], "data": [iterations]}]}


def busy_iterations(base_url: str, model: str, seconds: float) -> int:
    """How many ITERS make one request of the busy_loop model take about `seconds` on this machine."""
    probe = 20_000
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        reply = requests.post(f"{base_url}/v2/models/{model}/infer", json=busy_body(probe), timeout=60)
        reply.raise_for_status()
        best = min(best, time.perf_counter() - start)
    return max(probe, int(probe * seconds / best))


def pending_requests(metrics_port: int, model: str) -> int:
    """nv_inference_pending_request_count of a model (all versions), read from the metrics endpoint."""
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    pattern = re.compile(r'^nv_inference_pending_request_count\{[^}]*model="' + re.escape(model) + r'"[^}]*\} (\S+)$', re.M)
    return int(sum(float(v) for v in pattern.findall(text)))


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far; it grows while a model computes (a sign a request is executing)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)
