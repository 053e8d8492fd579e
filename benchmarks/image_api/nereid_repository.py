"""The model repository of the image API benchmark: ResNet-50 on ONNX Runtime with dynamic batching, a Python model
that turns JPEG bytes into its input, and the ensemble of the two that a client sends JPEGs to.

Nereid serves ResNet-50 with its onnxruntime backend. Real Triton's ONNX Runtime backend does not ship on PyPI, so
for Triton the same session runs in a Python-backend model (`python_resnet=True`), as a Triton user without that
backend would write it: one `session.run` over every request of the batch."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from benchmarks import triton_python

MAX_BATCH = 32

_RESNET = """name: "resnet50"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

_PREPROCESS = """name: "preprocess"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

_ENSEMBLE = """name: "resnet50_jpeg"
platform: "ensemble"
max_batch_size: {max_batch}
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "LOGITS" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "preprocess" model_version: -1 input_map {{ key: "IMAGE" value: "IMAGE" }} output_map {{ key: "INPUT" value: "pixels" }} }},
  {{ model_name: "resnet50" model_version: -1 input_map {{ key: "INPUT" value: "pixels" }} output_map {{ key: "LOGITS" value: "LOGITS" }} }}
] }}
"""


def build(root: Path, onnx: Path, delay_us: int = 2000, python_resnet: bool = False, instances: int = 1) -> Path:
    """`instances` > 1: that many ResNet-50 instances, each with an equal share of the cores as ONNX Runtime's
    intra-op threads (Nereid's `intra_op_thread_count`, as Triton's onnxruntime backend names it)."""
    if root.exists():
        shutil.rmtree(root)
    settings = {"max_batch": MAX_BATCH, "delay_us": delay_us}
    resnet = _RESNET.replace('platform: "onnxruntime_onnx"', 'backend: "python"') if python_resnet else _RESNET
    if instances > 1:
        threads = max(1, (os.cpu_count() or 1) // instances)
        resnet = resnet.replace("count: 1 kind: KIND_CPU", f"count: {instances} kind: KIND_CPU")
        resnet += f'parameters {{{{ key: "intra_op_thread_count" value {{{{ string_value: "{threads}" }}}} }}}}\n'
    for name, config in (("resnet50", resnet), ("preprocess", _PREPROCESS), ("resnet50_jpeg", _ENSEMBLE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.format(**settings))
    (root / "resnet50" / "1" / "model.onnx").symlink_to(onnx.resolve())
    if python_resnet:
        shutil.copy(
            Path(__file__).parent.parent / "triton_python" / "onnx_model.py", root / "resnet50" / "1" / "model.py"
        )
    triton_python.place_jpeg_model(root / "preprocess" / "1")
    return root
