"""Naming the backend of a model whose config names none, from the files in its version folders.

It only looks at file names; it never imports a backend."""

from __future__ import annotations

from pathlib import Path

__all__ = ["guess_backend", "BACKEND_BY_FILE"]

# Files whose presence in a version folder names the backend when a config names none.
BACKEND_BY_FILE = {
    "model.onnx": "onnxruntime",
    "model.py": "python",
    "model.pt": "pytorch",
    "model.pt2": "pytorch",
    "model.xml": "openvino",
    # The fil backend's default file names (model.txt, LightGBM's, is too common a name to guess from).
    "xgboost.json": "fil",
    "xgboost.ubj": "fil",
    "xgboost.model": "fil",
    "checkpoint.tl": "fil",
}


def guess_backend(model_path: Path, versions: list[int]) -> str:
    """The backend the newest version folder's files name, or "" when none does."""
    for version in reversed(versions):
        for filename, backend_name in BACKEND_BY_FILE.items():
            if (model_path / str(version) / filename).exists():
                return backend_name
    return ""
