"""Tool calls read out of generated text: the hermes and llama3_json parsers, the forced shapes, and the stream
of deltas that must join, chunk by chunk, to what the whole text gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nereid.backends.llm.engine_args import read_engine_args, vllm_engine_kwargs
from nereid.backends.llm.tool_parsers import (
    ToolCall,
    ToolCallStream,
    call_array,
    hermes,
    llama3_json,
    named_call,
    parser_for,
)
from nereid.core.errors import NereidError

HERMES = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'


def test_llm_hermes_parser_reads_every_call_and_keeps_the_text_around() -> None:
    content, calls = hermes(HERMES, True)
    assert content == "Let me look.\n"
    assert calls == [ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("get_time", '{"zone": "CET"}')]
    # Not JSON inside the tags, or no tags at all: it is text.
    assert hermes("<tool_call>not json</tool_call> ok", True) == ("<tool_call>not json</tool_call> ok", [])
    assert hermes("plain answer", True) == ("plain answer", [])
    # A model that stops before the closing tag still made its call.
    assert hermes('<tool_call>{"name": "f", "arguments": {}}', True) == ("", [ToolCall("f", "{}")])


def test_llm_llama3_json_parser_reads_json_calls_and_leaves_text_alone() -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {"zone": "UTC"}}'
    assert llama3_json(text, True) == ("", [ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("get_time", '{"zone": "UTC"}')])
    assert llama3_json("The weather is fine.", True) == ("The weather is fine.", [])
    assert llama3_json('{"temperature": 3}', True) == ('{"temperature": 3}', [])  # JSON, but not a call
    assert parser_for("json") is llama3_json and parser_for("hermes") is hermes
    with pytest.raises(ValueError, match="unknown tool_call_parser 'nope'"):
        parser_for("nope")


def test_llm_forced_shapes_read_named_arguments_and_call_arrays() -> None:
    assert named_call("f")('{"a": 1}', True) == ("", [ToolCall("f", '{"a": 1}')])
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    assert call_array(text, True) == ("", [ToolCall("f", '{"a": 1}'), ToolCall("g", "{}")])
    # While a call is written, its name and its arguments so far are known (never the wrapper's closing brace).
    assert call_array(text[:35], False) == ("", [ToolCall("f", '{"a": ')])
    assert call_array(text[:40], False) == ("", [ToolCall("f", '{"a": 1}')])
    assert hermes('<tool_call>{"name": "f", "arguments": {"a": [1,', False) == ("", [ToolCall("f", '{"a": [1,')])
    assert hermes('<tool_call>{"name": "f"', False) == ("", [])


@pytest.mark.parametrize(
    ("extract", "text"),
    [
        (hermes, HERMES),
        (llama3_json, '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
        (named_call("get_weather"), '{"city": "Oslo", "days": 3}'),
        (call_array, '[{"name": "f", "parameters": {"a": [1, 2]}}, {"name": "g", "parameters": {"b": "x}\\"{"}}]'),
        (hermes, "no calls here, just <tool text"),
    ],
)
def test_llm_streamed_deltas_join_to_the_whole_texts_calls(extract: object, text: str) -> None:
    whole_content, whole_calls = extract(text, True)  # type: ignore[operator]
    stream = ToolCallStream(extract)  # type: ignore[arg-type]
    content = ""
    calls: list[dict[str, str]] = []
    chunks = 0
    for end in range(1, len(text) + 1):  # one character at a time: the worst chunking a model can produce
        delta, deltas = stream.feed(text[:end], end == len(text))
        content += delta
        for d in deltas:
            if "name" in d:
                assert d["index"] == len(calls) and d["arguments"] == ""
                calls.append({"name": d["name"], "arguments": ""})
            else:
                calls[d["index"]]["arguments"] += d["arguments"]
                chunks += 1
    assert content == whole_content
    # Arguments stream as they are written: many chunks, not one per call.
    assert chunks >= 3 * len(whole_calls)
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
    assert stream.calls == len(whole_calls)
    for call in calls:
        json.loads(call["arguments"])


def test_llm_model_json_names_a_known_tool_call_parser(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.json").write_text(json.dumps({"model": ".", "tool_call_parser": "hermes"}))
    args = read_engine_args("m", tmp_path / "m", version)
    assert args.tool_call_parser == "hermes" and "tool_call_parser" not in vllm_engine_kwargs(args)
    (version / "model.json").write_text(json.dumps({"model": ".", "tool_call_parser": "mistral_v9"}))
    with pytest.raises(NereidError) as info:
        read_engine_args("m", tmp_path / "m", version)
    assert "'tool_call_parser' must be one of hermes, json, llama3_json, got 'mistral_v9'" in info.value.message
