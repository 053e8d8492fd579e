"""model.json's paged-KV-cache and waiting-queue arguments: defaults, what reaches vLLM and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nereid.backends.llm.engine_args import EngineArgs, read_engine_args, vllm_engine_kwargs
from nereid.core.errors import NereidError


def _args(tmp_path: Path, values: dict[str, object]) -> EngineArgs:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.json").write_text(json.dumps({"model": ".", **values}))
    return read_engine_args("m", tmp_path / "m", version)


def test_llm_engine_args_kv_pool_and_queue_defaults(tmp_path: Path) -> None:
    args = _args(tmp_path, {})
    assert args.max_num_seqs == 256 and args.block_size == 16 and args.enable_prefix_caching
    assert args.kv_cache_memory_bytes is None and args.num_gpu_blocks_override is None and args.kv_cache_memory_fraction is None
    assert args.max_num_queued_reqs == 4096 and args.max_num_queued_tokens == 2_097_152


def test_llm_engine_args_kv_pool_and_queue_flags_are_read_and_only_vllms_own_reach_vllm(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        {
            "block_size": 32, "kv_cache_memory_bytes": 1 << 30, "num_gpu_blocks_override": 100, "enable_prefix_caching": False,
            "kv_cache_memory_fraction": 0.5, "max_num_queued_reqs": 10, "max_num_queued_tokens": 1000,
        },
    )
    assert (args.block_size, args.kv_cache_memory_bytes, args.num_gpu_blocks_override) == (32, 1 << 30, 100)
    assert not args.enable_prefix_caching and args.kv_cache_memory_fraction == 0.5
    assert (args.max_num_queued_reqs, args.max_num_queued_tokens) == (10, 1000)
    kwargs = vllm_engine_kwargs(args)
    assert kwargs["block_size"] == 32 and kwargs["enable_prefix_caching"] is False and kwargs["kv_cache_memory_bytes"] == 1 << 30
    for key in ("kv_cache_memory_fraction", "max_num_queued_reqs", "max_num_queued_tokens"):
        assert key not in kwargs  # Nereid's own: vLLM would refuse them


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"kv_cache_memory_fraction": 1.5}, "kv_cache_memory_fraction"),
        ({"kv_cache_memory_fraction": "lots"}, "kv_cache_memory_fraction"),
        ({"enable_prefix_caching": "maybe"}, "enable_prefix_caching"),
        ({"block_size": 0}, "block_size"),
        ({"max_num_queued_reqs": -1}, "max_num_queued_reqs"),
    ],
)
def test_llm_engine_args_bad_kv_or_queue_values_fail_with_the_key_named(tmp_path: Path, values: dict[str, object], named: str) -> None:
    with pytest.raises(NereidError) as info:
        _args(tmp_path, values)
    assert named in info.value.message
