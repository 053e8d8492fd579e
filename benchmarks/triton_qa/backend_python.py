"""qa/L0_backend_python's subtests (each a folder with its own test.sh)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit, copy_python_model, edit_config

__all__ = ["UNITS"]


def _lifecycle_models(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    for name in ("error_code", "execute_cancel", "decoupled_grpc_error", "execute_return_error"):
        copy_python_model(qa, models, name)
    edit_config(copy_python_model(qa, models, "execute_error"), "execute_error", 8,
                 "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }\n")  # fmt: skip
    edit_config(copy_python_model(qa, models, "execute_grpc_error"), "execute_grpc_error", 8,
                 "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }\n")  # fmt: skip
    edit_config(copy_python_model(qa, models, "wrong_model"), "wrong_model", replace=("TYPE_FP32", "TYPE_UINT32"))


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _derive(models: Path, source: str, name: str, *subs: tuple[str, str], append: str = "") -> Path:
    """A copy of models/<source> as models/<name>, its config edited as test.sh's `sed -i` lines edit it."""
    target = models / name
    shutil.copytree(models / source, target)
    config = target / "config.pbtxt"
    text = re.sub(r"(?m)^name:.*", f'name: "{name}"', config.read_text())
    for pattern, replacement in subs:
        text = re.sub(pattern, replacement, text)
    config.write_text(text + append)
    return target


def _python_test_models(unit: Path, qa: Path) -> None:
    # init_args checks that its model_repository is $TRITON_DIR/qa/L0_backend_python/models/init_args, the layout of
    # Triton's CI image: the models lie in such a tree under the unit's folder, and TRITON_DIR names its top.
    models = _fresh(unit / "triton_dir" / "qa" / "L0_backend_python" / "models")
    edit_config(copy_python_model(qa, models, "pytorch_fp32_fp32"), "pytorch_fp32_fp32")
    for name in ("identity_fp32", "identity_bf16", "delayed_model", "init_args", "optional",
                 "non_contiguous", "string", "string_fixed", "dlpack_identity"):  # fmt: skip
        copy_python_model(qa, models, name)
    _derive(models, "identity_fp32", "identity_uint8", ("TYPE_FP32", "TYPE_UINT8"), (r"(?m)^max_batch_size:.*", "max_batch_size: 8"),
            append="dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }\n")  # fmt: skip
    _derive(models, "identity_fp32", "identity_uint8_nobatch", ("TYPE_FP32", "TYPE_UINT8"), (r"(?m)^max_batch_size:.*", ""))
    _derive(models, "identity_fp32", "identity_uint32", ("TYPE_FP32", "TYPE_UINT32"))
    _derive(models, "identity_fp32", "identity_bool", ("TYPE_FP32", "TYPE_BOOL"))
    default = _derive(models, "identity_fp32", "default_model_name", append='default_model_filename: "mymodel.py"\n')
    (default / "1" / "model.py").rename(default / "1" / "mymodel.py")


def _decoupled_models(unit: Path, qa: Path) -> None:
    models = _fresh(unit / "models")
    # test.sh also copies dlpack_add_sub, which no case calls: it is left out, for it imports torch, which the
    # reference Triton's Python lacks.
    for name in ("identity_fp32", "execute_cancel", "response_sender_until_cancelled"):
        copy_python_model(qa, models, name)
    with open(models / "execute_cancel" / "config.pbtxt", "a") as config:
        config.write("model_transaction_policy { decoupled: True }\n")
    # The unit's own models (decoupled_bls needs a GPU: it is left out, with its test).
    for model in (qa / "L0_backend_python" / "decoupled" / "models").iterdir():
        if model.name != "decoupled_bls":
            shutil.copytree(model, models / model.name)
    # python_backend's decoupled example (test.sh clones python_backend): a copy of its examples/ beside qa/.
    examples = qa.parent / "python_backend" / "examples" / "decoupled"
    (models / "square_int32" / "1").mkdir(parents=True)
    shutil.copy(examples / "square_model.py", models / "square_int32" / "1" / "model.py")
    shutil.copy(examples / "square_config.pbtxt", models / "square_int32" / "config.pbtxt")


_DECOUPLED_TESTS = ["execute_error", "bls_stream", "return_response_error", "send_after_close_error", "execute_cancel", "bls_cancel",
                    "bls_ignore_cancel", "bls_cancel_after_cancellation", "bls_cancel_after_completion", "raise_exception"]  # fmt: skip


def _response_sender_models(unit: Path, qa: Path) -> None:
    models = _fresh(unit / "models")
    decoupled = "model_transaction_policy { decoupled: True }\n"
    batching = "dynamic_batching { max_queue_delay_microseconds: 500000 }\n"
    for name, source, append in (
        ("response_sender", "model.py", ""),
        ("response_sender_decoupled", "model.py", decoupled),
        ("response_sender_async", "model_async.py", ""),
        ("response_sender_decoupled_async", "model_async.py", decoupled),
        ("response_sender_batching", "model.py", batching),
        ("response_sender_decoupled_batching", "model.py", decoupled + batching),
        ("response_sender_async_batching", "model_async.py", batching),
        ("response_sender_decoupled_async_batching", "model_async.py", decoupled + batching),
    ):
        source_dir = qa / "python_models" / "response_sender"
        (models / name / "1").mkdir(parents=True)
        shutil.copy(source_dir / "model_common.py", models / name / "1")
        shutil.copy(source_dir / source, models / name / "1" / "model.py")
        (models / name / "config.pbtxt").write_text((source_dir / "config.pbtxt").read_text() + append)
    # test.sh's second start replaces models/ with this one model; it lives in a folder of its own here.
    copy_python_model(qa, _fresh(unit / "models_complete_final"), "response_sender_complete_final")


def _copy_models(*names: str) -> Callable[[Path, Path], None]:
    def build(unit: Path, qa: Path) -> None:
        models = _fresh(unit / "models")
        for name in names:
            copy_python_model(qa, models, name)

    return build


def _model_control_models(unit: Path, qa: Path) -> None:
    models = _fresh(unit / "models")
    copy_python_model(qa, models, "identity_fp32")
    (models / "simple_identity_fp32" / "1").mkdir(parents=True)  # a config and an empty version, as test.sh lays it
    shutil.copy(qa / "python_models" / "simple_identity_fp32" / "config.pbtxt", models / "simple_identity_fp32")


def _argument_validation_models(unit: Path, qa: Path) -> None:
    shutil.rmtree(unit / "models", ignore_errors=True)
    shutil.copytree(qa / "L0_backend_python" / "argument_validation" / "models", unit / "models")


UNITS = {
    "L0_backend_python/lifecycle": Unit(
        "L0_backend_python/lifecycle",
        _lifecycle_models,
        [
            Run(
                name="lifecycle",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["lifecycle_test.py"],
                server_log="lifecycle_server.log",
                # The unit's shared-memory leak probe watches Triton's own shm region files and needs Triton's
                # compiled triton_shm_monitor module; Jetson runs skip it, and so does this.
                env={"TEST_JETSON": "1"},
            )
        ],
        note="test.sh's later starts (models whose initialize() or finalize() raise) are not run",
    ),
    "L0_backend_python/python_test": Unit(
        "L0_backend_python",
        _python_test_models,
        [
            Run(
                name="python_test",
                server_args=["--model-repository={unit}/triton_dir/qa/L0_backend_python/models", "--log-verbose=1", "--allow-client-shm=true",
                             "--backend-config=python,shm-default-byte-size=5242880"],  # fmt: skip
                tests=["python_test.py"],
                server_log="inference_server.log",
                # TEST_JETSON as in lifecycle: no GPU here (the CUDA shared-memory cases) and no triton_shm_monitor.
                env={"TEST_JETSON": "1", "TRITON_DIR": "{unit}/triton_dir"},
            )
        ],
        note="test.sh's later parts (non-graceful exit, KIND_GPU, the other subtests it calls) are not run",
    ),
    "L0_backend_python/decoupled": Unit(
        "L0_backend_python/decoupled",
        _decoupled_models,
        [
            Run(
                name="decoupled",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["decoupled_test.py " + " ".join(f"DecoupledTest.test_decoupled_{t}" for t in _DECOUPLED_TESTS)],
                server_log="decoupled_server.log",
                env={"TEST_JETSON": "1"},
                # test.sh's greps for "Specific Msg!" and the like count decoupled_bls's log lines: left out with it.
                present_in_log=["Finalize invoked", "Finalize complete..."],
            )
        ],
        note="test_decoupled_bls and its model need a GPU (torch tensors moved to CUDA)",
    ),
    "L0_backend_python/response_sender": Unit(
        "L0_backend_python/response_sender",
        _response_sender_models,
        [
            Run(
                name="response_sender",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["response_sender_test.py"],
                server_log="response_sender_test.server.log",
                env={"SERVER_LOG": "response_sender_test.server.log"},
            ),
            Run(
                name="complete_final",
                server_args=["--model-repository=models_complete_final", "--log-verbose=1"],
                tests=["response_sender_complete_final_test.py"],
                server_log="response_sender_complete_final_test.server.log",
                env={"SERVER_LOG": "response_sender_complete_final_test.server.log"},
            ),
        ],
    ),
    "L0_backend_python/async_execute": Unit(
        "L0_backend_python/async_execute",
        _copy_models("async_execute_decouple", "async_execute_decouple_bls"),
        [
            Run(
                name="concurrency",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["concurrency_test.py"],
                server_log="concurrency_test.server.log",
                env={"SERVER_LOG": "concurrency_test.server.log"},
            )
        ],
    ),
    "L0_backend_python/request_rescheduling": Unit(
        "L0_backend_python/request_rescheduling",
        _copy_models("bls_request_rescheduling", "request_rescheduling_addsub", "iterative_sequence", "wrong_return_type"),
        [
            Run(
                name="request_rescheduling",
                server_args=["--model-repository=models", "--model-control-mode=explicit", "--load-model=*", "--log-verbose=1"],
                tests=["pytest ../test_infer_shm_leak.py", "grpc_endpoint_test.py"],
                server_log="request_rescheduling_server.log",
                env={"MODEL_NAME": "bls_request_rescheduling", "TEST_JETSON": "1"},
            )
        ],
    ),
    "L0_backend_python/parameters": Unit(
        "L0_backend_python/parameters",
        _copy_models("response_parameters", "response_parameters_decoupled", "response_parameters_bls"),
        [
            Run(
                name="response_parameters",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["response_parameters_test.py"],
                server_log="response_parameters_test.server.log",
                env={"TEST_JETSON": "1"},
            )
        ],
    ),
    "L0_backend_python/custom_metrics": Unit(
        "L0_backend_python/custom_metrics",
        _copy_models("custom_metrics"),
        [
            Run(
                name="custom_metrics",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["pytest ../test_infer_shm_leak.py"],
                server_log="custom_metrics_server.log",
                env={"MODEL_NAME": "custom_metrics", "TEST_JETSON": "1"},
            )
        ],
    ),
    "L0_backend_python/model_control": Unit(
        "L0_backend_python/model_control",
        _model_control_models,
        [
            Run(
                name="model_control",
                server_args=["--model-repository=models", "--model-control-mode=explicit", "--log-verbose=1"],
                tests=["model_control_test.py", "model_control_test.py ModelIDValidationTest"],
                server_log="model_control_server.log",
                env={"TEST_JETSON": "1"},
            )
        ],
    ),
    "L0_backend_python/argument_validation": Unit(
        "L0_backend_python/argument_validation",
        _argument_validation_models,
        [
            Run(
                name="argument_validation",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["pytest ../test_infer_shm_leak.py"],
                server_log="arg_validation_server.log",
                env={"MODEL_NAME": "argument_validation", "TEST_JETSON": "1"},
            )
        ],
    ),
    "L0_backend_python/logging": Unit(
        "L0_backend_python/logging",
        _copy_models("identity_fp32_logging"),
        [
            Run(
                name=name,
                server_args=["--model-repository=models"],  # test.sh: no --log-verbose
                tests=["logging_test.py"],
                server_log="logging_server.log",
                env={"TEST_JETSON": "1"},
                log_settings=settings,
                # The model logs each message at initialize, execute and finalize (and once more in execute for
                # Linux): test.sh's counts of "Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!", "Verbose Msg!".
                log_counts={**{f"{kind} Msg!": plain for kind in ("Specific", "Info", "Warning", "Error")}, "Verbose Msg!": verbose},
            )
            for name, settings, plain, verbose in (
                ("default", [], 4, 0),
                ("verbose", [{"log_verbose_level": 1}], 4, 3),
                ("disabled", [{"log_info": False}, {"log_warning": False}, {"log_error": False}], 1, 0),
            )
        ],
    ),
}

