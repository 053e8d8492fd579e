"""Embeddings from the engine's weights equal transformers' final hidden state of the last token, normalised
(vLLM's default pooling for decoder models)."""

from __future__ import annotations

import torch

from nereid.backends.llm.embedding import last_token_embedding
from nereid.backends.llm.llama_model import LlamaModel
from nereid.backends.llm.tiny_model import cached_tiny_model


def test_llm_embedding_is_transformers_last_hidden_state_of_the_last_token_normalised() -> None:
    from transformers import AutoModel

    folder = cached_tiny_model()
    ids = [1, 40, 300, 7, 1200, 55, 9]
    reference = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.no_grad():
        hidden = reference(torch.tensor([ids])).last_hidden_state[0, -1]
    expected = torch.nn.functional.normalize(hidden, dim=0).numpy()
    got = last_token_embedding(LlamaModel(folder), ids)
    assert got.shape == expected.shape == (384,)
    assert abs(float((got * got).sum()) - 1) < 1e-5
    assert float(abs(got - expected).max()) < 1e-4
