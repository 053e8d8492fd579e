"""OpenAI's /v1/embeddings body to core requests of an LLM model (one per input), and their answers back to
OpenAI's embedding list: floats or base64 of little-endian float32, and usage. Only translation."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.frontends.openai.protocol import read_body

__all__ = ["EmbeddingRequest", "parse_embeddings", "embedding_request", "embedding_body"]

# Request parameters the LLM backend reads (plain names: frontends never import backends).
_EMBED_PARAMETER = "nereid_embed"
_TOKEN_IDS_PARAMETER = "nereid_token_ids"
_MAX_INPUTS = 2048  # as OpenAI: at most 2048 inputs in one request


@dataclass(slots=True)
class EmbeddingRequest:
    model: str
    inputs: list[str | list[int]]
    encoding_format: str  # "float" | "base64"
    user: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _invalid(message: str) -> NereidError:
    return NereidError.invalid(message)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_embeddings(body: bytes) -> EmbeddingRequest:
    doc = read_body(body)
    model = doc["model"]
    if doc.get("dimensions") is not None:
        raise _invalid("'dimensions' is not supported: this server's embeddings have the model's hidden size, unshortened")
    value: Any = doc.get("input")
    inputs: list[str | list[int]]
    if isinstance(value, str):
        inputs = [value]
    elif _is_ids(value):
        inputs = [list(value)]
    elif isinstance(value, list) and value and all(isinstance(v, str) or _is_ids(v) for v in value):
        inputs = list(value)
    else:
        raise _invalid("'input' is required: a string, a list of strings, a list of token ids or a list of such lists, none empty")
    if any(v == "" for v in inputs):
        raise _invalid("'input' must not contain empty strings")
    if len(inputs) > _MAX_INPUTS:
        raise _invalid(f"'input' may hold at most {_MAX_INPUTS} items, got {len(inputs)}")
    encoding = doc.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise _invalid(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    user = doc.get("user", "")
    if not isinstance(user, str):
        raise _invalid(f"'user' must be a string, got {type(user).__name__}")
    return EmbeddingRequest(model, inputs, encoding, user)


def embedding_request(req: EmbeddingRequest, index: int) -> InferenceRequest:
    item = req.inputs[index]
    text = item if isinstance(item, str) else ""
    array = np.empty(1, dtype=object)
    array[0] = text.encode("utf-8")
    parameters: dict[str, Any] = {_EMBED_PARAMETER: True}
    if not isinstance(item, str):
        parameters[_TOKEN_IDS_PARAMETER] = orjson.dumps(item).decode()
    if req.user:
        parameters["user"] = req.user
    return InferenceRequest(req.model, "", [InputTensor("text_input", "BYTES", (1,), array)], id=f"{req.id}-{index}", parameters=parameters)


def embedding_body(req: EmbeddingRequest, responses: list[InferenceResponse]) -> bytes:
    data = []
    prompt_tokens = 0
    for index, response in enumerate(responses):
        vector = next((o.data for o in response.outputs if o.name == "embedding"), None)
        if vector is None:
            raise NereidError.internal(f"model '{req.model}' answered input {index} without an embedding")
        vector = np.asarray(vector, dtype="<f4").reshape(-1)
        embedding: Any = base64.b64encode(vector.tobytes()).decode() if req.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
        prompt_tokens += int((response.parameters or {}).get("prompt_tokens", 0))
    return orjson.dumps({"object": "list", "data": data, "model": req.model, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
