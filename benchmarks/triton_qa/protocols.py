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

from benchmarks.triton_qa.runner import Run, Unit, copy_python_model, edit_config

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


def _generated(qa: Path, unit: Path, script: str, *flags: str) -> Path:
    """The models one of qa/common's generators writes (with its --onnx paths), generated once per work folder."""
    out = unit.parent / "_generated" / f"{Path(script).stem}{''.join(flags)}"
    if not out.is_dir():
        partial = out.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        subprocess.run([sys.executable, script, "--models_dir", str(partial), *flags], cwd=qa / "common", check=True, capture_output=True)
        partial.rename(out)
    return out


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
    identity = _generated(qa, unit, "gen_qa_identity_models.py", "--onnx")
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


UNITS = {
    "L0_http": Unit("L0_http", _http_models, _http_runs(), python_models_only=False,
                    note="the example clients, the C++ client tests, nginx basic auth and the string dyna-sequence model "
                         "(Triton's C++ dyna_sequence backend) are not run"),  # fmt: skip
    "L0_grpc": Unit("L0_grpc", _grpc_models, _grpc_runs(), python_models_only=False,
                    note="the example clients, the C++ client tests, nginx basic auth, grpc_health_probe and the string "
                         "dyna-sequence model (Triton's C++ dyna_sequence backend) are not run"),  # fmt: skip
}
