"""OpenAI's tools and structured-output fields of a chat or completion body, checked and turned into the plain
request parameters the LLM backend reads: the tools for the chat template, how to read the output (tool_choice),
and the JSON schema that structured decoding must follow (response_format, or a forced tool call).

Only translation: which parser reads a model's output and how decoding is constrained is the backend's business.
"""

from __future__ import annotations

from typing import Any

import orjson

from nereid.core.errors import NereidError

__all__ = ["TOOLS_PARAMETER", "TOOL_CHOICE_PARAMETER", "JSON_SCHEMA_PARAMETER", "tool_parameters", "response_format_parameters", "chat_messages"]

# Request parameters the LLM backend reads (plain names: frontends never import backends).
TOOLS_PARAMETER = "nereid_tools"  # JSON list of OpenAI tool objects, handed to the chat template
TOOL_CHOICE_PARAMETER = "nereid_tool_choice"  # "none" | "auto" | "required" | "function:<name>"
JSON_SCHEMA_PARAMETER = "nereid_json_schema"  # JSON schema text the output must match


def _invalid(message: str) -> NereidError:
    return NereidError.invalid(message)


def _tool_name(tool: Any, index: int) -> str:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
        raise _invalid(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _invalid(f"tools[{index}].function.name is required: a non-empty string")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _invalid(f"tools[{index}].function.parameters must be a JSON schema object")
    return name


def _parameters_schema(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool["function"].get("parameters")
    return schema if schema else {"type": "object", "properties": {}}


def tool_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body as request parameters (none without tools).

    `required` and a named function are forced by structured decoding, as vLLM does: a named function's output is
    its arguments object; `required` makes a JSON array of {"name", "parameters"} objects, one of the tools each."""
    if doc.get("functions") not in (None, []) or doc.get("function_call") is not None:
        raise _invalid("'functions' and 'function_call' are deprecated and not supported; use 'tools' and 'tool_choice'")
    tools = doc.get("tools")
    choice = doc.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none"):
            raise _invalid("'tool_choice' needs 'tools': a list of the functions the model may call")
        return {}
    if not isinstance(tools, list):
        raise _invalid("'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    names = [_tool_name(tool, i) for i, tool in enumerate(tools)]
    by_name = dict(zip(names, tools))
    params: dict[str, Any] = {TOOLS_PARAMETER: orjson.dumps(tools).decode()}
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _invalid("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}")
        if name not in by_name:
            raise _invalid(f"'tool_choice' names the function '{name}', which is not among 'tools' ({', '.join(names)})")
        params[TOOL_CHOICE_PARAMETER] = f"function:{name}"
        params[JSON_SCHEMA_PARAMETER] = orjson.dumps(_parameters_schema(by_name[name])).decode()
    elif choice == "required":
        params[TOOL_CHOICE_PARAMETER] = "required"
        params[JSON_SCHEMA_PARAMETER] = orjson.dumps(_calls_schema(tools, doc.get("parallel_tool_calls") is False)).decode()
    elif choice in ("auto", "none"):
        params[TOOL_CHOICE_PARAMETER] = choice
    else:
        raise _invalid(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got {choice!r}")
    return params


def _calls_schema(tools: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    one_of_each = [
        {
            "type": "object",
            "properties": {"name": {"enum": [tool["function"]["name"]]}, "parameters": _parameters_schema(tool)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one_of_each}}
    if single:
        schema["maxItems"] = 1
    return schema


def response_format_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    """`response_format`: `text` (no constraint), `json_object` (any JSON object) or `json_schema` (that schema;
    `strict` or not, the output always follows it)."""
    form = doc.get("response_format")
    if form is None:
        return {}
    if not isinstance(form, dict) or not isinstance(form.get("type"), str):
        raise _invalid("'response_format' must be an object with a 'type': 'text', 'json_object' or 'json_schema'")
    kind = form["type"]
    if kind == "text":
        return {}
    if kind == "json_object":
        return {JSON_SCHEMA_PARAMETER: '{"type":"object"}'}
    if kind == "json_schema":
        spec = form.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _invalid("'response_format.json_schema' must be an object with a 'name' and a 'schema'")
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise _invalid("'response_format.json_schema.schema' must be a JSON schema object")
        return {JSON_SCHEMA_PARAMETER: orjson.dumps(schema).decode()}
    raise _invalid(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{kind}'")


def _content_text(content: Any, where: str) -> str | None:
    if isinstance(content, str):
        return content
    if content is None:
        return None
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid(f"{where}.content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise _invalid(f"{where}.content must be a string or a list of text parts")


def _history_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        # Chat templates (Hermes, Llama, Qwen) write arguments with `tojson`: hand them the object, not its text.
        try:
            arguments = orjson.loads(arguments) if arguments else {}
        except orjson.JSONDecodeError:
            pass
    return {"id": call.get("id", ""), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The chat history as the chat template reads it: role, text content, and an assistant's earlier
    `tool_calls` or a `tool` message's `tool_call_id` kept."""
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' is required: a non-empty list of {role, content} objects")
    clean = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"{where} must be an object with a 'role'")
        content = _content_text(message.get("content"), where)
        entry: dict[str, Any] = {"role": message["role"], "content": content or ""}
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise _invalid(f"{where}.tool_calls must be a list")
            entry["tool_calls"] = [_history_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
        if message["role"] == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise _invalid(f"{where}: a 'tool' message needs 'tool_call_id': the id of the call it answers")
            entry["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        clean.append(entry)
    return clean
