"""Loading a Hugging Face tokenizer from a model folder, safely from several loading threads at once.

transformers resolves its top-level names lazily, and two threads resolving the same name at the same moment can
find it missing ("cannot import name 'AutoTokenizer' from 'transformers'"): two versions of one LLM loading side by
side (`version_policy { all { } }`, a rollout's candidate beside its primary) failed that way."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["load_tokenizer"]

_IMPORT_LOCK = threading.Lock()


def load_tokenizer(path: str) -> Any:
    with _IMPORT_LOCK:
        from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
