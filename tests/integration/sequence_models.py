"""Stateful models for the sequence batcher tests, built into a temporary repository: ONNX accumulators with
implicit state (onnx.helper), an ONNX model that echoes the control tensors it was fed and the make-up of
its batch, and a Python model that keeps its sums in instance memory (so a request routed to the wrong
instance fails) and reports the worker process that ran it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.integration.onnx_builders import save_model, write

__all__ = [
    "build_sequence_repository",
    "build_python_sequence_repository",
    "INITIAL_STATE_VALUE",
    "REPORT_IDLE_SECONDS",
]

# What `acc_file` reads from its initial_state data file.
INITIAL_STATE_VALUE = 100


def _write(path: Path, text: str) -> None:
    write(path, textwrap.dedent(text))


def accumulator(path: Path, *, with_start: bool, batching: bool = True) -> None:
    """INPUT, STATE_IN (INT32) -> OUTPUT = STATE_IN + INPUT, or INPUT itself when the int32 START control is
    1 (`with_start`); STATE_OUT = OUTPUT. Shapes [-1, 1] when batching, [1] otherwise."""
    dims: list[int | str] = ["batch", 1] if batching else [1]
    nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["summed"])]
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, dims),
        helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, dims),
    ]
    if with_start:
        inputs.append(helper.make_tensor_value_info("START", TensorProto.INT32, dims))
        nodes += [
            helper.make_node("Cast", ["START"], ["is_start"], to=TensorProto.BOOL),
            helper.make_node("Where", ["is_start", "INPUT", "summed"], ["OUTPUT"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["summed"], ["OUTPUT"]))
    nodes.append(helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]))
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, dims),
        helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, dims),
    ]
    save_model(helper.make_graph(nodes, "accumulator", inputs, outputs), path)


def control_echo(path: Path, corrid_type: int = TensorProto.UINT64) -> None:
    """Echoes INPUT and the START (INT32), END (FP32), READY (BOOL) and CORRID controls it was fed, plus
    BATCH_SIZE (rows in the execution, fillers included) and BATCH_READY (rows with READY true)."""
    dims: list[int | str] = ["batch", 1]
    zero = numpy_helper.from_array(np.array(0, dtype=np.int32), "zero")
    one = numpy_helper.from_array(np.array(1, dtype=np.int32), "one")
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Identity", ["INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["START"], ["START_OUT"]),
        helper.make_node("Identity", ["END"], ["END_OUT"]),
        helper.make_node("Identity", ["READY"], ["READY_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
        helper.make_node("Mul", ["INPUT", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("ReduceSum", ["ones", "axes"], ["rows"], keepdims=1),
        helper.make_node("Add", ["zeros", "rows"], ["BATCH_SIZE"]),
        helper.make_node("Cast", ["READY"], ["ready_int"], to=TensorProto.INT32),
        helper.make_node("ReduceSum", ["ready_int", "axes"], ["ready_rows"], keepdims=1),
        helper.make_node("Add", ["zeros", "ready_rows"], ["BATCH_READY"]),
    ]
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, dims),
        helper.make_tensor_value_info("START", TensorProto.INT32, dims),
        helper.make_tensor_value_info("END", TensorProto.FLOAT, dims),
        helper.make_tensor_value_info("READY", TensorProto.BOOL, dims),
        helper.make_tensor_value_info("CORRID", corrid_type, dims),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, dims),
        helper.make_tensor_value_info("START_OUT", TensorProto.INT32, dims),
        helper.make_tensor_value_info("END_OUT", TensorProto.FLOAT, dims),
        helper.make_tensor_value_info("READY_OUT", TensorProto.BOOL, dims),
        helper.make_tensor_value_info("CORRID_OUT", corrid_type, dims),
        helper.make_tensor_value_info("BATCH_SIZE", TensorProto.INT32, dims),
        helper.make_tensor_value_info("BATCH_READY", TensorProto.INT32, dims),
    ]
    save_model(helper.make_graph(nodes, "control_echo", inputs, outputs, [zero, one, axes]), path)


_STATE = """
state [ {{
  input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
  {initial}
}} ]
"""

_ACCUMULATOR = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  {idle}
  {strategy}
  {controls}
  {state}
}}
"""

_START_CONTROL = (
    'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]'
)

_CONTROLS = """
control_input [
  {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
  {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
  {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
  {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
]
"""

_ECHO = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "END_OUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "READY_OUT" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "CORRID_OUT" data_type: {corrid_type} dims: [ 1 ] }},
  {{ name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH_READY" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  {idle}
  {strategy}
  {controls}
}}
"""

_PY_MODEL = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sums each sequence in this instance's memory: a request that reaches another instance than its
    START did finds no sum and fails."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            key = request.correlation_id()
            if start:
                self.sums[key] = 0
            if key not in self.sums:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"sequence {key} never started on process {os.getpid()}")))
                continue
            self.sums[key] += value
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[self.sums[key]]], dtype=np.int32)),
                pb_utils.Tensor("PID", np.array([[os.getpid()]], dtype=np.int64)),
            ]))
        return responses
'''

_PY_CONFIG = """
name: "route_py"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
"""


def _accumulator_model(
    repo: Path,
    name: str,
    *,
    strategy: str = "direct { }",
    idle: str = "",
    with_start: bool = True,
    initial: str = "",
    max_batch_size: int = 4,
    instances: int = 1,
) -> None:
    accumulator(repo / name / "1" / "model.onnx", with_start=with_start, batching=max_batch_size > 0)
    _write(
        repo / name / "config.pbtxt",
        _ACCUMULATOR.format(
            name=name,
            max_batch_size=max_batch_size,
            instances=instances,
            idle=idle,
            strategy=strategy,
            controls=_START_CONTROL if with_start else "",
            state=_STATE.format(initial=initial),
        ),
    )


def _echo_model(
    repo: Path,
    name: str,
    strategy: str,
    corrid_type: str = "TYPE_UINT64",
    max_batch_size: int = 4,
    idle: str = "max_sequence_idle_microseconds: 30000000",
) -> None:
    onnx_type = TensorProto.STRING if corrid_type == "TYPE_STRING" else TensorProto.UINT64
    control_echo(repo / name / "1" / "model.onnx", onnx_type)
    _write(
        repo / name / "config.pbtxt",
        _ECHO.format(
            name=name,
            max_batch_size=max_batch_size,
            strategy=strategy,
            idle=idle,
            corrid_type=corrid_type,
            controls=_CONTROLS.format(corrid_type=corrid_type),
        ),
    )


def build_sequence_repository(repo: Path) -> Path:
    _accumulator_model(repo, "acc_direct", idle="max_sequence_idle_microseconds: 30000000")
    _accumulator_model(
        repo,
        "acc_oldest",
        strategy="oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 5000 }",
        idle="max_sequence_idle_microseconds: 30000000",
    )
    # One slot (max_batch_size 0, one instance): a second sequence waits in the backlog.
    _accumulator_model(repo, "acc_single", max_batch_size=0, idle="max_sequence_idle_microseconds: 30000000")
    # One slot and a short idle timeout.
    _accumulator_model(repo, "acc_idle", max_batch_size=1, idle="max_sequence_idle_microseconds: 300000")
    _accumulator_model(
        repo,
        "acc_zero",
        with_start=False,
        initial='initial_state { name: "zeros" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }',
    )
    _accumulator_model(
        repo,
        "acc_file",
        with_start=False,
        initial='initial_state { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred.bin" }',
    )
    (repo / "acc_file" / "initial_state").mkdir(parents=True, exist_ok=True)
    (repo / "acc_file" / "initial_state" / "hundred.bin").write_bytes(
        np.array([INITIAL_STATE_VALUE], dtype="<i4").tobytes()
    )
    # Two instances with two slots each.
    _accumulator_model(repo, "acc_two", instances=2, max_batch_size=2)
    _echo_model(repo, "controls", "direct { }")
    # No max_sequence_idle_microseconds: /config shows Triton's default.
    _echo_model(repo, "controls_string", "direct { }", corrid_type="TYPE_STRING", idle="")
    _echo_model(
        repo,
        "controls_wait",
        "direct { max_queue_delay_microseconds: 500000 minimum_slot_utilization: 1.0 }",
        max_batch_size=2,
    )
    _echo_model(
        repo,
        "controls_oldest",
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }",
    )
    _write(repo / "route_py" / "config.pbtxt", _PY_CONFIG)
    _write(repo / "route_py" / "1" / "model.py", _PY_MODEL)
    # Fails to load: a boolean control with three values.
    bad = repo / "bad_control"
    accumulator(bad / "1" / "model.onnx", with_start=True)
    _write(
        bad / "config.pbtxt",
        _ACCUMULATOR.format(
            name="bad_control",
            max_batch_size=4,
            instances=1,
            idle="",
            strategy="",
            controls=_START_CONTROL.replace("[ 0, 1 ]", "[ 0, 1, 2 ]"),
            state=_STATE.format(initial=""),
        ),
    )
    return repo


_REPORT_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Reports what the sequence batcher fed each request: its controls, correlation ID, flags, and how many
    requests (fillers included) shared its execution."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {"batch": len(requests), "corrid": str(request.correlation_id()), "flags": request.flags()}
            for name in ("START", "END", "READY", "CORRID"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                seen[name] = None if tensor is None else tensor.as_numpy().tolist()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", value),
                pb_utils.Tensor("REPORT", np.array([[json.dumps(seen, sort_keys=True).encode()]], dtype=np.object_)),
            ]))
        return responses
'''

_REPORT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""

# The idle timeout of the Python models that real Triton and Nereid are compared on.
REPORT_IDLE_SECONDS = 0.5


def build_python_sequence_repository(repo: Path) -> Path:
    """Python-backend sequence models (the only kind real Triton runs here) that report what they were fed."""
    idle = int(REPORT_IDLE_SECONDS * 1_000_000)
    for name, strategy in (
        ("report_direct", "direct { }"),
        ("report_oldest", "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 1000 }"),
    ):
        _write(repo / name / "config.pbtxt", _REPORT_CONFIG.format(name=name, strategy=strategy, idle=idle))
        _write(repo / name / "1" / "model.py", _REPORT_MODEL)
    return repo
