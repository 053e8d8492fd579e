"""The SAGEMAKER_* and AIP_* environment variables that Triton's SageMaker and Vertex AI endpoints (and its
SageMaker `serve` script) honour, read here and only here: the CLI folds them into the settings, so nothing
deeper in Nereid reads the environment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "SAGEMAKER_MULTI_MODEL_REPO",
    "SAGEMAKER_SINGLE_MODEL_REPO",
    "aip_storage_uri",
    "parser_defaults",
    "sagemaker_environment",
    "sagemaker_serve_argv",
    "vertex_ai_routes",
]

SAGEMAKER_SINGLE_MODEL_REPO = "/opt/ml/model"
# The multi-model endpoint loads each model from its own folder; the repository flag only has to name one.
SAGEMAKER_MULTI_MODEL_REPO = "/tmp/sagemaker"


def parser_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """Flag defaults that depend on the environment, as tritonserver sets them before it parses its flags:
    inside Vertex AI (AIP_MODE=PREDICTION) the Vertex AI endpoint is on and HTTP and gRPC are off unless the
    flags say otherwise; AIP_HTTP_PORT is the Vertex AI port unless --vertex-ai-port is given."""
    defaults: dict[str, Any] = {}
    if env.get("AIP_MODE", "") == "PREDICTION":
        defaults.update(allow_vertex_ai=True, allow_http=False, allow_grpc=False)
    port = env.get("AIP_HTTP_PORT", "")
    if port:
        try:
            defaults["vertex_ai_port"] = int(port)
        except ValueError:
            raise ValueError(f"AIP_HTTP_PORT: expected a port number, got '{port}'") from None
    return defaults


def aip_storage_uri(env: Mapping[str, str]) -> str:
    """AIP_STORAGE_URI, the model repository tritonserver serves when no --model-repository is given."""
    return env.get("AIP_STORAGE_URI", "")


def vertex_ai_routes(env: Mapping[str, str]) -> tuple[str, str]:
    """(AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE), with tritonserver's error when one is missing."""
    predict, health = env.get("AIP_PREDICT_ROUTE", ""), env.get("AIP_HEALTH_ROUTE", "")
    if not predict:
        raise ValueError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")  # sic: Triton's wording
    if not health:
        raise ValueError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
    return predict, health


def sagemaker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What Triton's SageMaker endpoint reads at start: the model /invocations serves, the /ping mode and (in
    Triton releases after 2.51) whether /invocations is infer, generate or generate_stream."""
    values: dict[str, str] = {}
    if env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"):
        values["default_model"] = env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]
    if env.get("SAGEMAKER_TRITON_PING_MODE"):
        values["ping_mode"] = env["SAGEMAKER_TRITON_PING_MODE"]
    inference_type = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "")
    if inference_type:
        if inference_type not in ("infer", "generate", "generate_stream"):
            raise ValueError(
                f"SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}' is invalid. Must be one of: infer, generate, generate_stream."
            )
        values["inference_type"] = inference_type
    return values


# SAGEMAKER_* variable -> the tritonserver flag Triton's `serve` script passes for it.
_SERVE_FLAGS = (
    ("SAGEMAKER_BIND_TO_PORT", "--sagemaker-port"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "--sagemaker-safe-port-range"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count"),
    ("SAGEMAKER_TRITON_LOG_INFO", "--log-info"),
    ("SAGEMAKER_TRITON_LOG_WARNING", "--log-warning"),
    ("SAGEMAKER_TRITON_LOG_ERROR", "--log-error"),
)
_REPOSITORY_FLAG = re.compile(r"--(model-repository|model-store)(=.*)?$")


def sagemaker_serve_argv(env: Mapping[str, str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The `nereid serve` flags for a SageMaker container, as Triton's `serve` script builds tritonserver's:
    SageMaker endpoint only, explicit model control, the SAGEMAKER_* variables as flags, and outside the
    multi-model mode (SAGEMAKER_MULTI_MODEL=true) the one model to load, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME or
    the only folder of /opt/ml/model. `extra` flags come last and win; a --model-repository among them replaces
    /opt/ml/model. Returns the flags and the environment to serve with (the script exports the model it chose as
    SAGEMAKER_TRITON_DEFAULT_MODEL_NAME). Raises ValueError with the script's message when the repository does
    not fit."""
    env = dict(env)
    multi_model = env.get("SAGEMAKER_MULTI_MODEL", "") == "true"
    repository = _given_repository(extra) or (SAGEMAKER_MULTI_MODEL_REPO if multi_model else SAGEMAKER_SINGLE_MODEL_REPO)
    argv = ["--allow-sagemaker=true", "--allow-grpc=false", "--allow-http=false", "--allow-metrics=false",
            "--model-control-mode=explicit"]  # fmt: skip
    if _given_repository(extra) is None:
        argv.append(f"--model-repository={repository}")
    for variable, flag in _SERVE_FLAGS:
        if env.get(variable):
            argv.append(f"{flag}={env[variable]}")
    # The script turns verbose logging on unless SAGEMAKER_TRITON_LOG_VERBOSE says otherwise.
    verbose = env.get("SAGEMAKER_TRITON_LOG_VERBOSE", "1")
    argv.append(f"--log-verbose={ {'true': '1', 'false': '0'}.get(verbose.lower(), verbose) }")
    if multi_model:
        Path(repository).mkdir(parents=True, exist_ok=True)
        return argv + extra, env
    folder = Path(repository)
    if (folder / "config.pbtxt").is_file():
        raise ValueError("Incorrect directory structure: the model directory needs to contain the top level folder")
    default_model = env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
    if default_model:
        if not (folder / default_model).is_dir():
            raise ValueError(
                f"Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME {default_model} does not exist"
            )
    else:
        models = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        if not models:
            raise ValueError("No model found in model repository")
        if len(models) > 1:
            raise ValueError(
                "More than 1 model directory found in model repository. Either provide a single directory or set "
                f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to run the ensemble backend. Directories found in model "
                f"repository: {' '.join(models)}"
            )
        default_model = models[0]
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = default_model
    return argv + [f"--load-model={default_model}", *extra], env


def _given_repository(argv: list[str]) -> str | None:
    for index, item in enumerate(argv):
        match = _REPOSITORY_FLAG.match(item)
        if match:
            if match.group(2):
                return match.group(2)[1:]
            return argv[index + 1] if index + 1 < len(argv) else None
    return None
