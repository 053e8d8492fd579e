"""Naming the backend of a model whose config names none, from the files in its version folders (each
backend's model files, as the backend registry declares them). It only looks at file names; it never imports
a backend."""

from __future__ import annotations

from pathlib import Path

from nereid.core.backend_registry import BACKEND_BY_FILE

__all__ = ["guess_backend"]


def guess_backend(model_path: Path, versions: list[int]) -> str:
    """The backend the newest version folder's files name, or "" when none does."""
    for version in reversed(versions):
        for filename, backend_name in BACKEND_BY_FILE.items():
            if (model_path / str(version) / filename).exists():
                return backend_name
    return ""
