"""The forward pass of a Llama-family decoder (Llama, Mistral, Qwen2) read straight from a Hugging Face
folder's safetensors, over a paged KV cache (fixed-size blocks that the engine assigns), for a ragged step of decode tokens and prefill chunks.

It knows nothing of requests, sampling or scheduling: the engine says which tokens go to which cache rows at
which position and which blocks each sequence reads, and gets back the logits of the rows it asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nereid.core.errors import NereidError

__all__ = ["LlamaModel", "StepBatch", "DecodeGroup", "SUPPORTED_ARCHITECTURES", "load_config"]

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def load_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise NereidError.unavailable(f"the model folder '{folder}' has no config.json (a Hugging Face model folder is expected)") from None
    except ValueError as exc:
        raise NereidError.unavailable(f"'{path}' is not valid JSON: {exc}") from None
    return config


def _rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise NereidError.unsupported(f"RoPE scaling '{kind}' is not supported by Nereid's engine")
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise NereidError.unavailable(f"the model folder '{folder}' has no safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(str(folder / name)))
    return weights


@dataclass(slots=True)
class _Block:
    """One decoder layer's weights, with q/k/v and gate/up fused into single matrices."""

    ln1: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(slots=True)
class DecodeGroup:
    """Consecutive decode rows [first, end) read together: the blocks they all start with (`shared`, a cached
    prompt prefix wholly before each row's current position; may be empty), read once for the whole group, and
    each row's own blocks after them (`tables` [rows, width] int64, padded with any valid block). Rows of unlike
    lengths go to different groups, so a long row does not widen the gather of every short one."""

    first: int
    end: int
    shared: torch.Tensor  # [S] int64
    tables: torch.Tensor  # [end - first, width] int64


@dataclass(slots=True)
class StepBatch:
    """One engine step over the paged KV cache. Decode rows come first, one token each, in `decode_groups`
    that cover them in order; then prefill chunks. Each row's keys and values go to cache position
    `slot_mapping` (block * block_size + offset); each sequence reads its past through its blocks."""

    tokens: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: where each row's keys and values are written
    n_decode: int
    decode_lengths: torch.Tensor  # [n_decode] cache length of each decode row after this step
    decode_groups: list[DecodeGroup]
    prefills: list[tuple[torch.Tensor, int, int]]  # (block table [blocks] int64, start position, length)
    logit_rows: torch.Tensor  # [R] rows of `tokens` whose next-token logits are wanted


class LlamaModel:
    """Weights in fused matrices (qkv, gate+up) and a paged KV cache [layers, 2, kv_heads, blocks, block_size,
    head_dim]: position p of block b is row b * block_size + p of each kv head, so a write is one index_put per
    layer and a gather of whole blocks is already in the [kv_heads, sequences, positions, head_dim] order that
    attention wants."""

    def __init__(self, folder: Path, dtype: str = "auto", device: str = "cpu") -> None:
        config = load_config(folder)
        archs = config.get("architectures") or []
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise NereidError.unsupported(
                f"architecture {archs} is not supported by Nereid's engine (supported: {sorted(SUPPORTED_ARCHITECTURES)})"
            )
        self.config = config
        self.device = torch.device(device)
        if dtype in ("auto", "", None):
            # On the CPU, float32 keeps the logits equal to transformers'. bfloat16 is faster where the CPU has
            # AVX512-BF16 or AMX (a 32-row step ~1.6x here), but it must be asked for in model.json.
            self.dtype = torch.float32 if self.device.type == "cpu" else _DTYPES.get(str(config.get("torch_dtype") or config.get("dtype")), torch.bfloat16)
        elif dtype in _DTYPES:
            self.dtype = _DTYPES[dtype]
        else:
            raise NereidError.invalid(f"model.json 'dtype' must be one of auto, {', '.join(sorted(_DTYPES))}; got '{dtype}'")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.layers = int(config["num_hidden_layers"])
        self.vocab = int(config["vocab_size"])
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.max_positions = int(config.get("max_position_embeddings", 2048))
        if config.get("hidden_act", "silu") != "silu":
            raise NereidError.unsupported(f"activation '{config.get('hidden_act')}' is not supported by Nereid's engine")
        self._load(folder)
        theta = _rope_theta(config)
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        angles = torch.outer(torch.arange(self.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self._cos = angles.cos().to(self.dtype).to(self.device)
        self._sin = angles.sin().to(self.dtype).to(self.device)
        self.cache: torch.Tensor | None = None
        self.block_size = 16
        self._zeroed_blocks = 0
        self._gather = torch.empty(0, dtype=self.dtype, device=self.device)
        self.scale = self.head_dim**-0.5

    def _load(self, folder: Path) -> None:
        w = _read_weights(folder)
        dev, dt = self.device, self.dtype

        def take(name: str) -> torch.Tensor:
            try:
                return w.pop(name).to(device=dev, dtype=dt)
            except KeyError:
                raise NereidError.unavailable(f"the weights in '{folder}' have no tensor '{name}'") from None

        self.embed = take("model.embed_tokens.weight")
        self.norm = take("model.norm.weight")
        self.lm_head = take("lm_head.weight") if "lm_head.weight" in w else self.embed
        self.blocks: list[_Block] = []
        for i in range(self.layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([take(p + "self_attn.q_proj.weight"), take(p + "self_attn.k_proj.weight"), take(p + "self_attn.v_proj.weight")])
            bias = None
            if p + "self_attn.q_proj.bias" in w:
                bias = torch.cat([take(p + "self_attn.q_proj.bias"), take(p + "self_attn.k_proj.bias"), take(p + "self_attn.v_proj.bias")])
            self.blocks.append(
                _Block(
                    ln1=take(p + "input_layernorm.weight"),
                    qkv=qkv.contiguous(),
                    qkv_bias=bias,
                    o=take(p + "self_attn.o_proj.weight"),
                    ln2=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]).contiguous(),
                    down=take(p + "mlp.down_proj.weight"),
                )
            )

    # -- the KV cache ----------------------------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        """What one token position costs in the cache across all layers (keys and values)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()

    def allocate_cache(self, num_blocks: int, block_size: int) -> None:
        # torch.empty maps memory lazily: only the blocks sequences actually reach are touched.
        self.block_size = block_size
        self._zeroed_blocks = 0
        self.cache = torch.empty(
            (self.layers, 2, self.kv_heads, num_blocks, block_size, self.head_dim), dtype=self.dtype, device=self.device
        )

    def zero_blocks_below(self, high_water: int) -> None:
        """Zero the blocks up to `high_water` that were never used: attention reads (masked) positions past a
        row's own length, which must hold finite numbers, not whatever the allocator left there."""
        if self.cache is not None and high_water > self._zeroed_blocks:
            self.cache[:, :, :, self._zeroed_blocks : high_water].zero_()
            self._zeroed_blocks = high_water

    def _gather_buffers(self, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two reused buffers of `blocks` KV blocks for the decode rows' gathered keys and values. Reused
        because a fresh multi-megabyte tensor per layer is fresh pages from the OS each time (page faults cost
        as much as the copy itself here)."""
        size = self.kv_heads * blocks * self.block_size * self.head_dim
        if self._gather.numel() < 2 * size:
            self._gather = torch.empty(2 * size + size // 2, dtype=self.dtype, device=self.device)  # room to grow
        shape = (self.kv_heads, blocks, self.block_size, self.head_dim)
        return self._gather[:size].view(shape), self._gather[size : 2 * size].view(shape)

    def _decode_attention(
        self, qd: torch.Tensor, scores: torch.Tensor, vd: torch.Tensor, layer_k: torch.Tensor, layer_v: torch.Tensor,
        shared: torch.Tensor,
    ) -> torch.Tensor:
        """Decode attention [kvh, rows, group, hd] of one group from each row's own (masked) `scores` and values,
        plus the group's `shared` blocks read once: every row meets them in one matmul and the two softmax parts
        merge exactly through their maxima and sums (cascade attention)."""
        if not shared.shape[0]:
            return torch.matmul(torch.softmax(scores, dim=-1), vd)
        kvh, rows, group, hd = qd.shape
        top = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores.sub_(top))
        total = weights.sum(-1, keepdim=True)
        out = torch.matmul(weights, vd)
        ks = layer_k.index_select(1, shared).view(kvh, -1, hd)  # [kvh, S, hd]
        vs = layer_v.index_select(1, shared).view(kvh, -1, hd)
        part = torch.matmul(qd.reshape(kvh, rows * group, hd), ks.transpose(-1, -2)).mul_(self.scale)
        part = part.view(kvh, rows, group, -1)
        new_top = torch.maximum(top, part.amax(-1, keepdim=True))
        keep = torch.exp(top.sub_(new_top))  # rescales what the rows' own blocks gave
        shared_weights = torch.exp(part.sub_(new_top))
        total = total.mul_(keep).add_(shared_weights.sum(-1, keepdim=True))
        out = out.mul_(keep).add_(torch.matmul(shared_weights.view(kvh, rows * group, -1), vs).view(kvh, rows, group, hd))
        return out.div_(total)

    # -- the forward pass ------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, step: StepBatch) -> torch.Tensor:
        """Write the step's keys and values into the cache and return logits [R, vocab] (float32)."""
        assert self.cache is not None
        cache = self.cache
        bs = self.block_size
        heads, kvh, hd = self.heads, self.kv_heads, self.head_dim
        group = heads // kvh
        T = step.tokens.shape[0]
        nd = step.n_decode
        x = F.embedding(step.tokens, self.embed)
        cos = self._cos[step.positions].unsqueeze(1)
        sin = self._sin[step.positions].unsqueeze(1)
        # Every decode row reads its own blocks (those after its group's shared ones, padded to the group's
        # widest); positions past its length are masked out. One mask per group, for all layers.
        decode_masks = []
        for g in step.decode_groups:
            width = g.tables.shape[1] * bs
            positions = torch.arange(width, device=self.device).unsqueeze(0) + g.shared.shape[0] * bs
            allowed = positions < step.decode_lengths[g.first : g.end].unsqueeze(1)
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill_(~allowed, float("-inf"))
            decode_masks.append(mask.view(1, g.end - g.first, 1, width))
        if nd:  # room for the widest group first, so that every group's buffers are views of one allocation
            self._gather_buffers(max(g.tables.numel() for g in step.decode_groups))
        gathers = [self._gather_buffers(g.tables.numel()) for g in step.decode_groups]
        prefill_masks = []
        for _table, start, length in step.prefills:
            rows = torch.arange(length, device=self.device).unsqueeze(1) + start
            cols = torch.arange(start + length, device=self.device).unsqueeze(0)
            prefill_masks.append(cols <= rows)
        q_size, kv_size = heads * hd, kvh * hd
        slot_mapping = step.slot_mapping
        n_rows = cache.shape[3] * bs
        for index, block in enumerate(self.blocks):
            h = F.rms_norm(x, (self.hidden,), block.ln1, self.eps)
            qkv = F.linear(h, block.qkv, block.qkv_bias)
            q = self._rope(qkv[:, :q_size].view(T, heads, hd), cos, sin)
            k = self._rope(qkv[:, q_size : q_size + kv_size].view(T, kvh, hd), cos, sin)
            v = qkv[:, q_size + kv_size :].view(T, kvh, hd)
            layer_k = cache[index, 0]  # [kvh, blocks, block_size, hd]
            layer_v = cache[index, 1]
            layer_k.view(kvh, n_rows, hd)[:, slot_mapping] = k.transpose(0, 1)
            layer_v.view(kvh, n_rows, hd)[:, slot_mapping] = v.transpose(0, 1)
            parts = []
            if nd:
                qd_all = q[:nd].view(nd, kvh, group, hd).transpose(0, 1)  # [kvh, nd, group, hd]
                for g, mask, (gather_k, gather_v) in zip(step.decode_groups, decode_masks, gathers):
                    # One gather of whole blocks gives [kvh, rows, L, hd] with no further copy (kv heads
                    # outermost), so each kv head's rows are one batched matmul against their own blocks.
                    # (index_select copies whole blocks at memcpy speed; advanced indexing was ~6x slower here.)
                    flat = g.tables.reshape(-1)
                    rows = g.end - g.first
                    kd = torch.index_select(layer_k, 1, flat, out=gather_k).view(kvh, rows, -1, hd)
                    vd = torch.index_select(layer_v, 1, flat, out=gather_v).view(kvh, rows, -1, hd)
                    qd = qd_all[:, g.first : g.end]
                    scores = torch.matmul(qd, kd.transpose(-1, -2)).mul_(self.scale).add_(mask)
                    out = self._decode_attention(qd, scores, vd, layer_k, layer_v, g.shared)  # [kvh, rows, group, hd]
                    parts.append(out.transpose(0, 1).reshape(rows, heads * hd))
            offset = nd
            for (table, start, length), mask in zip(step.prefills, prefill_masks):
                qp = q[offset : offset + length].transpose(0, 1).unsqueeze(0)
                if start == 0:
                    # A chunk that starts a sequence attends to its own keys only: no need to read them back.
                    kp = k[offset : offset + length].transpose(0, 1).unsqueeze(0)
                    vp = v[offset : offset + length].transpose(0, 1).unsqueeze(0)
                else:
                    kp = layer_k.index_select(1, table).view(kvh, -1, hd)[:, : start + length].unsqueeze(0)
                    vp = layer_v.index_select(1, table).view(kvh, -1, hd)[:, : start + length].unsqueeze(0)
                out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=self.scale, enable_gqa=group > 1)
                parts.append(out.squeeze(0).transpose(0, 1).reshape(length, heads * hd))
                offset += length
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = x + F.linear(attn, block.o)
            h = F.rms_norm(x, (self.hidden,), block.ln2, self.eps)
            gate_up = F.linear(h, block.gate_up)
            half = gate_up.shape[-1] // 2
            x = x + F.linear(F.silu(gate_up[:, :half]) * gate_up[:, half:], block.down)
        rows = x.index_select(0, step.logit_rows) if step.logit_rows.shape[0] != T else x
        rows = F.rms_norm(rows, (self.hidden,), self.norm, self.eps)
        return F.linear(rows, self.lm_head).float()
