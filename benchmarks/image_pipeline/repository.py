"""The pipeline's model repository: `decode` (Python: JPEG to pixels), `detector` (DETR on ONNX Runtime),
`labels` (Python: outputs to labelled boxes), and `detect`, the ensemble a client sends a JPEG to. For real Triton
(`python_detector=True`) the detector's session runs in a Python-backend model: its ONNX Runtime backend is not on
PyPI."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks import triton_python
from benchmarks.image_pipeline.detector import CLASSES, QUERIES, SIZE
from benchmarks.image_pipeline.labels import TOP

MAX_BATCH = 8

CONFIGS = {
    "decode": f"""backend: "python"
max_batch_size: {MAX_BATCH}
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, {SIZE}, {SIZE} ] }} ]
dynamic_batching {{ }}
""",
    "detector": f"""platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, {SIZE}, {SIZE} ] }} ]
output [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ {QUERIES}, {CLASSES} ] }}, {{ name: "BOXES" data_type: TYPE_FP32 dims: [ {QUERIES}, 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
""",
    "labels": f"""backend: "python"
max_batch_size: {MAX_BATCH}
input [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ {QUERIES}, {CLASSES} ] }}, {{ name: "BOXES" data_type: TYPE_FP32 dims: [ {QUERIES}, 4 ] }} ]
output [ {{ name: "DETECTIONS" data_type: TYPE_STRING dims: [ {TOP} ] }} ]
dynamic_batching {{ }}
""",
    "detect": f"""platform: "ensemble"
max_batch_size: {MAX_BATCH}
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "DETECTIONS" data_type: TYPE_STRING dims: [ {TOP} ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "decode" model_version: -1 input_map {{ key: "IMAGE" value: "IMAGE" }} output_map {{ key: "PIXELS" value: "pixels" }} }},
  {{ model_name: "detector" model_version: -1 input_map {{ key: "PIXELS" value: "pixels" }} output_map [ {{ key: "LOGITS" value: "logits" }}, {{ key: "BOXES" value: "boxes" }} ] }},
  {{ model_name: "labels" model_version: -1 input_map [ {{ key: "LOGITS" value: "logits" }}, {{ key: "BOXES" value: "boxes" }} ] output_map {{ key: "DETECTIONS" value: "DETECTIONS" }} }}
] }}
""",
}

_LABELS_PY = '''"""The detector's outputs to labelled boxes (labels.py beside this file does the work), one call per batch."""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labels import detections  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        logits = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        boxes = [pb_utils.get_input_tensor_by_name(r, "BOXES").as_numpy() for r in requests]
        found = detections(np.concatenate(logits), np.concatenate(boxes))
        responses, offset = [], 0
        for part in logits:
            rows = found[offset : offset + len(part)]
            offset += len(part)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DETECTIONS", rows)]))
        return responses
'''


def build(root: Path, onnx: Path, python_detector: bool = False) -> Path:
    if root.exists():
        shutil.rmtree(root)
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        if python_detector and name == "detector":
            config = config.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
    (root / "detector" / "1" / "model.onnx").symlink_to(onnx.resolve())
    here = Path(__file__).parent
    if python_detector:
        shutil.copy(here.parent / "triton_python" / "onnx_model.py", root / "detector" / "1" / "model.py")
    triton_python.place_jpeg_model(root / "decode" / "1")
    (root / "labels" / "1" / "model.py").write_text(_LABELS_PY)
    shutil.copy(here / "labels.py", root / "labels" / "1" / "labels.py")
    return root
