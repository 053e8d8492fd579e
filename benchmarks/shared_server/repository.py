"""The shared server's model repository: each model with dynamic batching and one instance, so the three execute
concurrently beside each other, as a Triton user would configure them. For real Triton (`triton=True`) every model
is a Python-backend model: its FIL and ONNX Runtime backends do not ship on PyPI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from benchmarks.image_api.nereid_repository import MAX_BATCH as IMAGE_MAX_BATCH
from benchmarks.shared_server.models import CANDIDATES, DENSE_FEATURES, FRAUD_FEATURES, TABLE_ROWS, recommender_request

CONFIGS = {
    "fraud": f"""name: "fraud"
backend: "fil"
max_batch_size: 1024
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FRAUD_FEATURES} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "model_type" value {{ string_value: "xgboost_json" }} }}
parameters {{ key: "output_class" value {{ string_value: "true" }} }}
parameters {{ key: "predict_proba" value {{ string_value: "true" }} }}
""",
    "recommender": f"""name: "recommender"
platform: "onnxruntime_onnx"
max_batch_size: {CANDIDATES * 32}
input [ {{ name: "DENSE" data_type: TYPE_FP32 dims: [ {DENSE_FEATURES} ] }}, {{ name: "SPARSE" data_type: TYPE_INT64 dims: [ {len(TABLE_ROWS)} ] }} ]
output [ {{ name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
""",
    "resnet50": f"""name: "resnet50"
platform: "onnxruntime_onnx"
max_batch_size: {IMAGE_MAX_BATCH}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
""",
}
FILES = {"fraud": "xgboost.json", "recommender": "model.onnx", "resnet50": "model.onnx"}


PYTHON_MODELS = {"fraud": "xgboost_model.py", "recommender": "onnx_model.py", "resnet50": "onnx_model.py"}


def _as_python_model(config: str) -> str:
    lines = [line for line in config.splitlines() if not line.startswith("parameters")]  # the FIL backend's own
    return (
        "\n".join(
            line.replace('backend: "fil"', 'backend: "python"').replace(
                'platform: "onnxruntime_onnx"', 'backend: "python"'
            )
            for line in lines
        )
        + "\n"
    )


def build(root: Path, artifacts: dict[str, Path], triton: bool = False, resnet_instances: int = 1) -> Path:
    """`resnet_instances` > 1: that many ResNet-50 instances, the cores shared out as their intra-op threads."""
    if root.exists():
        shutil.rmtree(root)
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        if name == "resnet50" and resnet_instances > 1:
            threads = max(1, (os.cpu_count() or 1) // resnet_instances)
            config = config.replace("count: 1 kind: KIND_CPU", f"count: {resnet_instances} kind: KIND_CPU")
            config += f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{threads}" }} }}\n'
        (root / name / "config.pbtxt").write_text(_as_python_model(config) if triton else config)
        (root / name / "1" / FILES[name]).symlink_to(artifacts[name].resolve())
        if triton:
            shutil.copy(
                Path(__file__).parent.parent / "triton_python" / PYTHON_MODELS[name], root / name / "1" / "model.py"
            )
    return root


def recommender_input_data(path: Path, rows: int = 1024) -> Path:
    """perf_analyzer's --input-data for the recommender: valid embedding ids (its random data would index past
    the tables), one entry per candidate row; `-b CANDIDATES` puts that many rows in each request."""
    dense, sparse = recommender_request(np.random.default_rng(0), rows)
    entries = [{"DENSE": dense[i].tolist(), "SPARSE": sparse[i].tolist()} for i in range(rows)]
    path.write_text(json.dumps({"data": entries}))
    return path
