"""Embeddings from a Llama-family decoder's weights: one causal forward pass over a prompt, without the KV cache,
then vLLM's default pooling for decoder models: the last token's final (normed) hidden state, L2-normalised.

It reads the engine's loaded weights and shares nothing mutable with the engine, so it runs on any thread
beside decode steps. No requests or wire formats here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["last_token_embedding"]


@torch.inference_mode()
def last_token_embedding(model: Any, ids: list[int]) -> np.ndarray:
    """float32 [hidden_size]: the unit-length final hidden state of the prompt's last token."""
    heads, kvh, hd = model.heads, model.kv_heads, model.head_dim
    n = len(ids)
    x = F.embedding(torch.tensor(ids, dtype=torch.long, device=model.device), model.embed)
    positions = torch.arange(n, device=model.device)
    cos = model._cos[positions].unsqueeze(1)
    sin = model._sin[positions].unsqueeze(1)
    q_size, kv_size = heads * hd, kvh * hd
    for block in model.blocks:
        h = F.rms_norm(x, (model.hidden,), block.ln1, model.eps)
        qkv = F.linear(h, block.qkv, block.qkv_bias)
        q = _rope(qkv[:, :q_size].view(n, heads, hd), cos, sin).transpose(0, 1).unsqueeze(0)
        k = _rope(qkv[:, q_size : q_size + kv_size].view(n, kvh, hd), cos, sin).transpose(0, 1).unsqueeze(0)
        v = qkv[:, q_size + kv_size :].view(n, kvh, hd).transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=model.scale, enable_gqa=heads != kvh)
        x = x + F.linear(out.squeeze(0).transpose(0, 1).reshape(n, heads * hd), block.o)
        h = F.rms_norm(x, (model.hidden,), block.ln2, model.eps)
        gate_up = F.linear(h, block.gate_up)
        half = gate_up.shape[-1] // 2
        x = x + F.linear(F.silu(gate_up[:, :half]) * gate_up[:, half:], block.down)
    last = F.rms_norm(x[-1], (model.hidden,), model.norm, model.eps).float()
    return F.normalize(last, dim=0).cpu().numpy()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
