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
        (parse_completion, {"prompt": "x", "n": 2}, "'n' must be 1"),
        (parse_completion, {}, "'prompt' is required"),
        (parse_completion, {"prompt": [1, 2]}, "token ids is not supported"),
        (parse_completion, {"prompt": "x", "logprobs": 50}, "'logprobs' must be an integer between 0 and 20"),
        (parse_completion, {"prompt": "x", "logit_bias": {"1": 2}}, "'logit_bias' is not supported"),
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
