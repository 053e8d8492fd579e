"""OpenAI request bodies to core requests of an LLM model (Triton's vLLM tensor conventions), and core
responses back to OpenAI's JSON: completions, chat completions, their stream chunks, usage and errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from nereid.core.errors import NereidError, Status, http_status
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.frontends.openai.tools import (
    JSON_SCHEMA_PARAMETER,
    chat_messages,
    response_format_parameters,
    tool_parameters,
)

__all__ = [
    "OpenAIRequest",
    "read_body",
    "parse_completion",
    "parse_chat",
    "build_request",
    "error_body",
    "CompletionState",
]

# Request parameters the LLM backend reads (kept as plain names: frontends never import backends).
_CHAT_PARAMETER = "nereid_chat_messages"
_STRICT_CONTEXT_PARAMETER = "nereid_strict_context"
_TOOL_CALLS_PARAMETER = "tool_calls"  # response parameter: JSON list of {"index", "name"?, "arguments"} deltas

# OpenAI fields that map one to one onto sampling parameters (vLLM's names), plus vLLM's extensions.
_SAMPLING_FIELDS = (
    "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
    "skip_special_tokens", "include_stop_str_in_output", "logit_bias",
    "priority",  # vLLM's scheduling priority (lower is earlier): read by the engine, not the sampler
)
# Fields this server refuses (400 naming the field) rather than silently ignore.
_UNSUPPORTED = ("suffix",)
_MAX_N = 16


@dataclass(slots=True)
class OpenAIRequest:
    kind: str  # "completion" | "chat"
    model: str
    prompts: list[str]  # one per choice index: each prompt n times in a row (chat: n placeholders)
    messages: list[dict[str, Any]] | None
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool
    echo: bool = False
    logprobs: int | None = None  # completions: top-N; chat: top_logprobs when logprobs is true
    user: str = ""  # OpenAI's end-user id: the request parameter "user", which a rollout's sticky key can name
    n: int = 1  # choices per prompt, each its own generation
    parameters: dict[str, Any] = field(default_factory=dict)  # tools and structured output, for the backend
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def _invalid(message: str) -> NereidError:
    return NereidError.invalid(message)


def read_body(body: bytes) -> dict[str, Any]:
    """An OpenAI request body: a JSON object naming a model, or a 400 saying what is wrong."""
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError as exc:
        raise _invalid(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _invalid("the request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("'model' is required: the name of a model this server serves (GET /v1/models lists them)")
    return doc


def _load(body: bytes) -> dict[str, Any]:
    doc = read_body(body)
    for key in _UNSUPPORTED:
        if doc.get(key) not in (None, [], {}, ""):
            raise _invalid(f"'{key}' is not supported by this server")
    return doc


def _n(doc: dict[str, Any]) -> int:
    n = doc.get("n")
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_N:
        raise _invalid(f"'n' must be an integer between 1 and {_MAX_N}, got {n!r}")
    best_of = doc.get("best_of")
    if best_of not in (None, n):
        raise _invalid(f"'best_of' is not supported by this server (only best_of = n, here {n}), got {best_of!r}")
    return n


def _sampling(doc: dict[str, Any], max_tokens: Any) -> dict[str, Any]:
    sampling = {key: doc[key] for key in _SAMPLING_FIELDS if doc.get(key) is not None}
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    else:
        sampling["max_tokens"] = None  # up to the context length
    return sampling


def _stream_options(doc: dict[str, Any]) -> bool:
    options = doc.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object")
    return bool(options.get("include_usage"))


def parse_completion(body: bytes) -> OpenAIRequest:
    doc = _load(body)
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        raise _invalid("'prompt' as token ids is not supported; send text")
    else:
        raise _invalid("'prompt' is required: a string or a list of strings")
    logprobs = doc.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 20):
        raise _invalid(f"'logprobs' must be an integer between 0 and 20, got {logprobs!r}")
    for key in ("tools", "tool_choice", "functions"):
        if doc.get(key) not in (None, [], "none"):
            raise _invalid(f"'{key}' is not supported on /v1/completions; use /v1/chat/completions")
    max_tokens = doc.get("max_tokens", 16)
    n = _n(doc)
    return OpenAIRequest(
        kind="completion",
        model=doc["model"],
        prompts=[p for p in prompts for _ in range(n)],
        messages=None,
        sampling=_sampling(doc, max_tokens),
        stream=bool(doc.get("stream")),
        include_usage=_stream_options(doc),
        echo=bool(doc.get("echo")),
        logprobs=logprobs,
        user=_user(doc),
        n=n,
        parameters=response_format_parameters(doc),
    )


def parse_chat(body: bytes) -> OpenAIRequest:
    doc = _load(body)
    clean = chat_messages(doc.get("messages"))
    parameters = tool_parameters(doc)
    structured = response_format_parameters(doc)
    if structured and JSON_SCHEMA_PARAMETER in parameters:
        raise _invalid("'response_format' cannot be combined with a 'tool_choice' that forces a call ('required' or a named function)")
    parameters.update(structured)
    logprobs = None
    if doc.get("logprobs"):
        top = doc.get("top_logprobs") or 0
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise _invalid(f"'top_logprobs' must be an integer between 0 and 20, got {top!r}")
        logprobs = top
    max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
    n = _n(doc)
    return OpenAIRequest(
        kind="chat",
        model=doc["model"],
        prompts=[""] * n,
        messages=clean,
        sampling=_sampling(doc, max_tokens),
        stream=bool(doc.get("stream")),
        include_usage=_stream_options(doc),
        logprobs=logprobs,
        user=_user(doc),
        n=n,
        parameters=parameters,
    )


def _user(doc: dict[str, Any]) -> str:
    user = doc.get("user", "")
    if not isinstance(user, str):
        raise _invalid(f"'user' must be a string, got {type(user).__name__}")
    return user


def _bytes(value: bytes) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = value
    return array


def build_request(req: OpenAIRequest, index: int) -> InferenceRequest:
    """A request in Triton's vLLM conventions; the generated text only, streamed when the client streams."""
    sampling = dict(req.sampling)
    if req.n > 1 and isinstance(sampling.get("seed"), int):
        sampling["seed"] += index % req.n  # each choice its own draw, the same ones for the same seed
    if req.logprobs is not None:
        sampling["logprobs"] = req.logprobs
    inputs = [
        InputTensor("text_input", "BYTES", (1,), _bytes(req.prompts[index].encode("utf-8"))),
        InputTensor("stream", "BOOL", (1,), np.array([req.stream])),
        InputTensor("sampling_parameters", "BYTES", (1,), _bytes(orjson.dumps(sampling))),
        InputTensor("exclude_input_in_output", "BOOL", (1,), np.array([True])),
    ]
    if req.logprobs is not None:
        inputs.append(InputTensor("return_logprobs", "BOOL", (1,), np.array([True])))
    parameters: dict[str, Any] = {_STRICT_CONTEXT_PARAMETER: True}
    if req.messages is not None:
        parameters[_CHAT_PARAMETER] = orjson.dumps(req.messages).decode()
    if req.user:
        parameters["user"] = req.user
    parameters.update(req.parameters)
    return InferenceRequest(req.model, "", inputs, id=f"{req.id}-{index}", parameters=parameters)


def error_body(error: NereidError) -> tuple[int, bytes]:
    status = http_status(error.status)
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = None
    if error.status is Status.NOT_FOUND:
        code = "model_not_found"
    return status, orjson.dumps({"error": {"message": error.message, "type": kind, "param": None, "code": code}})


def _text_of(response: InferenceResponse) -> str:
    for output in response.outputs:
        if output.name == "text_output":
            value = output.data.reshape(-1)[0]
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return ""


def _logprob_entries(response: InferenceResponse) -> list[dict[str, Any]]:
    for output in response.outputs:
        if output.name == "logprobs":
            raw = output.data.reshape(-1)[0]
            value = orjson.loads(raw) if raw else None
            return value if isinstance(value, list) else []
    return []


@dataclass(slots=True)
class CompletionState:
    """Per choice: text so far, logprobs so far, finish reason and token counts."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text_offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    chat_logprobs: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's message.tool_calls, built from deltas
    tool_deltas: list[dict[str, Any]] = field(default_factory=list)  # the last response's, as stream chunk entries

    def absorb(self, response: InferenceResponse) -> tuple[str, list[dict[str, Any]]]:
        """Take one response; return its new text and its logprob entries (its tool-call deltas: tool_deltas)."""
        delta = _text_of(response)
        self.text += delta
        entries = _logprob_entries(response)
        self.tool_deltas = []
        raw_calls = response.parameters.get(_TOOL_CALLS_PARAMETER) if response.parameters else None
        if raw_calls:
            for item in orjson.loads(raw_calls):
                self.tool_deltas.append(self._tool_delta(item))
        if response.final:
            params = response.parameters
            reason = params.get("finish_reason")
            self.finish_reason = "stop" if reason in ("stop", None) else "length" if reason == "length" else str(reason)
            self.prompt_tokens = int(params.get("prompt_tokens", 0))
            self.completion_tokens = int(params.get("completion_tokens", 0))
        return delta, entries


    def _tool_delta(self, item: dict[str, Any]) -> dict[str, Any]:
        index = int(item["index"])
        if index == len(self.tool_calls):  # a new call: its id, type and name come first, then argument chunks
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": item["name"], "arguments": ""}}
            self.tool_calls.append(call)
            self.tool_calls[index]["function"]["arguments"] += item.get("arguments", "")
            return {"index": index, "id": call["id"], "type": "function", "function": {"name": item["name"], "arguments": item.get("arguments", "")}}
        self.tool_calls[index]["function"]["arguments"] += item.get("arguments", "")
        return {"index": index, "function": {"arguments": item.get("arguments", "")}}


def _scored_tokens(entries: list[dict[str, Any]]) -> Iterator[tuple[str, Any, list[tuple[str, Any]]]]:
    """Each position of `entries` (the engine's candidates by token id, the sampled one first) that has one: the
    sampled token's text and logprob, and the top candidates' (text, logprob) by rank, the sampled one among
    them when it ranks (OpenAI's top_logprobs hold exactly the asked number)."""
    for entry in entries:
        items = list(entry.values())
        if items:
            ranked = sorted((v for v in items if v.get("rank") is not None), key=lambda v: v["rank"])
            yield _token_text(items[0]), items[0].get("logprob"), [(_token_text(v), v.get("logprob")) for v in ranked]


def _token_text(candidate: dict[str, Any]) -> str:
    return candidate.get("decoded_token") or ""


def completion_logprobs(entries: list[dict[str, Any]], offset: int) -> tuple[dict[str, Any], int]:
    """The legacy completions logprobs object for some tokens, and the text offset after them."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for text, logprob, others in _scored_tokens(entries):
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append(dict(others) or {text: logprob})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}, offset


def chat_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "token": token,
            "logprob": logprob,
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in others],
        }
        for token, logprob, others in _scored_tokens(entries)
    ]


def usage(states: list[CompletionState], n: int = 1) -> dict[str, int]:
    """Token counts of a request: each prompt counted once however many choices it has (as OpenAI and vLLM)."""
    prompt = sum(s.prompt_tokens for s in states[::n])
    completion = sum(s.completion_tokens for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
