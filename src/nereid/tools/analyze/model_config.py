"""Reading and writing a model's `config.pbtxt` for analyze, with the `ModelConfig` protobuf that ships in
tritonclient and protobuf's text and JSON formats. No parser of its own and nothing from the server's code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from nereid.tools.analyze.settings import AnalyzeError

__all__ = [
    "ModelConfig",
    "config_from_server_json",
    "config_to_load_json",
    "config_to_pbtxt",
    "empty_config",
    "is_ensemble",
    "is_onnx",
    "read_config_file",
]

# Generated protobuf classes have no type stubs: annotations use this alias, code builds mc.ModelConfig().
ModelConfig: TypeAlias = Any


def empty_config() -> ModelConfig:
    return mc.ModelConfig()


def read_config_file(path: Path) -> ModelConfig:
    """Parse a `config.pbtxt`; a malformed file is an `AnalyzeError` naming it."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise AnalyzeError(f"cannot parse {path}: {exc}") from None
    except OSError as exc:
        raise AnalyzeError(f"cannot read {path}: {exc.strerror or exc}") from None
    return config


def config_from_server_json(document: dict[str, Any]) -> ModelConfig:
    """The config a server reports at /v2/models/<name>/config (fields it adds that this protobuf lacks are skipped)."""
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(document, config, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise AnalyzeError(f"the server's model config could not be read: {exc}") from None
    return config


def config_to_load_json(config: ModelConfig) -> str:
    """The `config` parameter of the repository load API: the whole config as JSON, with proto field names."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def config_to_pbtxt(config: ModelConfig, header: str = "") -> str:
    body = text_format.MessageToString(config)
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + body


def is_onnx(config: ModelConfig) -> bool:
    return config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == "ensemble" or config.HasField("ensemble_scheduling")
