"""OpenAI request bodies become requests in Triton's vLLM conventions; bad bodies are clear 400s."""

from __future__ import annotations

import json

import orjson
import pytest

from nereid.core.errors import NereidError, Status
from nereid.frontends.openai.protocol import build_request, error_body, parse_chat, parse_completion


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def test_llm_completion_body_maps_to_vllm_tensors_and_sampling_parameters() -> None:
    req = parse_completion(_body(prompt="hi", max_tokens=5, temperature=0.2, stop=["x"], top_k=3, ignore_eos=True, logprobs=2))
    request = build_request(req, 0)
    inputs = {t.name: t.data.reshape(-1)[0] for t in request.inputs}
    assert inputs["text_input"] == b"hi" and bool(inputs["exclude_input_in_output"]) and not bool(inputs["stream"])
    sampling = orjson.loads(inputs["sampling_parameters"])
    assert sampling == {"temperature": 0.2, "stop": ["x"], "top_k": 3, "ignore_eos": True, "max_tokens": 5, "logprobs": 2}
    assert bool(inputs["return_logprobs"])
    assert request.parameters["nereid_strict_context"] is True and request.model_name == "m"
    assert parse_completion(_body(prompt="hi")).sampling["max_tokens"] == 16  # OpenAI's completions default


def test_llm_chat_body_carries_messages_and_defaults_to_the_context() -> None:
    req = parse_chat(_body(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], stream=True, stream_options={"include_usage": True}))
    assert req.stream and req.include_usage and req.sampling["max_tokens"] is None
    request = build_request(req, 0)
    assert json.loads(request.parameters["nereid_chat_messages"]) == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize(
    ("parse", "fields", "words"),
    [
        (parse_completion, {"prompt": "x", "n": 0}, "'n' must be an integer between 1 and 16"),
        (parse_completion, {"prompt": "x", "n": 2, "best_of": 3}, "'best_of' is not supported"),
        (parse_completion, {"prompt": "x", "suffix": "y"}, "'suffix' is not supported"),
        (parse_completion, {"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "'tools' is not supported on /v1/completions"),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, "'response_format.type' must be"),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}, "'response_format.json_schema' must be"),
        (parse_chat, {"messages": [{"role": "tool", "content": "x"}]}, "needs 'tool_call_id'"),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "'tool_choice' must be"),
        (
            parse_chat,
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "cannot be combined",
        ),
        (parse_completion, {}, "'prompt' is required"),
        (parse_completion, {"prompt": [1, 2]}, "token ids is not supported"),
        (parse_completion, {"prompt": "x", "logprobs": 50}, "'logprobs' must be an integer between 0 and 20"),
        (parse_chat, {"messages": []}, "'messages' is required"),
        (parse_chat, {"messages": [{"content": "x"}]}, "messages[0] must be an object with a 'role'"),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99}, "'top_logprobs'"),
    ],
)
def test_llm_bad_openai_bodies_are_invalid_requests(parse: object, fields: dict[str, object], words: str) -> None:
    with pytest.raises(NereidError) as info:
        parse(_body(**fields))  # type: ignore[operator]
    assert info.value.status is Status.INVALID_ARG and words in info.value.message


def test_llm_openai_errors_have_openai_shape() -> None:
    status, body = error_body(NereidError.not_found("The model `x` does not exist."))
    assert status == 404
    assert orjson.loads(body) == {"error": {"message": "The model `x` does not exist.", "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
    assert error_body(NereidError.unavailable("busy"))[0] == 503
    with pytest.raises(NereidError) as info:
        parse_completion(b"{not json")
    assert "not valid JSON" in info.value.message


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}


def test_llm_tool_choice_becomes_parser_mode_and_schema_parameters() -> None:
    messages = [{"role": "user", "content": "x"}]
    auto = build_request(parse_chat(_body(messages=messages, tools=[TOOL])), 0).parameters
    assert auto["nereid_tool_choice"] == "auto" and json.loads(auto["nereid_tools"]) == [TOOL] and "nereid_json_schema" not in auto
    named = parse_chat(_body(messages=messages, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}})).parameters
    assert named["nereid_tool_choice"] == "function:f" and json.loads(named["nereid_json_schema"]) == TOOL["function"]["parameters"]
    required = parse_chat(_body(messages=messages, tools=[TOOL], tool_choice="required", parallel_tool_calls=False)).parameters
    schema = json.loads(required["nereid_json_schema"])
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert schema["items"]["anyOf"][0]["properties"] == {"name": {"enum": ["f"]}, "parameters": TOOL["function"]["parameters"]}
    assert parse_chat(_body(messages=messages)).parameters == {}


def test_llm_chat_history_keeps_tool_calls_with_arguments_as_objects() -> None:
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    sent = json.loads(build_request(parse_chat(_body(messages=history, tools=[TOOL])), 0).parameters["nereid_chat_messages"])
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}
    assert sent[2] == {"role": "tool", "content": "2", "tool_call_id": "c1"}


def test_llm_response_format_becomes_a_json_schema_parameter() -> None:
    messages = [{"role": "user", "content": "x"}]
    assert parse_chat(_body(messages=messages, response_format={"type": "json_object"})).parameters == {"nereid_json_schema": '{"type":"object"}'}
    spec = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True}}
    assert json.loads(parse_completion(_body(prompt="x", response_format=spec)).parameters["nereid_json_schema"]) == {"type": "object"}
    assert parse_chat(_body(messages=messages, response_format={"type": "text"})).parameters == {}


def test_llm_n_choices_are_separate_requests_with_their_own_seeds() -> None:
    req = parse_completion(_body(prompt=["a", "b"], n=2, seed=5))
    assert req.prompts == ["a", "a", "b", "b"]
    seeds = [orjson.loads(build_request(req, i).inputs[2].data[0])["seed"] for i in range(4)]
    assert seeds == [5, 6, 5, 6]
    assert len(parse_chat(_body(messages=[{"role": "user", "content": "x"}], n=3)).prompts) == 3


def test_llm_embedding_bodies_are_checked() -> None:
    from nereid.frontends.openai.embeddings import embedding_request, parse_embeddings

    req = parse_embeddings(_body(input=["a", [1, 2]], encoding_format="base64"))
    assert req.inputs == ["a", [1, 2]] and req.encoding_format == "base64"
    assert embedding_request(req, 1).parameters == {"nereid_embed": True, "nereid_token_ids": "[1,2]"}
    for fields, words in (({"input": []}, "'input' is required"), ({"input": "a", "dimensions": 3}, "'dimensions' is not supported"), ({"input": "a", "encoding_format": "hex"}, "'encoding_format'")):
        with pytest.raises(NereidError) as info:
            parse_embeddings(_body(**fields))
        assert words in info.value.message
