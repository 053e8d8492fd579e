"""What the fuzz tests share: a small repository of real models to fuzz, and the checks every answer must pass
(no 5xx but a well-formed model error, always an answer)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.servers import ROOT

__all__ = ["DERANDOMIZE", "FUZZ_MODELS", "SPEC_PATH", "assert_well_formed", "fuzz_repository", "load_spec", "spec_operations"]

# In CI (CI=true) every fuzz test draws the same cases each run, so a failure there is reproducible; elsewhere
# each run explores new ones (and hypothesis keeps any failure it finds in .hypothesis/ to replay first).
DERANDOMIZE = os.environ.get("CI") == "true"
_UNHANDLED = re.compile(r"^[A-Z]\w*(Error|Exception): ")
SPEC_PATH = ROOT / "docs" / "openapi.yaml"
EXAMPLES = ROOT / "examples" / "model_repository"
# ONNX, Python, BYTES and ensemble models: each decodes its inputs on a different path.
FUZZ_MODELS = ["simple", "add_sub_python", "identity_fp32", "simple_string", "simple_ensemble"]
_ENSEMBLE_STEPS = ["ensemble_preprocess", "ensemble_postprocess"]


def fuzz_repository(target: Path) -> Path:
    """A copy of the example models the fuzz tests send to (built by examples/build_models.py)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in FUZZ_MODELS + _ENSEMBLE_STEPS:
        shutil.copytree(EXAMPLES / name, target / name, dirs_exist_ok=True)
    return target


def load_spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def spec_operations(spec: dict[str, Any]) -> list[tuple[str, str, re.Pattern[str]]]:
    """(method, path template, regex matching concrete paths) for every operation in the spec."""
    operations = []
    for template, item in spec["paths"].items():
        pattern = "^" + re.sub(r"\\\{(\w+)\\\}", lambda m: ".+" if m.group(1) == "model_id" else "[^/]+",
                               re.escape(template)) + "$"
        for method in item:
            if method in ("get", "post", "put", "delete", "patch"):
                operations.append((method.upper(), template, re.compile(pattern)))
    return operations


def assert_well_formed(status: int, body: bytes, content_type: str, what: str) -> None:
    """Any answer below 500 is fine; 500 and 503 (a model's error, an unavailable model) and 501 (Triton's
    UNSUPPORTED, for a feature this server refuses) only as a JSON error object; never another 5xx."""
    if status < 500:
        return
    assert status in (500, 501, 503), f"{what}: status {status}: {body[:500]!r}"
    assert content_type.startswith("application/json"), f"{what}: {status} with content-type {content_type!r}"
    doc = orjson.loads(body)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), (str, dict)), f"{what}: {status}: {body[:500]!r}"
    # The frontends answer an exception they did not expect as 500 "<ExceptionType>: ...": a bug, not a model's error.
    message = doc["error"] if isinstance(doc["error"], str) else str(doc["error"].get("message", ""))
    assert not _UNHANDLED.match(message), f"{what}: unhandled exception: {message[:500]}"
