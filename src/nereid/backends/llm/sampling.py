"""Per-request sampling parameters (vLLM's names and defaults) and the batched sampler that turns a step's
logits into next tokens. Parsing never touches torch; the sampler never sees requests or wire formats."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from nereid.core.errors import NereidError

if TYPE_CHECKING:
    import torch

__all__ = ["SamplingParams", "parse_sampling_params", "SamplerRow", "sample_rows"]


@dataclass(slots=True)
class SamplingParams:
    """What one request asks of generation. `max_tokens=None` means up to the context length."""

    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # number of top alternatives to report with each token's logprob
    skip_special_tokens: bool = True
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)  # OpenAI's: added to a token's logit, -100 to 100
    json_schema: str | None = None  # structured output asked in vLLM's words (guided_decoding / structured_outputs "json")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


_FLOAT = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
_INT = {"max_tokens", "min_tokens", "top_k", "seed", "logprobs", "n"}
_BOOL = {"include_stop_str_in_output", "ignore_eos", "skip_special_tokens"}
# Keys vLLM's SamplingParams knows that Nereid accepts and ignores, and keys that travel beside sampling
# parameters in Triton requests (request parameters double as sampling parameters in Triton's vLLM backend).
_IGNORED = {
    "best_of", "use_beam_search", "length_penalty", "early_stopping", "prompt_logprobs", "detokenize",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "output_kind", "bad_words", "allowed_token_ids",
    "logits_processors", "lora_name", "stream", "exclude_input_in_output",
}
# vLLM's structured-output keys (older and newer names); of their kinds, Nereid's engine follows "json".
_STRUCTURED = ("guided_decoding", "structured_outputs")
_KNOWN = {f.name for f in fields(SamplingParams)}


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"expected a boolean, got {value!r}")


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    return int(value)


def parse_sampling_params(values: dict[str, Any], where: str = "") -> SamplingParams:
    """Sampling parameters from a JSON object; strings are converted as Triton's vLLM backend converts them.
    Unknown keys are ignored (Triton request parameters travel in the same object); bad values are 400s."""
    params = SamplingParams()
    prefix = f"{where}: " if where else ""
    for key, value in values.items():
        if key == "max_tokens" and value is None:
            params.max_tokens = None  # as in vLLM: up to the context length
            continue
        if key in _STRUCTURED and value is not None:
            params.json_schema = _json_schema(value, key, prefix)
            continue
        if value is None or key not in _KNOWN:
            continue
        try:
            if key in _FLOAT:
                number = float(value)
                if not math.isfinite(number):
                    raise ValueError(f"expected a finite number, got {value!r}")
                setattr(params, key, number)
            elif key in _INT:
                setattr(params, key, _int(value))
            elif key in _BOOL:
                setattr(params, key, _bool(value))
            elif key == "stop":
                stops = [value] if isinstance(value, str) else list(value)
                if not all(isinstance(s, str) for s in stops):
                    raise ValueError("expected a string or a list of strings")
                params.stop = [s for s in stops if s]
            elif key == "stop_token_ids":
                params.stop_token_ids = [_int(v) for v in value]
            elif key == "logit_bias":
                params.logit_bias = _logit_bias(value)
        except (TypeError, ValueError) as exc:
            raise NereidError.invalid(f"{prefix}sampling parameter '{key}': {exc}") from None
    _check(params, prefix)
    return params


def _json_schema(value: Any, key: str, prefix: str) -> str | None:
    if not isinstance(value, dict):
        raise NereidError.invalid(f"{prefix}sampling parameter '{key}': expected an object such as {{\"json\": {{...schema...}}}}")
    kinds = {k for k, v in value.items() if v not in (None, False, "", [])}
    others = kinds - {"json", "json_object", "backend", "whitespace_pattern", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"}
    if others:
        raise NereidError.invalid(f"{prefix}sampling parameter '{key}': only 'json' (a JSON schema) and 'json_object' are supported, got {sorted(others)}")
    schema = value.get("json")
    if schema is None:
        return '{"type":"object"}' if value.get("json_object") else None
    return schema if isinstance(schema, str) else json.dumps(schema)


def _logit_bias(value: Any) -> dict[int, float]:
    if not isinstance(value, dict):
        raise ValueError("expected an object of token id -> bias")
    bias = {}
    for key, amount in value.items():
        try:
            token = int(key)
        except ValueError:
            raise ValueError(f"keys must be token ids, got {key!r}") from None
        number = float(amount)
        if token < 0 or not -100 <= number <= 100:
            raise ValueError(f"expected token ids >= 0 with biases between -100 and 100, got {key!r}: {amount!r}")
        bias[token] = number
    return bias


def _check(p: SamplingParams, prefix: str) -> None:
    problems = []
    if p.max_tokens is not None and p.max_tokens < 1:
        problems.append(f"'max_tokens' must be at least 1, got {p.max_tokens}")
    if p.min_tokens < 0 or (p.max_tokens is not None and p.min_tokens > p.max_tokens):
        problems.append(f"'min_tokens' must be between 0 and max_tokens ({p.max_tokens}), got {p.min_tokens}")
    if p.temperature < 0:
        problems.append(f"'temperature' must be non-negative, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        problems.append(f"'top_p' must be in (0, 1], got {p.top_p}")
    if p.top_k < -1:
        problems.append(f"'top_k' must be -1 (off), 0 (off) or positive, got {p.top_k}")
    if not 0 <= p.min_p <= 1:
        problems.append(f"'min_p' must be in [0, 1], got {p.min_p}")
    if p.repetition_penalty <= 0:
        problems.append(f"'repetition_penalty' must be positive, got {p.repetition_penalty}")
    if not -2 <= p.presence_penalty <= 2:
        problems.append(f"'presence_penalty' must be in [-2, 2], got {p.presence_penalty}")
    if not -2 <= p.frequency_penalty <= 2:
        problems.append(f"'frequency_penalty' must be in [-2, 2], got {p.frequency_penalty}")
    if p.logprobs is not None and not 0 <= p.logprobs <= 20:
        problems.append(f"'logprobs' must be between 0 and 20, got {p.logprobs}")
    if p.n != 1:
        problems.append(f"'n' must be 1 (one sequence per request), got {p.n}")
    if problems:
        raise NereidError.invalid(prefix + "; ".join(problems))


@dataclass(slots=True)
class SamplerRow:
    """One row of a step's logits: its parameters, the tokens it has produced (for penalties) and its RNG."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    block_ids: list[int]  # token ids that must not be produced now (EOS before min_tokens)
    constraint: Any = None  # structured output: .apply(logits_row) masks the tokens its grammar refuses


def sample_rows(logits: torch.Tensor, rows: list[SamplerRow]) -> tuple[list[int], list[tuple[float, list[tuple[int, float]]] | None]]:
    """Next token per row, and (logprob, top alternatives) for rows that asked for logprobs.

    Greedy rows without penalties take one argmax over the whole batch; other rows are processed per row
    or in vectorised groups. Logprobs are those of the model's distribution before temperature and top-k/p.
    """
    import torch

    n = len(rows)
    want_logprobs = [r.params.logprobs is not None for r in rows]
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
    special = [i for i, r in enumerate(rows) if r.params.penalised or r.params.logit_bias or r.block_ids or r.constraint is not None]
    if special:
        raw = logits
        logits = logits.clone()
        for i in special:
            _penalise(logits[i], rows[i])
            constraint = rows[i].constraint
            if constraint is not None:
                constraint.apply(logits[i])
                if torch.isinf(logits[i]).all():  # the grammar's only ways on were blocked (EOS before min_tokens)
                    logits[i] = raw[i]
                    constraint.apply(logits[i])
    greedy = [i for i in range(n) if rows[i].params.greedy]
    tokens = [0] * n
    if greedy:
        if len(greedy) == n:
            tokens = logits.argmax(dim=-1).tolist()
        else:
            index = torch.tensor(greedy)
            for i, t in zip(greedy, logits.index_select(0, index).argmax(dim=-1).tolist()):
                tokens[i] = t
    sampled = [i for i in range(n) if not rows[i].params.greedy]
    if sampled:
        index = torch.tensor(sampled)
        chosen = logits.index_select(0, index).float()
        temps = torch.tensor([rows[i].params.temperature for i in sampled], dtype=chosen.dtype).unsqueeze(1)
        chosen = chosen / temps
        chosen = _filter(chosen, [rows[i].params for i in sampled])
        probs = torch.softmax(chosen, dim=-1)
        unseeded = [j for j, i in enumerate(sampled) if rows[i].generator is None]
        if unseeded:
            picked = torch.multinomial(probs[unseeded], 1).squeeze(1).tolist()
            for j, t in zip(unseeded, picked):
                tokens[sampled[j]] = t
        for j, i in enumerate(sampled):
            generator = rows[i].generator
            if generator is not None:
                tokens[i] = int(torch.multinomial(probs[j], 1, generator=generator).item())
    logprob_out: list[tuple[float, list[tuple[int, float]]] | None] = [None] * n
    if raw_logprobs is not None:
        for i, row in enumerate(rows):
            k = row.params.logprobs
            if k is None:
                continue
            lp = raw_logprobs[i]
            top: list[tuple[int, float]] = []
            if k > 0:
                values, ids = lp.topk(k)
                top = list(zip(ids.tolist(), values.tolist()))
            logprob_out[i] = (float(lp[tokens[i]]), top)
    return tokens, logprob_out


def _penalise(row_logits: torch.Tensor, row: SamplerRow) -> None:
    import torch

    p = row.params
    vocab = row_logits.shape[0]
    if p.penalised:
        out = torch.tensor(row.output_ids, dtype=torch.long) if row.output_ids else None
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(row.prompt_ids + row.output_ids, dtype=torch.long).unique()
            seen = seen[(seen >= 0) & (seen < vocab)]
            values = row_logits[seen]
            row_logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if out is not None and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(out.clamp(0, vocab - 1), minlength=vocab).to(row_logits.dtype)
            row_logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row_logits.dtype)
    if p.logit_bias:
        tokens = [t for t in p.logit_bias if t < vocab]
        if tokens:
            row_logits[tokens] += torch.tensor([p.logit_bias[t] for t in tokens], dtype=row_logits.dtype)
    if row.block_ids:
        ids = [t for t in row.block_ids if 0 <= t < vocab]
        row_logits[ids] = float("-inf")


def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """top-k, top-p and min-p as masks to -inf, vectorised over the rows."""
    import torch

    vocab = logits.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    ps = [p.top_p for p in params]
    mins = [p.min_p for p in params]
    if all(k == vocab for k in ks) and all(p >= 1.0 for p in ps) and all(m == 0 for m in mins):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab).unsqueeze(0)
    remove = ranks >= torch.tensor(ks).unsqueeze(1)
    probs = torch.softmax(sorted_logits, dim=-1)
    if any(p < 1.0 for p in ps):
        cumulative = probs.cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token that crosses it stays).
        remove |= (cumulative - probs) >= torch.tensor(ps, dtype=probs.dtype).unsqueeze(1)
    if any(m > 0 for m in mins):
        remove |= probs < probs[:, :1] * torch.tensor(mins, dtype=probs.dtype).unsqueeze(1)
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
