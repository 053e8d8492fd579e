"""Build the example model repository's ONNX files with onnx.helper (no downloads, deterministic).

    python examples/build_models.py [REPOSITORY]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="nereid-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def add_sub(path: Path, dtype: int = TensorProto.INT32, dims: int = 16) -> None:
    """Like Triton's 'simple': OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    shape = ["batch", dims]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub",
        [helper.make_tensor_value_info("INPUT0", dtype, shape), helper.make_tensor_value_info("INPUT1", dtype, shape)],
        [helper.make_tensor_value_info("OUTPUT0", dtype, shape), helper.make_tensor_value_info("OUTPUT1", dtype, shape)],
    )
    _save(graph, path)


def identity(path: Path, dtype: int, name: str) -> None:
    shape = ["batch", "n"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INPUT0", dtype, shape)],
        [helper.make_tensor_value_info("OUTPUT0", dtype, shape)],
    )
    _save(graph, path)


def mlp(path: Path, sizes: tuple[int, ...] = (16, 32, 4), seed: int = 0) -> None:
    """A small dense network with a dynamic batch dimension: Gemm + Relu layers, then Softmax."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "input"
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        w = numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array(np.zeros(n_out, dtype=np.float32), f"b{i}")
        inits += [w, b]
        out = f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [out]))
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            out = f"r{i}"
        current = out
    nodes.append(helper.make_node("Softmax", [current], ["probabilities"], axis=1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=inits,
    )
    _save(graph, path)


def cast(path: Path, source: int, target: int, name: str, dims: int = 16) -> None:
    """OUT = INPUT rounded and cast (FP32 -> INT32), or just cast (INT32 -> FP32): the ensemble example's
    preprocess and postprocess steps around 'simple'."""
    shape = ["batch", dims]
    nodes = [helper.make_node("Cast", ["IN" if source != TensorProto.FLOAT else "rounded"], ["OUT"], to=target)]
    if source == TensorProto.FLOAT:
        nodes.insert(0, helper.make_node("Round", ["IN"], ["rounded"]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("IN", source, shape)],
        [helper.make_tensor_value_info("OUT", target, shape)],
    )
    _save(graph, path)


def build(repository: Path) -> None:
    add_sub(repository / "simple" / "1" / "model.onnx")
    identity(repository / "simple_string" / "1" / "model.onnx", TensorProto.STRING, "string_identity")
    identity(repository / "identity_fp32" / "1" / "model.onnx", TensorProto.FLOAT, "identity_fp32")
    mlp(repository / "mlp_autocomplete" / "1" / "model.onnx")
    cast(repository / "ensemble_preprocess" / "1" / "model.onnx", TensorProto.FLOAT, TensorProto.INT32, "fp32_to_int32")
    cast(repository / "ensemble_postprocess" / "1" / "model.onnx", TensorProto.INT32, TensorProto.FLOAT, "int32_to_fp32")
    (repository / "simple_ensemble" / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version folder is empty


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "model_repository"
    build(target)
    print(f"built example models in {target}")
