"""OpenAI features for chat apps through a real `nereid serve` and the official `openai` client, on the tiny
random-weight model: tool calling (tool_choice required / named / auto / none, streamed and not), structured
output (json_object, json_schema), n choices, logprobs, stop, seeds, usage in streams, and /v1/embeddings.

A random model cannot be asked nicely: wherever an assertion needs valid JSON, structured decoding forces it,
so these tests check real behaviour on every seed."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
import requests

from nereid.backends.llm.tiny_model import write_vllm_model
from tests.servers import RunningServer, free_port, start_nereid

MODEL = "tiny_llm"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"], "additionalProperties": False},
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "likes": {"type": "array", "items": {"enum": ["tea", "coffee", "water"]}, "maxItems": 3},
    },
    "required": ["name", "age", "likes"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("llm_features_repo")
    args = {"max_model_len": 1024, "max_num_seqs": 8, "max_num_batched_tokens": 512, "cpu_threads": 1, "tool_call_parser": "hermes"}
    write_vllm_model(repo, MODEL, args, cached=True)
    port = free_port()
    running = start_nereid(repo, f"--openai-port={port}", "--openai-address=127.0.0.1", log_dir=tmp_path_factory.mktemp("logs"), timeout=120)
    running.extra["openai_port"] = str(port)
    yield running
    assert running.stop() == 0, running.log()


def _base(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.extra['openai_port']}/v1"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Any:
    return openai.OpenAI(base_url=_base(server), api_key="unused", max_retries=0, timeout=60)


def _check_call(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _streamed_calls(chunks: list[Any]) -> tuple[dict[int, dict[str, Any]], str | None, str]:
    """Tool calls joined from stream deltas as a client joins them; checks the delta order (id, type and name
    first, then argument chunks only)."""
    calls: dict[int, dict[str, Any]] = {}
    content = ""
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:
                    assert delta.id and delta.type == "function" and delta.function.name, delta
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": delta.function.arguments or ""}
                else:
                    assert delta.id is None and delta.function.name is None, delta
                    calls[delta.index]["arguments"] += delta.function.arguments or ""
    return calls, finish, content


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_llm_tool_choice_required_forces_valid_calls(client: Any, seed: int) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=seed, max_tokens=400)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        _check_call(call.function.name, call.function.arguments)
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("seed", [3, 4])
def test_llm_tool_choice_named_streams_the_function_and_its_arguments(client: Any, seed: int) -> None:
    choice_spec = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice_spec, seed=seed, max_tokens=200)
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and len(whole.choices[0].message.tool_calls) == 1
    _check_call("get_weather", call.function.arguments)
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice_spec, seed=seed, max_tokens=200, stream=True
    )
    chunks = list(stream)
    calls, finish, content = _streamed_calls(chunks)
    assert finish == "tool_calls" and content == ""
    # Streamed as it is generated: the arguments arrive in several chunks, and join to the same call.
    argument_chunks = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or [] if d.function.arguments]
    assert len(argument_chunks) > 2
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["arguments"] == call.function.arguments


def test_llm_tool_choice_required_streams_calls(client: Any) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=5, max_tokens=400, stream=True)
    chunks = list(stream)
    calls, finish, _content = _streamed_calls(chunks)
    assert finish == "tool_calls" and calls and sorted(calls) == list(range(len(calls)))
    # Each call's arguments stream as they are generated, not in one piece at the end.
    argument_chunks = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or [] if d.function.arguments]
    assert len(argument_chunks) > 2 * len(calls)
    for call in calls.values():
        _check_call(call["name"], call["arguments"])


def test_llm_tool_choice_auto_and_none_answer_in_text_with_the_tools_in_the_prompt(client: Any) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    for tool_choice in ("auto", "none"):
        reply = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        choice = reply.choices[0]
        # The random model writes no <tool_call>: its text is the answer; the tools made the prompt longer.
        assert choice.message.tool_calls is None and choice.finish_reason == "length" and choice.message.content
        assert reply.usage.prompt_tokens > plain.usage.prompt_tokens + 20


def test_llm_tool_history_is_rendered_by_the_chat_template(client: Any) -> None:
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
    ]
    short = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=1)
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert reply.usage.prompt_tokens > short.usage.prompt_tokens + 15


def test_llm_bad_tool_requests_are_clear_400s(server: RunningServer, client: Any) -> None:
    url = f"{_base(server)}/chat/completions"
    cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', which is not among 'tools'"),
        ({"tool_choice": "required"}, "'tool_choice' needs 'tools'"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name is required"),
        ({"functions": [{"name": "f"}]}, "'functions' and 'function_call' are deprecated"),
        ({"logit_bias": {"99999": 5}}, "token id 99999 is outside the vocabulary"),
        ({"logit_bias": {"7": 500}}, "'logit_bias'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}}}, "schema"),
    ]
    for fields, words in cases:
        reply = requests.post(url, json={"model": MODEL, "messages": MESSAGES, **fields}, timeout=30)
        assert reply.status_code == 400 and words in reply.json()["error"]["message"], (fields, reply.text)


def _chat_text(client: Any, kwargs: dict[str, Any], stream: bool) -> tuple[str, str | None]:
    """One chat completion's text and finish reason, streamed (the chunks' deltas joined) or not."""
    if stream:
        chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
        return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason
    choice = client.chat.completions.create(**kwargs).choices[0]
    return choice.message.content, choice.finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_llm_response_format_json_schema_always_validates(client: Any, stream: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in (0, 1, 2):
        kwargs = {"model": MODEL, "messages": MESSAGES, "response_format": response_format, "seed": seed, "max_tokens": 200}
        text, finish = _chat_text(client, kwargs, stream)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_llm_response_format_json_object_is_an_object(client: Any, stream: bool) -> None:
    # Greedy and ignoring EOS: the grammar alone ends the output.
    kwargs = {"model": MODEL, "messages": MESSAGES, "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 300, "extra_body": {"ignore_eos": True}}
    text, finish = _chat_text(client, kwargs, stream)
    assert finish == "stop" and isinstance(json.loads(text), dict)


def test_llm_completions_take_response_format_too(client: Any) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reply = client.completions.create(model=MODEL, prompt="A person:", max_tokens=200, seed=7, extra_body={"response_format": response_format})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), PERSON)


def test_llm_triton_generate_takes_vllm_guided_decoding(server: RunningServer) -> None:
    for key in ("guided_decoding", "structured_outputs"):  # vLLM's older and newer names
        sampling = {key: {"json": PERSON}, "max_tokens": 200, "seed": 1}
        body = {"text_input": "A person:", "sampling_parameters": json.dumps(sampling), "exclude_input_in_output": True}
        reply = requests.post(f"{server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        jsonschema.validate(json.loads(reply.json()["text_output"]), PERSON)
    body = {"text_input": "x", "sampling_parameters": json.dumps({"guided_decoding": {"regex": "a+"}})}
    reply = requests.post(f"{server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert reply.status_code == 400 and "only 'json'" in reply.json()["error"]


def test_llm_n_choices_are_separate_generations_deterministic_with_a_seed(client: Any) -> None:
    kwargs = {"model": MODEL, "messages": MESSAGES, "n": 3, "seed": 11, "max_tokens": 8, "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert [c.message.content for c in again.choices] == texts
    single = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, seed=11, extra_body={"ignore_eos": True})
    # The prompt is counted once, the completions of every choice.
    assert first.usage.prompt_tokens == single.usage.prompt_tokens and first.usage.completion_tokens == 24
    # Streamed: every choice gets its role chunk, its tokens and its finish, and usage comes last.
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)}
    assert [streamed[i] for i in range(3)] == texts
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices
    completions = client.completions.create(model=MODEL, prompt=["Hello the", "The model"], n=2, max_tokens=4, seed=3, extra_body={"ignore_eos": True})
    assert [c.index for c in completions.choices] == [0, 1, 2, 3] and completions.usage.completion_tokens == 16


def test_llm_chat_logprobs_stop_and_seed(client: Any) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True}
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 6 and all(len(entry.top_logprobs) == 3 for entry in content)
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    assert all(entry.logprob <= 0 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-4 for entry in content)
    text = reply.choices[0].message.content
    stop = text[2:4]
    stopped = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == text[: text.index(stop)]
    a, b = (client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, seed=42, temperature=1.2).choices[0].message.content for _ in range(2))
    assert a == b


def test_llm_logit_bias_moves_the_choice(client: Any) -> None:
    from transformers import AutoTokenizer

    from nereid.backends.llm.tiny_model import cached_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(cached_tiny_model()), local_files_only=True)
    token = next(t for t in range(1000, 2000) if tokenizer.decode([t]).strip().isalpha())
    kwargs = {"model": MODEL, "prompt": "Hello the", "max_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**kwargs).choices[0].text
    forced = client.completions.create(**kwargs, logit_bias={str(token): 100}).choices[0].text
    assert forced == tokenizer.decode([token]) * 4 != plain
    # -100 on the token greedy decoding picked first: the first token changes.
    first = tokenizer(plain, add_special_tokens=False)["input_ids"][0]
    avoided = client.completions.create(**kwargs, logit_bias={str(first): -100}).choices[0].text
    assert tokenizer(avoided, add_special_tokens=False)["input_ids"][0] != first


def test_llm_embeddings_last_token_unit_vectors(server: RunningServer, client: Any) -> None:
    one = client.embeddings.create(model=MODEL, input="Hello the model")
    vector = np.array(one.data[0].embedding)
    assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-4 and one.usage.prompt_tokens > 0
    many = client.embeddings.create(model=MODEL, input=["Hello the model", "What is the server?"])
    assert [d.index for d in many.data] == [0, 1] and np.allclose(many.data[0].embedding, vector, atol=1e-5)
    assert not np.allclose(many.data[1].embedding, vector)
    assert many.usage.prompt_tokens == many.usage.total_tokens > one.usage.prompt_tokens
    ids = requests.post(f"{_base(server)}/embeddings", json={"model": MODEL, "input": [[1, 50, 60, 70]]}, timeout=30).json()
    assert ids["usage"]["prompt_tokens"] == 4 and len(ids["data"][0]["embedding"]) == 384
    raw = requests.post(f"{_base(server)}/embeddings", json={"model": MODEL, "input": "Hello the model", "encoding_format": "base64"}, timeout=30).json()
    assert np.allclose(np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4"), vector, atol=1e-5)
    refused = requests.post(f"{_base(server)}/embeddings", json={"model": MODEL, "input": "x", "dimensions": 8}, timeout=30)
    assert refused.status_code == 400 and "'dimensions' is not supported" in refused.json()["error"]["message"]
