"""qa/L0_http, L0_grpc and the I/O units (input validation, strings, parameters, shared memory, ensembles).

Their models are built as test.sh builds them: Triton's example repository (`docs/examples/model_repository`, beside
`qa/` in the same checkout of Triton's server repository) and the identity models qa/common's generator writes with
`--onnx`. Models only Triton's C++ backends provide are left out, and so are the cases that need them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit, copy_python_model, edit_config, generated

__all__ = ["UNITS"]


# -- models -------------------------------------------------------------------------------------------------
def _examples(qa: Path) -> Path:
    examples = qa.parent / "docs" / "examples" / "model_repository"
    if not examples.is_dir():
        raise SystemExit(f"{examples} is missing: these units need Triton's example models beside qa/ (git archive HEAD docs/examples/model_repository)")
    return examples


def _example_models(qa: Path, target: Path) -> None:
    """The unit's `models/` as Triton's CI lays it out: the example models that ship with their files."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for model in sorted(_examples(qa).iterdir()):
        if any((model / "1").glob("model.*")):  # densenet/inception come from a download script
            shutil.copytree(model, target / model.name)


def _copy_renamed(source: Path, target: Path, edits: list[tuple[str, str]], append: str = "") -> None:
    shutil.copytree(source, target)
    config = target / "config.pbtxt"
    text = config.read_text()
    for pattern, replacement in edits:
        text = re.sub(pattern, replacement, text, count=1)
    config.write_text(text + append)


# -- L0_http ------------------------------------------------------------------------------------------------
def _http_models(unit: Path, qa: Path) -> None:
    _example_models(qa, unit / "models")
    identity = generated(qa, unit, "gen_qa_identity_models.py", "--onnx")
    models = unit / "python_unit_test_models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir()
    for name in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16", "onnx_zero_3_float32"):
        shutil.copytree(identity / name, models / name)
    _copy_renamed(models / "onnx_zero_1_object", models / "onnx_zero_1_object_1_element",
                  [("onnx_zero_1_object", "onnx_zero_1_object_1_element"), ("-1", "1")])  # fmt: skip
    _copy_renamed(models / "onnx_zero_1_float32", models / "onnx_zero_1_float32_queue", [("onnx_zero_1_float32", "onnx_zero_1_float32_queue")],
                  "dynamic_batching {\n max_queue_delay_microseconds: 1000000\n preferred_batch_size: [ 8 ]\n"
                  " default_queue_policy {\n max_queue_size: 1\n }\n}\n")  # fmt: skip
    shutil.copytree(unit / "models" / "simple_identity", models / "simple_identity")
    _copy_renamed(models / "simple_identity", models / "simple_identity_int64",
                  [("TYPE_STRING", "TYPE_INT64"), ("simple_identity", "simple_identity_int64")])  # fmt: skip
    limits = unit / "http_input_size_limit_test_models"
    shutil.rmtree(limits, ignore_errors=True)
    limits.mkdir()
    shutil.copytree(identity / "onnx_zero_1_float32", limits / "onnx_zero_1_float32")
    shutil.copytree(unit / "models" / "simple_identity", limits / "simple_identity")


def _http_runs() -> list[Run]:
    limits = "http_input_size_limit_test.py InferSizeLimitTest.test_"
    return [
        Run("client plugin", ["--model-repository=models", "--allow-client-shm=true"], ["http_client_plugin_test.py"], "inference_server.log"),
        Run("aio", ["--model-repository=models", "--allow-client-shm=true"], ["python_http_aio_test.py"], "inference_server_aio.log"),
        Run("http_test", ["--model-repository=python_unit_test_models", "--model-control-mode=explicit", "--load-model=*"],
            ["http_test.py"], "inference_server_http_test.log"),  # fmt: skip
        Run("generate", ["--model-repository=../python_models/generate_models", "--log-verbose=1"],
            ["generate_endpoint_test.py"], "inference_server_generate_endpoint_test.log"),  # fmt: skip
        Run("restricted api repeated", ["--model-repository=models", "--http-restricted-api=model-repository,health:k1=v1",
                                        "--http-restricted-api=metadata,health:k2=v2"], [], "http_restricted_endpoint_test.log",
            refuses_to_start="api 'health' can not be specified in multiple config groups"),  # fmt: skip
        Run("restricted api unknown", ["--model-repository=models", "--http-restricted-api=model-reposit,health:k1=v1",
                                       "--http-restricted-api=metadata,health:k2=v2"], [], "http_restricted_endpoint_test.log",
            refuses_to_start="unknown restricted api 'model-reposit'"),  # fmt: skip
        Run("restricted api", ["--model-repository=models", "--http-restricted-api=model-repository:admin-key=admin-value",
                               "--http-restricted-api=inference,metadata:infer-key=infer-value"],
            ["http_restricted_api_test.py RestrictedAPITest"], "http_restricted_endpoint_test.log"),  # fmt: skip
        Run("input size default", ["--model-repository=http_input_size_limit_test_models"],
            [limits + name for name in ("default_limit_raw_binary", "default_limit_json", "large_string_in_json", "default_limit_compressed",
                                         "json_dtype_size_expansion_exceeds_limit_error", "no_leak_on_invalid_inference_header_length")],
            "inference_server_input_size_limit.log"),  # fmt: skip
        Run("input size 2^27", ["--model-repository=http_input_size_limit_test_models", f"--http-max-input-size={2**27}"],
            [limits + name for name in ("large_input_raw_binary", "large_input_json", "large_input_compressed")],
            "inference_server_input_size_limit.log"),  # fmt: skip
        Run("input size 0", ["--model-repository=http_input_size_limit_test_models", "--http-max-input-size=0"], [],
            "inference_server_input_size_limit.log", refuses_to_start="Error: --http-max-input-size must be greater than 0."),  # fmt: skip
        Run("input size -1024", ["--model-repository=http_input_size_limit_test_models", "--http-max-input-size=-1024"], [],
            "inference_server_input_size_limit.log", refuses_to_start="Error: --http-max-input-size must be greater than 0."),  # fmt: skip
        Run("many chunks", ["--model-repository=models", "--allow-client-shm=true", "--log-verbose=1", "--model-control-mode=explicit",
                            "--load-model=simple"], ["http_request_many_chunks.py"], "inference_server_request_many_chunks.log"),  # fmt: skip
    ]


# -- L0_grpc ------------------------------------------------------------------------------------------------
def _grpc_models(unit: Path, qa: Path) -> None:
    _example_models(qa, unit / "models")
    models = unit / "grpc_test_models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir()
    shutil.copytree(unit / "models" / "simple", models / "simple")
    edit_config(copy_python_model(qa, models, "string_identity"), "string_identity", replace=("dims: [ 1 ]", "dims: [ -1 ]"))
    plugin = unit / "client_plugin_models"
    shutil.rmtree(plugin, ignore_errors=True)
    shutil.copytree(qa / "L0_grpc" / "client_plugin_models", plugin)


def _grpc_runs() -> list[Run]:
    return [
        Run("grpc_test", ["--model-repository=grpc_test_models"], ["python_unit_test.py GrpcTest"], "inference_server_grpc_test.log"),
        Run("client plugin", ["--model-repository=client_plugin_models", "--http-header-forward-pattern=.*", "--grpc-header-forward-pattern=.*"],
            ["grpc_client_plugin_test.py"], "inference_server_client_plugin.log"),  # fmt: skip
        Run("aio", ["--model-repository=models", "--allow-client-shm=true"], ["python_grpc_aio_test.py"], "inference_server_aio.log"),
        Run("restricted protocol repeated", ["--model-repository=models", "--grpc-restricted-protocol=model-repository,health:k1=v1",
                                             "--grpc-restricted-protocol=metadata,health:k2=v2"], [], "inference_server_restricted.log",
            refuses_to_start="protocol 'health' can not be specified in multiple config groups"),  # fmt: skip
        Run("restricted protocol unknown", ["--model-repository=models", "--grpc-restricted-protocol=model-reposit,health:k1=v1",
                                            "--grpc-restricted-protocol=metadata,health:k2=v2"], [], "inference_server_restricted.log",
            refuses_to_start="unknown restricted protocol 'model-reposit'"),  # fmt: skip
        Run("restricted protocol", ["--model-repository=models", "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
                                    "--grpc-restricted-protocol=inference,health:infer-key=infer-value"],
            ["python_unit_test.py RestrictedProtocolTest"], "inference_server_restricted.log"),  # fmt: skip
    ]


# -- L0_input_validation ------------------------------------------------------------------------------------
def _input_validation_models(unit: Path, qa: Path) -> None:
    shutil.rmtree(unit / "models_optional", ignore_errors=True)
    shutil.copytree(qa / "L0_input_validation" / "models", unit / "models_optional")  # test.sh's first start: these only
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(qa / "L0_input_validation" / "models", models)
    (models / "pt_identity" / "1").mkdir(parents=True)
    subprocess.run([sys.executable, "-c", "import sys, torch; torch.jit.save(torch.jit.script(torch.nn.Identity()), sys.argv[1])",
                    str(models / "pt_identity" / "1" / "model.pt")], check=True)  # fmt: skip
    (models / "pt_identity" / "config.pbtxt").write_text(
        'name: "pt_identity"\nbackend: "pytorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [8] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 1000000 }\n"
    )
    shutil.copytree(generated(qa, unit, "gen_qa_models.py", "--onnx") / "onnx_object_int32_int32", models / "onnx_object_int32_int32")
    shutil.rmtree(unit / "test_models", ignore_errors=True)
    (unit / "test_models").mkdir()


_INPUT_VALIDATION_RUNS = [
    Run("input validation", ["--model-repository=models_optional"], ["input_validation_test.py InputValTest"], "inference_server.log"),
    Run("input shape", ["--model-repository=models", "--allow-client-shm=true"],
        ["input_validation_test.py InputShapeTest.test_input_shape_validation", "input_validation_test.py InputShapeTest.test_input_string_shape_validation"],
        "inference_server_shape.log"),  # fmt: skip
    Run("model name validation", ["--model-repository=test_models", "--model-control-mode=explicit", "--log-verbose=1"],
        ["input_validation_test.py ModelNameValidationTest"], "model_name_validation_server.log"),  # fmt: skip
]


# -- L0_string_io -------------------------------------------------------------------------------------------
def _string_io_models(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    edit_config(copy_python_model(qa, models, "string_identity"), "string_identity", replace=("[ 1 ]", "[ 8 ]"))


# -- L0_parameters ------------------------------------------------------------------------------------------
_IDENTITY = Path(__file__).parent / "models" / "identity.py"


def _parameters_models(unit: Path, qa: Path) -> None:
    models = unit / "model_repository"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(qa / "L0_parameters" / "model_repository", models)
    for name in ("identity", "ensemble"):
        (models / name / "1").mkdir(exist_ok=True)
    # Triton's C++ identity backend, as a Python model that does the same.
    shutil.copy(_IDENTITY, models / "identity" / "1" / "model.py")
    config = models / "identity" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "identity"', 'backend: "python"'))
    classes = unit / "models"
    shutil.rmtree(classes, ignore_errors=True)
    copy_python_model(qa, classes, "identity_fp32")
    edit_config(copy_python_model(qa, classes, "identity_fp32", "identity_bytes"), "identity_bytes", replace=("TYPE_FP32", "TYPE_STRING"))


def _parameters_runs() -> list[Run]:
    extra = {
        "test_headers": ["--grpc-header-forward-pattern=MY_HEADER.*", "--http-header-forward-pattern=MY_HEADER.*"],
        "test_grpc_header_forward_pattern_case_sensitive": ["--grpc-header-forward-pattern=(?-i)MY_HEADER.*"],
        "test_headers_reserved_rejected": ["--grpc-header-forward-pattern=.*", "--http-header-forward-pattern=.*"],
    }
    runs = [
        Run(test, ["--model-repository=model_repository", "--exit-timeout-secs=120", *extra.get(test, [])],
            [f"parameters_test.py InferenceParametersTest.{test}"], f"inference_server.{test}.log")  # fmt: skip
        for test in ("test_params", "test_params_reserved_rejected", "test_headers", "test_grpc_header_forward_pattern_case_sensitive",
                     "test_headers_reserved_rejected")  # fmt: skip
    ]
    runs += [Run(f"class count {client}", ["--model-repository=models", "--log-verbose=1"], ["class_count_test.py"],
                 f"class_count_test_{client}_server.log", env={"CLIENT_TYPE": client}) for client in ("http", "grpc")]  # fmt: skip
    return runs


# -- L0_shared_memory ---------------------------------------------------------------------------------------
_SHM_CASES = (
    "test_invalid_create_shm test_valid_create_set_register test_unregister_before_register test_unregister_after_register "
    "test_reregister_after_register test_unregister_after_inference test_register_after_inference test_too_big_shm test_mixed_raw_shm "
    "test_unregisterall test_infer_offset_out_of_bound test_infer_byte_size_out_of_bound test_infer_integer_overflow "
    "test_register_out_of_bound test_register_reserved_names test_register_invalid_shm_key test_python_client_leak"
).split()


def _shared_memory_models(unit: Path, qa: Path) -> None:
    _example_models(qa, unit / "models")
    delayed = unit / "python_models"
    shutil.rmtree(delayed, ignore_errors=True)
    target = copy_python_model(qa, delayed, "execute_delayed_model", "simple")
    edit_config(target, "simple")
    offsets = unit / "offset_models"
    shutil.rmtree(offsets, ignore_errors=True)
    edit_config(copy_python_model(qa, offsets, "add_sub", "python_int32_int32_int32"), "python_int32_int32_int32", replace=("TYPE_FP32", "TYPE_INT32"))
    shutil.copytree(generated(qa, unit, "gen_qa_models.py", "--onnx") / "onnx_int32_int32_int32", offsets / "onnx_int32_int32_int32")


def _shared_memory_runs() -> list[Run]:
    args = ["--log-verbose=1", "--allow-client-shm=true"]
    runs = [Run(f"test_client_shm_disabled_by_default {client}", ["--model-repository=models", "--log-verbose=1"],
                ["shared_memory_test.py SharedMemoryTest.test_client_shm_disabled_by_default"], f"shm_disabled.{client}.server.log",
                env={"CLIENT_TYPE": client}) for client in ("http", "grpc")]  # fmt: skip
    runs += [Run(f"{case} {client}", ["--model-repository=models", *args], [f"shared_memory_test.py SharedMemoryTest.{case}"],
                 f"{case}.{client}.server.log", env={"CLIENT_TYPE": client}) for case in _SHM_CASES for client in ("http", "grpc")]  # fmt: skip
    runs += [Run(f"{case} {client}", ["--model-repository=python_models", *args],
                 [f"shared_memory_test.py TestSharedMemoryUnregister.{case}_{client}"], f"{case}_{client}.server.log",
                 env={"CLIENT_TYPE": client})
             for case in ("test_unregister_shm_during_inference_single_req", "test_unregister_shm_during_inference_multiple_req",
                          "test_unregister_shm_after_inference") for client in ("http", "grpc")]  # fmt: skip
    runs += [Run(f"test_large_shm_register_offset {client}", ["--model-repository=offset_models", *args],
                 ["shared_memory_test.py SharedMemoryTest.test_large_shm_register_offset"], f"large_offset.{client}.server.log",
                 env={"CLIENT_TYPE": client, "BACKENDS": "python onnx"}) for client in ("http", "grpc")]  # fmt: skip
    return runs


# -- L0_simple_ensemble -------------------------------------------------------------------------------------
def _simple_ensemble_models(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(qa / "L0_simple_ensemble" / "models", models)
    for version in ("1", "2"):  # version_policy all: the test compares the two versions' counts
        (models / "simple" / version).mkdir()
        shutil.copy(_examples(qa) / "simple" / "1" / "model.onnx", models / "simple" / version / "model.onnx")
    for name in ("ensemble_add_sub_int32_int32_int32", "ensemble_partial_add_sub"):
        (models / name / "1").mkdir(exist_ok=True)


_ENSEMBLE_RUNS = [
    Run(case, ["--model-repository=models", *(["--log-verbose=1"] if case.endswith("partial_add_sub") else [])],
        [f"ensemble_test.py EnsembleTest.{case}"], f"inference_server.{case}.log",
        env={"SERVER_LOG": f"inference_server.{case}.log"})  # fmt: skip
    for case in ("test_ensemble_add_sub", "test_ensemble_sequence_flags", "test_ensemble_add_sub_one_output", "test_ensemble_partial_add_sub")
]


UNITS = {
    "L0_http": Unit("L0_http", _http_models, _http_runs(), python_models_only=False,
                    note="the example clients, the C++ client tests, nginx basic auth and the string dyna-sequence model "
                         "(Triton's C++ dyna_sequence backend) are not run"),  # fmt: skip
    "L0_grpc": Unit("L0_grpc", _grpc_models, _grpc_runs(), python_models_only=False,
                    note="the example clients, the C++ client tests, nginx basic auth, grpc_health_probe and the string "
                         "dyna-sequence model (Triton's C++ dyna_sequence backend) are not run"),  # fmt: skip
    "L0_input_validation": Unit("L0_input_validation", _input_validation_models, _INPUT_VALIDATION_RUNS, python_models_only=False,
                                note="InputShapeTest.test_wrong_input_shape_tensor_size (TensorRT shape-tensor models) and the "
                                     "C++ input_byte_size_test and tensor_size_test are not run"),  # fmt: skip
    "L0_string_io": Unit("L0_string_io", _string_io_models,
                         [Run("string io", ["--model-repository=models"], ["string_client_test.py"], "inference_server.log")]),  # fmt: skip
    "L0_parameters": Unit("L0_parameters", _parameters_models, _parameters_runs(),
                          note="Triton's C++ identity backend (a Python model with its behaviour stands in: "
                               "benchmarks/triton_qa/models/identity.py)"),  # fmt: skip
    "L0_shared_memory": Unit("L0_shared_memory", _shared_memory_models, _shared_memory_runs(), python_models_only=False,
                             note="test_large_shm_register_offset runs for the python and onnx models (BACKENDS) only: "
                                  "libtorch, plan and openvino models are not built"),  # fmt: skip
    "L0_simple_ensemble": Unit("L0_simple_ensemble", _simple_ensemble_models, _ENSEMBLE_RUNS, python_models_only=False,
                               note="ensemble_backpressure_test.py is not run"),  # fmt: skip
}
