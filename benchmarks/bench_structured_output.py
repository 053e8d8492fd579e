"""Per-token cost of grammar-constrained decoding on the tiny model's vocabulary: xgrammar against llguidance,
same JSON schema, same token sequence (one a random model might produce, driven by each library's own mask).

    PYTHONPATH=src python -m benchmarks.bench_structured_output

Prints compile time, the mean and p95 time to fill one row's allowed-token bitmask, and to advance the matcher
by one token; "nereid+llg" is what the engine pays per row (Nereid's constraint: llguidance's mask unpacked and
applied to a logits row). Either library may be missing; its rows are then left out (xgrammar is not a
dependency: install it aside, `pip install --no-deps --target DIR xgrammar apache-tvm-ffi`, and add DIR to
PYTHONPATH).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any

from nereid.backends.llm.tiny_model import cached_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["city", "days", "units"],
    "additionalProperties": False,
}
RUNS = 20
MAX_TOKENS = 120


def _p95(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.95) - 1]


def _bench(name: str, setup: Any) -> dict[str, Any]:
    compile_s, fill, advance, tokens = [], [], [], 0
    for run in range(RUNS):
        rng = random.Random(run)
        start = time.perf_counter()
        matcher, fill_mask, allowed, consume, done = setup()
        compile_s.append(time.perf_counter() - start)
        for _ in range(MAX_TOKENS):
            start = time.perf_counter()
            fill_mask()
            fill.append(time.perf_counter() - start)
            choices = allowed()
            token = rng.choice(choices)
            start = time.perf_counter()
            consume(token)
            advance.append(time.perf_counter() - start)
            tokens += 1
            if done():
                break
    return {
        "library": name,
        "compile_ms": statistics.mean(compile_s) * 1e3,
        "mask_us": statistics.mean(fill) * 1e6,
        "mask_p95_us": _p95(fill) * 1e6,
        "advance_us": statistics.mean(advance) * 1e6,
        "tokens": tokens,
    }


def _llguidance(tokenizer: Any) -> Any:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    lltok = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    vocab = lltok.vocab_size

    def setup() -> Any:
        matcher = llguidance.LLMatcher(lltok, grammar)
        bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

        def fill() -> None:
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

        def allowed() -> list[int]:
            bits = bitmask[0].numpy().view("uint32")
            return [t for t in range(vocab) if bits[t >> 5] >> (t & 31) & 1]

        return matcher, fill, allowed, matcher.consume_token, matcher.is_stopped

    return setup


def _xgrammar(tokenizer: Any) -> Any:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info)
    vocab = info.vocab_size

    def setup() -> Any:
        compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab)

        def fill() -> None:
            matcher.fill_next_token_bitmask(bitmask, 0)

        def allowed() -> list[int]:
            bits = bitmask[0].numpy().view("uint32")
            return [t for t in range(vocab) if bits[t >> 5] >> (t & 31) & 1]

        return matcher, fill, allowed, matcher.accept_token, matcher.is_terminated

    return setup


def _nereid(tokenizer: Any) -> Any:
    """What the engine pays per row: Nereid's constraint (llguidance's mask, unpacked and applied to a logits row)."""
    import torch

    from nereid.backends.llm.structured_output import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    row = torch.zeros(len(tokenizer))

    def setup() -> Any:
        constraint = compiler.json_schema(SCHEMA)

        def fill() -> None:
            row.zero_()
            constraint.apply(row)

        def allowed() -> list[int]:
            return [int(t) for t in torch.isfinite(row).nonzero().flatten()]

        state = {"done": False}

        def consume(token: int) -> None:
            state["done"] = constraint.advance(token)

        return constraint, fill, allowed, consume, lambda: state["done"]

    return setup


def main() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(cached_tiny_model()))
    rows = []
    for name, factory in (("llguidance", _llguidance), ("xgrammar", _xgrammar), ("nereid+llg", _nereid)):
        try:
            setup = factory(tokenizer)
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        rows.append(_bench(name, setup))
    print(f"vocab {len(tokenizer)} tokens, {RUNS} runs, random allowed tokens, up to {MAX_TOKENS} tokens each")
    print(f"{'library':<12} {'compile ms':>10} {'mask us':>9} {'mask p95':>9} {'advance us':>10} {'tokens':>7}")
    for r in rows:
        print(f"{r['library']:<12} {r['compile_ms']:>10.2f} {r['mask_us']:>9.1f} {r['mask_p95_us']:>9.1f} {r['advance_us']:>10.1f} {r['tokens']:>7}")


if __name__ == "__main__":
    main()
