"""The SageMaker and Vertex AI flags and environment variables become settings as tritonserver reads them, and
`nereid sagemaker-serve` builds the flags Triton's SageMaker `serve` script builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.cloud_env import sagemaker_serve_argv
from nereid.core.errors import NereidError
from nereid.core.settings import SagemakerSettings, ServerSettings, VertexAiSettings
from nereid.frontends.cloud.common import header_length
from nereid.frontends.cloud.sagemaker import SAGEMAKER_BINARY_MIME
from nereid.frontends.cloud.vertex_ai import default_vertex_model
from nereid.serve_flags import parse_serve_args

_VERTEX_ENV = {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}


def _parse(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> ServerSettings:
    return parse_serve_args(["--model-repository", str(tmp_path), *flags], env or {})


def test_cloud_endpoints_are_off_unless_asked_for(tmp_path: Path) -> None:
    settings = _parse(tmp_path)
    assert settings.sagemaker is None and settings.vertex_ai is None
    assert settings.ignored_flags == []


def test_sagemaker_flags_and_environment_become_settings(tmp_path: Path) -> None:
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet", "SAGEMAKER_TRITON_PING_MODE": "live"}
    settings = _parse(tmp_path, "--allow-sagemaker=true", "--sagemaker-port=9090", "--sagemaker-safe-port-range=8000-9999",
                      "--sagemaker-thread-count=4", env=env)  # fmt: skip
    assert settings.sagemaker == SagemakerSettings("0.0.0.0", 9090, (8000, 9999), 4, "resnet", "live")
    assert "--allow-sagemaker" not in settings.ignored_flags


def test_sagemaker_default_model_is_tritons_placeholder_without_the_variable(tmp_path: Path) -> None:
    settings = _parse(tmp_path, "--allow-sagemaker")
    assert settings.sagemaker.default_model == "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
    assert settings.sagemaker.port == 8080 and settings.sagemaker.ping_mode == "ready"


def test_a_bad_safe_port_range_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(tmp_path, "--allow-sagemaker", "--sagemaker-safe-port-range=8000:9000")
    assert "--sagemaker-safe-port-range: expected <integer>-<integer>" in capsys.readouterr().err


def test_services_outside_the_safe_port_range_are_refused_with_tritons_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(tmp_path, "--allow-sagemaker", "--sagemaker-port=8080", "--sagemaker-safe-port-range=8080-8090",
               "--http-address=0.0.0.0")  # fmt: skip
    assert "The server cannot listen to HTTP requests at port 8000, allowed port range is [8080, 8090]" in capsys.readouterr().err


def test_two_services_on_one_port_are_refused_with_tritons_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(tmp_path, "--allow-sagemaker", "--allow-vertex-ai", env=_VERTEX_ENV)  # both default to 8080
    assert (
        "The server cannot listen to SageMaker requests and Vertex AI requests at the same address and port 0.0.0.0:8080"
        in capsys.readouterr().err
    )


def test_vertex_ai_routes_come_from_the_environment(tmp_path: Path) -> None:
    settings = _parse(tmp_path, "--allow-vertex-ai=true", "--vertex-ai-port=9001", "--vertex-ai-default-model=m", env=_VERTEX_ENV)
    assert settings.vertex_ai == VertexAiSettings("0.0.0.0", 9001, 8, "m", "/predict", "/health")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AIP_HEALTH_ROUTE": "/h"}, "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"),
        ({"AIP_PREDICT_ROUTE": "/p"}, "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"),
    ],
)
def test_vertex_ai_without_its_routes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SystemExit):
        _parse(tmp_path, "--allow-vertex-ai", env=env)
    assert message in capsys.readouterr().err


def test_aip_mode_prediction_turns_vertex_ai_on_and_http_grpc_off(tmp_path: Path) -> None:
    env = {**_VERTEX_ENV, "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "7070"}
    settings = _parse(tmp_path, env=env)
    assert settings.vertex_ai is not None and settings.vertex_ai.port == 7070
    assert not settings.allow_http and not settings.allow_grpc
    explicit = _parse(tmp_path, "--allow-http=true", "--vertex-ai-port=7171", env=env)
    assert explicit.allow_http and explicit.vertex_ai.port == 7171


def test_aip_storage_uri_is_the_repository_when_none_is_given(tmp_path: Path) -> None:
    settings = parse_serve_args([], {"AIP_STORAGE_URI": str(tmp_path)})
    assert settings.model_repositories == [tmp_path.resolve()]


def test_vertex_default_model_is_chosen_as_triton_chooses_it() -> None:
    settings = VertexAiSettings(predict_route="/p", health_route="/h")
    assert default_vertex_model(settings, ["only"]) == "only"
    with pytest.raises(ValueError, match="Expect the model repository contains only a single model if default model is not specified"):
        default_vertex_model(settings, ["a", "b"])
    named = VertexAiSettings(default_model="b", predict_route="/p", health_route="/h")
    assert default_vertex_model(named, ["a", "b"]) == "b"
    with pytest.raises(ValueError, match="Expect the default model 'b' is loaded"):
        default_vertex_model(named, ["a"])


def test_header_length_comes_from_the_binary_mime_type() -> None:
    mime = SAGEMAKER_BINARY_MIME
    assert header_length([], mime, 10) is None  # all JSON
    assert header_length([(b"content-type", b"application/json")], mime, 10) is None
    assert header_length([(b"content-type", mime + b"7")], mime, 10) == 7
    assert header_length([(b"content-type", mime + b"abc")], mime, 10) == 0  # atoi: raw data, as in Triton
    assert header_length([], mime, 0) == 0  # an empty body is raw data too
    with pytest.raises(NereidError, match=r"inference header size should be in range \(0, 10\), got: 11"):
        header_length([(b"content-type", mime + b"11")], mime, 10)
    with pytest.raises(NereidError, match="expect MIME type for binary data starts with"):
        header_length([(b"content-type", b"x;" + mime + b"1")], mime, 10)


def _repository(tmp_path: Path, *models: str) -> Path:
    for name in models:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    return tmp_path


def test_sagemaker_serve_loads_the_only_model_and_names_it_the_default(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "model", "resnet")
    argv, env = sagemaker_serve_argv({"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_TRITON_LOG_VERBOSE": "false"},
                                     ["--model-repository", str(repo)])  # fmt: skip
    assert argv[:5] == ["--allow-sagemaker=true", "--allow-grpc=false", "--allow-http=false", "--allow-metrics=false",
                        "--model-control-mode=explicit"]  # fmt: skip
    assert "--sagemaker-port=9000" in argv and "--log-verbose=0" in argv and "--load-model=resnet" in argv
    assert env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] == "resnet"
    settings = parse_serve_args(argv, env)
    assert settings.sagemaker is not None and settings.sagemaker.default_model == "resnet" and settings.sagemaker.port == 9000
    assert settings.load_models == ["resnet"] and not settings.allow_http


def test_sagemaker_serve_refuses_what_tritons_script_refuses(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "model", "a", "b")
    with pytest.raises(ValueError, match="More than 1 model directory found in model repository.*a b"):
        sagemaker_serve_argv({}, ["--model-repository", str(repo)])
    with pytest.raises(ValueError, match="SAGEMAKER_TRITON_DEFAULT_MODEL_NAME c does not exist"):
        sagemaker_serve_argv({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "c"}, ["--model-repository", str(repo)])
    argv, _ = sagemaker_serve_argv({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "b"}, ["--model-repository", str(repo)])
    assert "--load-model=b" in argv
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="No model found in model repository"):
        sagemaker_serve_argv({}, [f"--model-repository={empty}"])
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.pbtxt").write_text("")
    with pytest.raises(ValueError, match="Incorrect directory structure"):
        sagemaker_serve_argv({}, ["--model-repository", str(flat)])


def test_sagemaker_serve_in_multi_model_mode_loads_nothing(tmp_path: Path) -> None:
    argv, _ = sagemaker_serve_argv({"SAGEMAKER_MULTI_MODEL": "true"}, [f"--model-repository={tmp_path}"])
    assert not any(flag.startswith("--load-model") for flag in argv)
    assert "--model-control-mode=explicit" in argv
