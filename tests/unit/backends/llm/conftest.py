"""The tiny random-weight model the engine tests run, and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nereid.backends.llm.tiny_model import cached_tiny_model


@pytest.fixture(scope="module")
def folder() -> Path:
    return cached_tiny_model()


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
