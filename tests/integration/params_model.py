"""`params`: a Python model that answers with the parameters its request carried (OUTPUT0, JSON text) and its
input (OUTPUT1), for tests of what reaches a model's `request.parameters()` (header forwarding and the like)."""

from __future__ import annotations

from pathlib import Path

_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            seen = pb_utils.Tensor("OUTPUT0", np.array([request.parameters().encode()], dtype=object))
            responses.append(pb_utils.InferenceResponse(output_tensors=[seen, pb_utils.Tensor("OUTPUT1", data)]))
        return responses
"""


def write_params_model(repository: Path) -> Path:
    """Add the model to `repository` (created when missing); returns the repository."""
    (repository / "params" / "1").mkdir(parents=True)
    (repository / "params" / "config.pbtxt").write_text(_CONFIG)
    (repository / "params" / "1" / "model.py").write_text(_MODEL)
    return repository
