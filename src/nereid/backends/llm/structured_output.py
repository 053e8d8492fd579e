"""Grammar-constrained decoding (JSON schema) with llguidance: a per-job constraint whose allowed-token mask the
sampler applies to that job's logits row, and which the engine advances with each accepted token.

llguidance was chosen over xgrammar by measurement and install weight (docs/llm.md, benchmarks/results/
structured_output.md). This module knows tokens and schemas, never requests or wire formats.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from nereid.core.errors import NereidError

if TYPE_CHECKING:
    import torch

__all__ = ["GrammarCompiler", "JsonConstraint"]

log = logging.getLogger("nereid.llm")

# Compact separators keep the random and real models alike from spending tokens on layout; whitespace between
# tokens is not free-form, so a constrained model cannot loop on blank space until max_tokens.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class JsonConstraint:
    """One job's grammar state. `apply` masks a logits row in place; `advance` consumes the sampled token and
    says whether the grammar is complete (the job then finishes with `stop`)."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def apply(self, row: torch.Tensor) -> None:
        import torch

        # One bit per token, little-endian words. (llguidance.torch's helpers do the same but take ~3 s to import,
        # scripting kernels, which would stall the engine thread on the first constrained step.)
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        if self._matcher.is_error():
            return  # the sampled token is then refused by advance(), which ends the job
        width = row.shape[-1]
        allowed = torch.zeros(width, dtype=torch.bool)
        n = min(width, bits.shape[0])
        allowed[:n] = torch.from_numpy(bits[:n].astype(np.bool_))
        row.masked_fill_(~allowed, float("-inf"))

    def advance(self, token: int) -> bool:
        """Consume `token`; True when nothing more may follow (the output is complete). A token the grammar
        refuses (only possible if the mask was not applied) ends the job too, rather than the engine step."""
        matcher = self._matcher
        if not matcher.consume_token(token) or matcher.is_error():
            log.warning("structured output: token %d broke the grammar: %s", token, matcher.get_error())
            return True
        return bool(matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._matcher.is_accepting())


class GrammarCompiler:
    """Per model instance: llguidance's view of the tokenizer (built on first use) and compiled grammars by schema."""

    def __init__(self, hf_tokenizer: Any, vocab: int, eos_ids: list[int]) -> None:
        self._hf = hf_tokenizer
        self._vocab = vocab
        self._eos = eos_ids
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _lltokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError:
                    raise NereidError.unavailable("structured output needs llguidance (pip install 'nereid[llm]')") from None
                eos = self._eos[0] if len(self._eos) == 1 else (self._eos or None)
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self._vocab, eos_token=eos)
            return self._tokenizer

    def json_schema(self, schema: dict[str, Any] | str) -> JsonConstraint:
        """A fresh constraint for one job. A schema llguidance cannot compile is the client's error (400)."""
        tokenizer = self._lltokenizer()  # first: it says so when llguidance is missing
        import llguidance

        text = schema if isinstance(schema, str) else orjson.dumps(schema).decode()
        matcher = llguidance.LLMatcher(tokenizer, _grammar(text), log_level=0)
        if matcher.is_error():
            raise NereidError.invalid(f"the JSON schema cannot be used for structured output: {matcher.get_error()}")
        return JsonConstraint(matcher)


@functools.lru_cache(maxsize=256)
def _grammar(schema_text: str) -> str:
    import llguidance

    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema_text, defaults=_JSON_OPTIONS))  # type: ignore[arg-type]
    except ValueError as exc:
        raise NereidError.invalid(f"the JSON schema is not valid: {exc}") from None
