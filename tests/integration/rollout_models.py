"""A Python model with several versions for the rollout tests: each version's behaviour is set by config
parameters named after it (`<v>_offset`, `<v>_fail_every`, `<v>_delay_ms`), so a candidate can answer like the
primary, fail, be slow, or answer differently."""

from __future__ import annotations

from pathlib import Path

from tests.integration.onnx_builders import write

__all__ = ["add_version", "versioned_python_model"]

_MODEL_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        version = args["model_version"]
        params = json.loads(args["model_config"]).get("parameters", {})
        value = lambda key, default: params.get(f"v{version}_{key}", {}).get("string_value", default)
        self.offset = float(value("offset", "1"))
        self.fail_every = int(value("fail_every", "0"))
        self.delay = float(value("delay_ms", "0")) / 1000
        self.seen = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.seen += 1
            if self.delay:
                time.sleep(self.delay)
            if self.fail_every and self.seen % self.fail_every == 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("this version failed")))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x + self.offset).astype(np.float32))]))
        return responses
'''


def versioned_python_model(
    repository: Path, name: str, versions: int = 2, extra: str = "", policy: str = "all { }", **parameters: str
) -> Path:
    """`name` with versions 1..`versions` (`policy`: its version_policy, all served by default); Y = X + offset (1
    unless `v<N>_offset` says otherwise)."""
    folder = repository / name
    for version in range(1, versions + 1):
        write(folder / str(version) / "model.py", _MODEL_PY)
    lines = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    write(
        folder / "config.pbtxt",
        f"""name: "{name}"
backend: "python"
max_batch_size: 8
version_policy {{ {policy} }}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{lines}{extra}""",
    )
    return folder


def add_version(folder: Path, version: int) -> None:
    """A new version folder beside the model's others (as a deployment drops one in)."""
    write(folder / str(version) / "model.py", _MODEL_PY)
