"""Real Triton's side of the benchmarks that serve ONNX models: its ONNX Runtime backend does not ship on PyPI, so
the session runs in a Python-backend model (onnx_model.py, copied as model.py), with the packages that model needs
installed into the reference Triton's venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests import reference_triton

HERE = Path(__file__).parent


def ensure_packages(*distributions: str, imports: str) -> None:
    """`distributions`, at this venv's versions, in the reference Triton's venv unless `imports` already imports."""
    python = reference_triton.install().python
    if subprocess.run([str(python), "-c", f"import {imports}"], capture_output=True).returncode != 0:
        print("installing", ", ".join(distributions), "into", python.parent.parent, file=sys.stderr)
        pinned = [f"{name}=={version(name)}" for name in distributions]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pinned], check=True)


def place_jpeg_model(version_folder: Path) -> None:
    """The JPEG-decoding Python model (jpeg_model.py) and the imaging module it calls, into a model's version folder."""
    shutil.copy(HERE / "jpeg_model.py", version_folder / "model.py")
    shutil.copy(HERE.parent / "image_api" / "imaging.py", version_folder / "imaging.py")
