"""Tokenizers load from several threads at once: two versions of one LLM load side by side (a rollout's candidate
beside its primary), and transformers' lazy names, resolved by two threads at the same moment, went missing."""

from __future__ import annotations

import subprocess
import sys

from nereid.backends.llm.tiny_model import cached_tiny_model

_THREADS = """
import sys, threading
from nereid.backends.llm.tokenizer_loading import load_tokenizer
failures = []
def load():
    try:
        load_tokenizer(sys.argv[1])
    except Exception as exc:
        failures.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(failures)
"""


def test_four_threads_load_a_tokenizer_at_once_in_a_fresh_process() -> None:
    model = cached_tiny_model()
    # A fresh interpreter: the race is in the first import (without the lock, 3 of 4 threads failed there, every run).
    ran = subprocess.run([sys.executable, "-c", _THREADS, str(model)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
