"""A Python model with several versions for the rollout tests: each version's behaviour is set by config
parameters named after it (`<v>_offset`, `<v>_fail_every`, `<v>_delay_ms`, `<v>_burn_ms` of CPU), so a candidate
can answer like the primary, fail, be slow, cost more, or answer differently."""

from __future__ import annotations

from pathlib import Path

from tests.integration.onnx_builders import write

__all__ = ["add_version", "callers_of_m", "versioned_decoupled_model", "versioned_python_model"]

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
        self.burn = float(value("burn_ms", "0")) / 1000
        self.seen = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.seen += 1
            if self.delay:
                time.sleep(self.delay)
            if self.burn:
                until = time.thread_time() + self.burn
                while time.thread_time() < until:
                    pass
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


_DECOUPLED_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        version = args["model_version"]
        params = json.loads(args["model_config"]).get("parameters", {})
        self.offset = float(params.get(f"v{version}_offset", {}).get("string_value", "1"))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x + self.offset).astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_BLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            called = pb_utils.InferenceRequest(model_name="m", requested_output_names=["Y"], inputs=[x]).exec()
            if called.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(called.error().message())))
                continue
            y = pb_utils.get_output_tensor_by_name(called, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return responses
'''

_IO = """input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def versioned_decoupled_model(repository: Path, name: str, **parameters: str) -> Path:
    """A decoupled `name` with versions 1 and 2: each request streams three responses Y = X + offset."""
    folder = repository / name
    for version in (1, 2):
        write(folder / str(version) / "model.py", _DECOUPLED_PY)
    lines = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    write(folder / "config.pbtxt", f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\nversion_policy {{ all {{ }} }}\n'
          f'model_transaction_policy {{ decoupled: true }}\n{_IO}instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{lines}')  # fmt: skip
    return folder


def callers_of_m(repository: Path) -> None:
    """Two models that call `m` naming no version: `bls_m` (a Python model's BLS call) and `ensemble_m` (an
    ensemble's single step, model_version -1)."""
    write(repository / "bls_m" / "1" / "model.py", _BLS_PY)
    write(repository / "bls_m" / "config.pbtxt", f'name: "bls_m"\nbackend: "python"\nmax_batch_size: 8\n{_IO}'
          'instance_group [ { kind: KIND_CPU count: 1 } ]\n')  # fmt: skip
    (repository / "ensemble_m" / "1").mkdir(parents=True, exist_ok=True)
    write(repository / "ensemble_m" / "config.pbtxt", f'name: "ensemble_m"\nplatform: "ensemble"\nmax_batch_size: 8\n{_IO}'
          'ensemble_scheduling { step [ { model_name: "m" model_version: -1 input_map { key: "X" value: "X" } '
          'output_map { key: "Y" value: "Y" } } ] }\n')  # fmt: skip
