"""`model.json`: the engine arguments of Triton's vLLM backend (vLLM's AsyncEngineArgs names), read into one
object that chooses the engine and the limits. No torch here: config handling is testable anywhere."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["EngineArgs", "read_engine_args", "MODEL_JSON", "vllm_engine_kwargs"]

MODEL_JSON = "model.json"
_ENGINES = ("auto", "nereid", "vllm")
# Keys Nereid's engine reads; everything else in model.json is vLLM's and only the vLLM engine uses it.
_NEREID_KEYS = {
    "model", "tokenizer", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "engine", "cpu_threads", "seed",
    "max_prefill_tokens_while_decoding", "tool_call_parser", "block_size", "kv_cache_memory_bytes",
    "kv_cache_memory_fraction", "num_gpu_blocks_override", "enable_prefix_caching", "max_num_queued_reqs",
    "max_num_queued_tokens",
}
# Keys only Nereid's engine knows: never passed to vLLM.
_NEREID_ONLY = (
    "engine", "cpu_threads", "max_prefill_tokens_while_decoding", "tool_call_parser", "kv_cache_memory_fraction",
    "max_num_queued_reqs", "max_num_queued_tokens",
)
# Keys where 0 is meaningful (torch's default thread count; no prefill cap).
_ZERO_OK = ("cpu_threads", "max_prefill_tokens_while_decoding")


@dataclass(slots=True)
class EngineArgs:
    model_path: Path
    tokenizer_path: Path
    engine: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    cpu_threads: int = 0
    max_prefill_tokens_while_decoding: int = 32
    # The paged KV cache: tokens per block, and the pool's size as a block count, bytes or a share of the
    # machine's memory (the first one given wins, in that order). None of them: room for max_num_seqs sequences
    # of max_model_len tokens, at most a tenth of the memory.
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_memory_fraction: float | None = None
    enable_prefix_caching: bool = True
    # The waiting queue's bound: past it a request is refused at once (HTTP 429 / UNAVAILABLE).
    max_num_queued_reqs: int = 4096
    max_num_queued_tokens: int = 2_097_152
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    tool_call_parser: str | None = None  # how tool calls are read from the output (vLLM's --tool-call-parser names)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def _find(model_path: Path, version_path: Path) -> Path:
    """Triton's vLLM backend reads model.json from the version folder; next to config.pbtxt works too."""
    for folder in (version_path, model_path):
        if (folder / MODEL_JSON).is_file():
            return folder / MODEL_JSON
    raise NereidError.unavailable(
        f"'{MODEL_JSON}' containing the engine arguments must be provided in '{version_path}' (or next to config.pbtxt)"
    )


def _local_path(value: Any, key: str, version_path: Path, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise NereidError.invalid(f"{where}: '{key}' must be a path, got {value!r}")
    path = Path(value)
    candidates = [path] if path.is_absolute() else [version_path / path, version_path.parent / path]
    for candidate in candidates:
        if candidate.exists():
            return candidate.resolve()
    raise NereidError.unavailable(
        f"{where}: '{key}' is '{value}', which is not a local folder (looked in {', '.join(str(c) for c in candidates)}); "
        f"Nereid never downloads from a model hub: put the Hugging Face files (config.json, safetensors, tokenizer) "
        f"in the model version folder or give a local path"
    )


def _positive(raw: dict[str, Any], key: str, where: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise NereidError.invalid(f"{where}: '{key}' must be a positive integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise NereidError.invalid(f"{where}: '{key}' must be a positive integer, got {value!r}") from None
    if number < 1 and not (key in _ZERO_OK and number == 0):
        raise NereidError.invalid(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return number


def _fraction(raw: dict[str, Any], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not 0.0 < number <= 1.0:
        raise NereidError.invalid(f"{where}: '{key}' must be a number in (0, 1], got {value!r}")
    return number


def _flag(raw: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = raw.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise NereidError.invalid(f"{where}: '{key}' must be true or false, got {value!r}")


def read_engine_args(model_name: str, model_path: Path, version_path: Path, kind: str = "MODEL") -> EngineArgs:
    path = _find(model_path, version_path)
    where = f"model '{model_name}' {path.relative_to(model_path.parent) if path.is_relative_to(model_path.parent) else path}"
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise NereidError.invalid(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise NereidError.invalid(f"{where}: expected a JSON object of engine arguments")
    model = _local_path(raw.get("model", "."), "model", version_path, where)
    tokenizer = _local_path(raw["tokenizer"], "tokenizer", version_path, where) if raw.get("tokenizer") else model
    engine = str(raw.get("engine", "auto"))
    if engine not in _ENGINES:
        raise NereidError.invalid(f"{where}: 'engine' must be one of {', '.join(_ENGINES)}, got '{engine}'")
    args = EngineArgs(
        model_path=model,
        tokenizer_path=tokenizer,
        engine=engine,
        dtype=str(raw.get("dtype", "auto")),
        max_model_len=_positive(raw, "max_model_len", where, None),
        max_num_seqs=_positive(raw, "max_num_seqs", where, 256) or 256,
        max_num_batched_tokens=_positive(raw, "max_num_batched_tokens", where, None),
        cpu_threads=_positive(raw, "cpu_threads", where, 0) or 0,
        max_prefill_tokens_while_decoding=_positive(raw, "max_prefill_tokens_while_decoding", where, 32) or 0,
        block_size=_positive(raw, "block_size", where, 16) or 16,
        num_gpu_blocks_override=_positive(raw, "num_gpu_blocks_override", where, None),
        kv_cache_memory_bytes=_positive(raw, "kv_cache_memory_bytes", where, None),
        kv_cache_memory_fraction=_fraction(raw, "kv_cache_memory_fraction", where),
        enable_prefix_caching=_flag(raw, "enable_prefix_caching", where, True),
        max_num_queued_reqs=_positive(raw, "max_num_queued_reqs", where, 4096) or 4096,
        max_num_queued_tokens=_positive(raw, "max_num_queued_tokens", where, 2_097_152) or 2_097_152,
        tensor_parallel_size=_positive(raw, "tensor_parallel_size", where, 1) or 1,
        pipeline_parallel_size=_positive(raw, "pipeline_parallel_size", where, 1) or 1,
        tool_call_parser=_tool_call_parser(raw, where),
        raw=raw,
    )
    if kind == "GPU" and args.world_size > 1:
        # As Triton's vLLM backend: KIND_GPU means one GPU per instance.
        raise NereidError.invalid(
            f"{where}: KIND_GPU is for single-GPU models; tensor_parallel_size x pipeline_parallel_size is "
            f"{args.world_size}: use KIND_MODEL for multi-GPU models"
        )
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < args.max_num_seqs:
        raise NereidError.invalid(
            f"{where}: 'max_num_batched_tokens' ({args.max_num_batched_tokens}) must be at least 'max_num_seqs' "
            f"({args.max_num_seqs}), so that every running sequence gets its token each step"
        )
    return args


def _tool_call_parser(raw: dict[str, Any], where: str) -> str | None:
    from nereid.backends.llm.tool_parsers import PARSERS

    value = raw.get("tool_call_parser")
    if value is None:
        return None
    if value not in PARSERS:
        raise NereidError.invalid(f"{where}: 'tool_call_parser' must be one of {', '.join(sorted(PARSERS))}, got {value!r}")
    return str(value)


def vllm_engine_kwargs(args: EngineArgs) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments: model.json as it is, with local paths resolved and Nereid's own
    keys removed. Multi-GPU (tensor/pipeline parallel) and multi-node (distributed_executor_backend "ray")
    settings pass through untouched: vLLM's Ray integration does the rest."""
    kwargs = {k: v for k, v in args.raw.items() if k not in _NEREID_ONLY}
    kwargs["model"] = str(args.model_path)
    kwargs["tokenizer"] = str(args.tokenizer_path)
    return kwargs


def nereid_only_keys() -> set[str]:
    return set(_NEREID_KEYS)
