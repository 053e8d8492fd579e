"""qa/L0_sequence_batcher with the onnx and python backends: its model repositories and its server starts, as test.sh
lays them out (BACKENDS="onnx python", ENSEMBLES=1, no implicit state, no shared memory).

The sequence models come from qa/common's `gen_qa_sequence_models.py --onnx` (fixed and `--variable` shapes); the
python models are the onnx models' configs with `backend: "python"` and qa/python_models/sequence_int32, as test.sh
makes them; the ensembles from the same generator's `--ensemble`. The ensembles' `nop_*` steps use Triton's C++
identity backend: a Python model with its behaviour stands in (models/identity.py). Not built: the C++ `custom`
sequence backend, so its ragged-batch test and the request-timeout test (custom_sequence_int32_timeout) are not run.
"""

from __future__ import annotations

import re
import shutil
from functools import partial
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit, generated

__all__ = ["UNITS"]

_IDENTITY = Path(__file__).parent / "models" / "identity.py"
_DTYPES = ("int32", "bool")  # test.sh's get_datatype for onnx and python without implicit state
_TRIALS = ("0", "1", "2", "4", "v")  # test.sh's MODEL_TRIALS
_NO_DELAY_TESTS = ("test_simple_sequence test_length1_sequence test_batch_size test_no_sequence_start test_no_sequence_start2 "
                   "test_no_sequence_end test_no_correlation_id").split()  # fmt: skip
_DELAY_TESTS = ("test_backlog_fill test_backlog_fill_no_end test_backlog_same_correlation_id test_backlog_same_correlation_id_no_end "
                "test_backlog_sequence_timeout test_half_batch test_skip_batch test_full_batch test_ragged_batch test_backlog").split()  # fmt: skip
_QUEUE_DELAY_TESTS = ("test_queue_delay_no_min_util", "test_queue_delay_half_min_util", "test_queue_delay_full_min_util")


def _edit(config: Path, *edits: tuple[str, str]) -> None:
    """test.sh's `sed -i "s/A/B/"`: the first match on each line."""
    lines = config.read_text().splitlines(keepends=True)
    for pattern, replacement in edits:
        lines = [re.sub(pattern, replacement, line, count=1) for line in lines]
    config.write_text("".join(lines))


def _instances(count: int, max_batch_size: int | None) -> list[tuple[str, str]]:
    edits = [(r"kind: KIND_GPU", f"kind: KIND_GPU\ncount: {count}"), (r"kind: KIND_CPU", f"kind: KIND_CPU\ncount: {count}")]
    return ([(r"^max_batch_size:.*", f"max_batch_size: {max_batch_size}")] if max_batch_size is not None else []) + edits


def _add(qa: Path, model: Path, target: Path, *edits: tuple[str, str]) -> Path:
    """Copy one model into a repository as test.sh does; a "python" path is made from its onnx twin (generate_python_models)."""
    destination = target / model.name
    if "python" in model.name:
        onnx = model.parent / model.name.replace("python", "onnx")
        (destination / "1").mkdir(parents=True)
        text = onnx.joinpath("config.pbtxt").read_text()
        if not model.name.startswith(("simple_", "sequence_", "fan_")):  # an ensemble keeps `platform: "ensemble"`
            text = re.sub(r"platform:.*", 'backend: "python"', text)
            shutil.copy(qa / "python_models" / "sequence_int32" / "model.py", destination / "1" / "model.py")
        (destination / "config.pbtxt").write_text(text.replace("onnx", "python"))
    else:
        shutil.copytree(model, destination)
    # Triton's CI has a GPU; here the generated KIND_GPU instances run on the CPU (a CPU-only tritonserver refuses them too).
    _edit(destination / "config.pbtxt", ("kind: KIND_GPU", "kind: KIND_CPU"), *edits)
    return destination


def _models(backends: tuple[str, ...], fixed: Path, ensembles: Path, fixed_ensembles: Path, nobatch: bool) -> list[Path]:
    """test.sh's MODELS for BACKENDS="onnx python" (the ensembles of the python models from the fixed-shape repository)."""
    batch = "nobatch_" if nobatch else ""
    models = []
    for backend in backends:
        models += [fixed / f"{backend}_{batch}sequence_{dtype}" for dtype in _DTYPES]
        source = ensembles if backend == "onnx" else fixed_ensembles
        models += [source / f"{prefix}_{backend}_{batch}sequence_int32" for prefix in ("fan", "sequence", "simple")]
    return models


def _build(backends: tuple[str, ...], unit: Path, qa: Path) -> None:
    built = unit / f".built-{'-'.join(backends)}"
    if built.exists():  # one layout serves every server start
        return
    fixed = generated(qa, unit, "gen_qa_sequence_models.py", "--onnx")
    variable = generated(qa, unit, "gen_qa_sequence_models.py", "--onnx", "--variable")
    fixed_ensembles = generated(qa, unit, "gen_qa_sequence_models.py", "--ensemble")
    variable_ensembles = generated(qa, unit, "gen_qa_sequence_models.py", "--ensemble", "--variable")
    for name in ("models0", "models1", "models2", "models4", "modelsv", "queue_delay_models", "preserve_ordering_models"):
        shutil.rmtree(unit / name, ignore_errors=True)
        (unit / name).mkdir()
    for model in _models(backends, fixed, fixed_ensembles, fixed_ensembles, nobatch=False):
        _add(qa, model, unit / "models1", *_instances(1, 4))
        _add(qa, model, unit / "models2", *_instances(2, 2))
        _add(qa, model, unit / "models4", *_instances(4, 1))
        queued = _add(qa, model, unit / "queue_delay_models", *_instances(1, 4),
                      ("sequence_batching {", "sequence_batching {\ndirect {\nmax_queue_delay_microseconds: 3000000\nminimum_slot_utilization: 0\n}"))  # fmt: skip
        for suffix, utilization in (("half", "0.5"), ("full", "1")):
            twin = queued.with_name(f"{queued.name}_{suffix}")
            shutil.copytree(queued, twin)
            _edit(twin / "config.pbtxt", (re.escape(queued.name), f"{queued.name}_{suffix}"), ("minimum_slot_utilization: 0", f"minimum_slot_utilization: {utilization}"))
    for model in _models(backends, fixed, fixed_ensembles, fixed_ensembles, nobatch=True):
        _add(qa, model, unit / "models0", *_instances(4, None))
    for model in _models(backends, variable, variable_ensembles, fixed_ensembles, nobatch=False):
        _add(qa, model, unit / "modelsv", *_instances(1, 4))
    for trial in _TRIALS:
        for nop in fixed_ensembles.glob("nop_*"):
            target = unit / f"models{trial}" / nop.name
            shutil.copytree(nop, target)
            (target / "1").mkdir()
            shutil.copy(_IDENTITY, target / "1" / "model.py")  # Triton's C++ identity backend, as a Python model
            _edit(target / "config.pbtxt", ('backend: "identity"', 'backend: "python"'))
    for folder in ("simple_*", "fan_*", "sequence_*"):  # test.sh removes the ensembles from the queue-delay repository
        for model in (unit / "queue_delay_models").glob(folder):
            shutil.rmtree(model)
    for mode in ("decoupled", "nondecoupled"):
        for preserve in ("no_preserve", "preserve"):
            target = unit / "preserve_ordering_models" / f"seqpy_{preserve}_ordering_{mode}"
            (target / "1").mkdir(parents=True)
            shutil.copy(qa / "python_models" / "sequence_py" / "model.py", target / "1" / "model.py")
            text = (qa / "python_models" / "sequence_py" / "config.pbtxt").read_text()
            if preserve == "preserve":
                text = re.sub(r"(?m)^preserve_ordering: False", "preserve_ordering: True", text)
            if mode == "decoupled":
                text += "\nmodel_transaction_policy { decoupled: true }\n"
            (target / "config.pbtxt").write_text(text)
    built.touch()


def _delays(test: str) -> dict[str, str]:
    """test.sh's TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER for each delay test."""
    backlog = {"test_backlog_fill_no_end": 3, "test_backlog_fill": 2, "test_backlog_same_correlation_id": 2}.get(test, 0)
    delay = {"test_backlog_fill_no_end": 10, "test_backlog_fill": 10, "test_backlog_same_correlation_id_no_end": 16, "test_half_batch": 8,
             "test_backlog_sequence_timeout": 4}.get(test, 12)  # fmt: skip
    return {"TRITONSERVER_DELAY_SCHEDULER": str(delay), "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": str(backlog)}


def _runs(backends: tuple[str, ...]) -> list[Run]:
    base = {"BACKENDS": " ".join(backends), "ENSEMBLES": "1", "IMPLICIT_STATE": "0", "INITIAL_STATE_FILE": "0"}
    runs = []
    for trial in _TRIALS:
        env = {**base, "NO_BATCHING": "1" if trial == "0" else "0", "MODEL_INSTANCES": {"0": "4", "v": "1"}.get(trial, trial),
               "BATCHER_TYPE": "VARIABLE" if trial == "v" else "FIXED"}  # fmt: skip
        for test in _NO_DELAY_TESTS + _DELAY_TESTS:
            delays = _delays(test) if test in _DELAY_TESTS else {}
            runs.append(Run(f"{test} models{trial}", [f"--model-repository={{unit}}/models{trial}", "--log-verbose=1"],
                            [f"sequence_batcher_test.py SequenceBatcherTest.{test}"], f"{test}.models{trial}.server.log",
                            env={**env, **delays}))  # fmt: skip
    # The queue-delay tests inherit the last trial's MODEL_INSTANCES and BATCHER_TYPE, as in test.sh.
    queued = {**base, "NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "VARIABLE",
              "TRITONSERVER_DELAY_SCHEDULER": "2", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "0"}  # fmt: skip
    runs += [Run(f"{test} queue_delay_models", ["--model-repository={unit}/queue_delay_models", "--log-verbose=1"],
                 [f"sequence_batcher_test.py SequenceBatcherTest.{test}"], f"{test}.queue_delay_models.server.log", env=queued)
             for test in _QUEUE_DELAY_TESTS]  # fmt: skip
    ordering = {**base, "NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "FIXED"}
    runs.append(Run("SequenceBatcherPreserveOrderingTest", ["--model-repository={unit}/preserve_ordering_models", "--log-verbose=1"],
                    ["sequence_batcher_test.py SequenceBatcherPreserveOrderingTest"],
                    "SequenceBatcherPreserveOrderingTest.preserve_ordering_models.server.log", env=ordering))  # fmt: skip
    return runs


_NOTE = ("the C++ custom sequence backend's models (test_ragged_batch_allowed, SequenceBatcherRequestTimeoutTest), the "
         "TensorRT and libtorch models, shared memory and implicit state are not run; the ensembles' nop steps are a "
         "Python model with the C++ identity backend's behaviour (benchmarks/triton_qa/models/identity.py)")
_BOTH, _PYTHON = ("onnx", "python"), ("python",)

UNITS = {
    "L0_sequence_batcher": Unit("L0_sequence_batcher", partial(_build, _BOTH), _runs(_BOTH), python_models_only=False, note=_NOTE),
    # BACKENDS="python" alone: every model a Python model, so the reference Triton (Python backend only) runs it too.
    "L0_sequence_batcher/python": Unit("L0_sequence_batcher", partial(_build, _PYTHON), _runs(_PYTHON), note=_NOTE),
}
