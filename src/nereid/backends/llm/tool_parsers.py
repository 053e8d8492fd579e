"""Tool calls read out of a model's generated text: the per-model parsers (model.json `tool_call_parser`, vLLM's
names: `hermes`, `llama3_json`, with `json` as an alias) and the two forced shapes that structured decoding
produces (one named function's arguments; a JSON array of calls). `ToolCallStream` turns the text so far into
content and tool-call deltas for streaming. Text in, text out: no tokens, requests or wire formats here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "PARSERS", "parser_for", "named_call", "call_array", "ToolCallStream", "ToolExtractor"]


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object (a prefix of it while a forced call is still streaming)


# extract(text, final) -> (content, calls). Not final: `content` is the part of the text that is surely not
# part of a tool call (later text never changes it), and `calls` the calls so far, the last one possibly still
# being written (its arguments then a beginning of their final text).
ToolExtractor = Callable[[str, bool], tuple[str, list[ToolCall]]]

_DECODER = json.JSONDecoder()


# The head of a call object as models and the forced grammar write it: the name first, then the arguments.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array starting at `start` ends (one past its closing bracket); None while open."""
    depth = 0
    in_string = escaped = False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _partial_call(text: str) -> ToolCall | None:
    """A call still being written: its name once complete, and its arguments' text so far (never past their end,
    so a call's streamed arguments are always a beginning of its final arguments)."""
    head = _CALL_HEAD.match(text)
    if head is None or head.end() >= len(text) or text[head.end()] not in "{[":
        return None
    end = _value_end(text, head.end())
    return ToolCall(json.loads(f'"{head.group(1)}"'), text[head.end() : end])


def _call(value: Any, raw: str) -> ToolCall | None:
    """{"name": ..., "arguments" | "parameters": {...}} (parsed `value`, written as `raw`) as a call; anything else
    is not one. The arguments keep the model's own text where the head is the usual one, as they were streamed."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return ToolCall(value["name"], arguments)
    streamed = _partial_call(raw)
    if streamed is not None and streamed.name == value["name"]:
        return streamed
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a beginning of `marker` (it may become the marker)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


def hermes(text: str, final: bool) -> tuple[str, list[ToolCall]]:
    """Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, text around."""
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            tail = text[pos:]
            content.append(tail if final else tail[: len(tail) - _partial_suffix(tail, _HERMES_OPEN)])
            break
        content.append(text[pos:start])
        body_start = start + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        if end < 0:  # an open call: complete only if the text ends here (a model that stops before the close tag)
            if final:
                call = _json_call(text[body_start:])
                if call is not None:
                    calls.append(call)
                else:
                    content.append(text[start:])
            else:
                partial = _partial_call(text[body_start:])
                if partial is not None:
                    calls.append(partial)
            break
        call = _json_call(text[body_start:end])
        if call is not None:
            calls.append(call)
        else:
            content.append(text[start : end + len(_HERMES_CLOSE)])  # not a call after all: it stays text
        pos = end + len(_HERMES_CLOSE)
    return "".join(content), calls


def _json_call(body: str) -> ToolCall | None:
    try:
        return _call(json.loads(body), body)
    except ValueError:
        return None


_PYTHON_TAG = "<|python_tag|>"


def llama3_json(text: str, final: bool) -> tuple[str, list[ToolCall]]:
    """Llama 3.x JSON style: the whole output is `{"name": ..., "parameters": {...}}` (optionally after
    <|python_tag|>, several separated by `;`). Output that does not start with a call is content."""
    body = text.lstrip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].lstrip()
    if not body:
        return (text, []) if final else ("", [])
    if not body.startswith("{"):
        if not final and _PYTHON_TAG.startswith(body):
            return "", []
        return text, []
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(body):
        try:
            value, end = _DECODER.raw_decode(body, pos)
        except ValueError:  # incomplete (still streaming) or not JSON
            partial = None if final else _partial_call(body[pos:])
            if partial is not None:
                calls.append(partial)
            break
        call = _call(value, body[pos:end])
        if call is None:
            return (text, []) if final or calls == [] else ("", calls)
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    if final and not calls:
        return text, []
    return "", calls


PARSERS: dict[str, ToolExtractor] = {"hermes": hermes, "llama3_json": llama3_json, "json": llama3_json}


def parser_for(name: str) -> ToolExtractor:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool_call_parser '{name}' (known: {', '.join(sorted(PARSERS))})") from None


def named_call(name: str) -> ToolExtractor:
    """tool_choice naming a function: structured decoding makes the whole output that function's arguments."""

    def extract(text: str, final: bool) -> tuple[str, list[ToolCall]]:
        return "", [ToolCall(name, text.strip() if final else text.lstrip())]

    return extract


def call_array(text: str, final: bool) -> tuple[str, list[ToolCall]]:
    """tool_choice `required`: structured decoding makes the output `[{"name": ..., "parameters": {...}}, ...]`."""
    body = text.lstrip()
    calls: list[ToolCall] = []
    if not body.startswith("["):
        return ("", calls) if not final else (text, calls)
    pos = 1
    while True:
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(body) or body[pos] == "]":
            break
        try:
            value, end = _DECODER.raw_decode(body, pos)
        except ValueError:
            partial = None if final else _partial_call(body[pos:])
            if partial is not None:
                calls.append(partial)
            break
        call = _call(value, body[pos:end])
        if call is not None:
            calls.append(call)
        pos = end
    return "", calls


@dataclass(slots=True)
class ToolCallStream:
    """Feeds the text generated so far through an extractor and says what is new since the last feed: content
    text, and tool-call deltas ({"index", "name", "arguments": ""} once per call, then {"index", "arguments"}
    chunks), as OpenAI streams them."""

    extract: ToolExtractor
    _content_sent: int = 0
    _arguments_sent: list[int] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self._arguments_sent)

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        content, calls = self.extract(text, final)
        new_content = content[self._content_sent :]
        self._content_sent = max(self._content_sent, len(content))
        deltas: list[dict[str, Any]] = []
        for index, call in enumerate(calls):
            if index == len(self._arguments_sent):
                self._arguments_sent.append(0)
                deltas.append({"index": index, "name": call.name, "arguments": ""})
            sent = self._arguments_sent[index]
            if len(call.arguments) > sent:
                deltas.append({"index": index, "arguments": call.arguments[sent:]})
                self._arguments_sent[index] = len(call.arguments)
        return new_content, deltas
