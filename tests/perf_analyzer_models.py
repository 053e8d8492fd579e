"""Python-backend models that perf_analyzer drives in the perf_analyzer test and benchmark: add_sub with and
without dynamic batching, a sequence-batched running sum, and a decoupled model that streams responses. They
load on Nereid and on real Triton alike (Python backend only), so both servers see the same repository."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

__all__ = ["ADD_SUB", "ADD_SUB_BATCHED", "DECOUPLED", "SEQUENCE", "build_perf_analyzer_repository"]

ROOT = Path(__file__).resolve().parent.parent
ADD_SUB = "add_sub"
ADD_SUB_BATCHED = "add_sub_batched"
SEQUENCE = "sequence_sum"
DECOUPLED = "repeat_decoupled"

_SEQUENCE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT = the running sum of INPUT over the sequence; START resets it."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int64)
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            key = request.correlation_id()
            total = value if int(start.reshape(-1)[0]) else self.sums.get(key, 0) + value
            self.sums[key] = total
            output = pb_utils.Tensor("OUTPUT", np.asarray(total, dtype=np.int32).reshape(value.shape))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
'''

_DECOUPLED_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends IN back three times as OUT, then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", data)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    (repo / name / "1" / "model.py").write_text(code.lstrip())


def build_perf_analyzer_repository(repo: Path) -> Path:
    """Writes the four models into `repo` and returns it."""
    repo.mkdir(parents=True, exist_ok=True)
    source = ROOT / "examples" / "model_repository" / "add_sub_python"
    add_sub_code = (source / "1" / "model.py").read_text()
    io = """
        input [
          { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
        ]
        output [
          { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
        ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """
    _model(
        repo, ADD_SUB, f'name: "{ADD_SUB}"\nbackend: "python"\nmax_batch_size: 64\n{textwrap.dedent(io)}', add_sub_code
    )
    batched = (
        f'name: "{ADD_SUB_BATCHED}"\nbackend: "python"\nmax_batch_size: 64\n{textwrap.dedent(io)}'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    _model(repo, ADD_SUB_BATCHED, batched, add_sub_code)
    _model(
        repo,
        SEQUENCE,
        f"""
        name: "{SEQUENCE}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 5000000
          control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
        }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """,
        _SEQUENCE_MODEL,
    )
    _model(
        repo,
        DECOUPLED,
        f"""
        name: "{DECOUPLED}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        model_transaction_policy {{ decoupled: true }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """,
        _DECOUPLED_MODEL,
    )
    shutil.rmtree(repo / "__pycache__", ignore_errors=True)
    return repo
