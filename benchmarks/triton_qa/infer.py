"""qa/L0_infer with the onnx and python backends on a CPU (test.sh's TARGET=cpu with TRITON_SERVER_CPU_ONLY=1):
its model repository and its one server start, as test.sh lays them out.

The onnx models and ensembles come from qa/common's `gen_qa_models.py --onnx` and `--ensemble`; the python models
are the onnx models' configs with `backend: "python"` and qa/python_models' add_sub or sub_add, as test.sh makes them.
Triton's C++ identity backend (the ensembles' `nop_*` steps and `custom_zero_1_float32`) is a Python model with its
behaviour (models/identity.py). Only the `nop_*` models an ensemble calls are copied (test.sh copies all 54, most of
them never called; each would be a Python worker process here).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit, generated

__all__ = ["UNITS"]

_IDENTITY = Path(__file__).parent / "models" / "identity.py"
_SWAP_TYPES = ("float32", "int32", "int16", "int8")  # test.sh: these python models subtract where onnx adds
_ENSEMBLE_MODELS = ("wrong_label_int32_float32_float32 label_override_int32_float32_float32 mix_type_int32_float32_float32 "
                    "batch_to_nobatch_float32_float32_float32 batch_to_nobatch_nobatch_float32_float32_float32 "
                    "nobatch_to_batch_float32_float32_float32 nobatch_to_batch_nobatch_float32_float32_float32 "
                    "mix_nobatch_batch_float32_float32_float32").split()  # fmt: skip


def _python_twin(qa: Path, onnx: Path, models: Path) -> None:
    """test.sh's python model made from an onnx model: its config without the platform, `backend: "python"` where the
    version policy was, and add_sub's or sub_add's model.py."""
    name = onnx.name.replace("onnx", "python")
    target = models / name
    (target / "1").mkdir(parents=True)
    text = onnx.joinpath("config.pbtxt").read_text()
    text = re.sub(r"platform:.*", "", text)
    text = re.sub(r"version_policy.*", 'backend: "python"', text)
    (target / "config.pbtxt").write_text(text.replace("onnx", "python"))
    shutil.copy(onnx / "output0_labels.txt", target)
    swapped = any(name in (f"python_{t}_{t}_{t}", f"python_nobatch_{t}_{t}_{t}") for t in _SWAP_TYPES)
    shutil.copy(qa / "python_models" / ("sub_add" if swapped else "add_sub") / "model.py", target / "1" / "model.py")


def _identity_model(source: Path, target: Path) -> Path:
    """A model of Triton's C++ identity backend, as a Python model with the same behaviour."""
    shutil.copytree(source, target)
    (target / "1").mkdir(exist_ok=True)
    shutil.copy(_IDENTITY, target / "1" / "model.py")
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "identity"', 'backend: "python"'))
    return target


def _build(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir()
    onnx_models = generated(qa, unit, "gen_qa_models.py", "--onnx")
    ensembles = generated(qa, unit, "gen_qa_models.py", "--ensemble")
    for model in sorted(onnx_models.glob("onnx_*")):
        if "bf16" in model.name:  # test.sh: no BF16 models on a CPU (ORT's CPU provider has no BF16 kernels)
            continue
        shutil.copytree(model, models / model.name)
        _python_twin(qa, model, models)
    for model in sorted(ensembles.glob("*onnx*")):
        shutil.copytree(model, models / model.name)
    for name in _ENSEMBLE_MODELS:
        shutil.copytree(qa / "ensemble_models" / name, models / name)
        (models / name / "1").mkdir(exist_ok=True)
    called = {m for config in models.glob("*/config.pbtxt") for m in re.findall(r'model_name: "(nop_[^"]*)"', config.read_text())}
    for name in sorted(called):
        _identity_model(ensembles / name, models / name)
    for config in [*models.glob("onnx*/config.pbtxt"), *models.glob("python*/config.pbtxt")]:
        with config.open("a") as file:  # test.sh's TARGET=cpu
            file.write("instance_group [ { kind: KIND_CPU }]\n")
    zero = _identity_model(qa / "custom_models" / "custom_zero_1_float32", models / "custom_zero_1_float32")
    with (zero / "config.pbtxt").open("a") as file:
        file.write("instance_group [ { kind: KIND_CPU }]\n")
    nobatch = models / "custom_nobatch_zero_1_float32"
    shutil.copytree(zero, nobatch)
    config = zero / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 1", "max_batch_size: 8").replace("dims: [ 1 ]", "dims: [ -1 ]"))
    config = nobatch / "config.pbtxt"
    text = config.read_text().replace("custom_zero_1_float32", "custom_nobatch_zero_1_float32", 1)
    config.write_text(text.replace("max_batch_size: 1", "max_batch_size: 0").replace("dims: [ 1 ]", "dims: [ -1, -1 ]"))


_RUNS = [
    Run("cpu", ["--model-repository={unit}/models", "--exit-timeout-secs=600", "--backend-config=python,stub-timeout-seconds=120",
                f"--backend-config=python,shm-default-byte-size={1024 * 1024}"],
        ["infer_test.py"], "inference_server.cpu.log",
        env={"BACKENDS": "onnx python", "ENSEMBLES": "1", "NOBATCH": "1", "BATCH": "1", "TRITON_SERVER_CPU_ONLY": "1"}),  # fmt: skip
]

UNITS = {
    "L0_infer": Unit(
        "L0_infer", _build, _RUNS, python_models_only=False,
        note="the libtorch, plan, openvino and python_dlpack models, the GPU target, shared memory and valgrind runs are "
             "not run; Triton's C++ identity backend (nop_* and custom_zero_1_float32) is a Python model with its "
             "behaviour (benchmarks/triton_qa/models/identity.py)"),  # fmt: skip
}
