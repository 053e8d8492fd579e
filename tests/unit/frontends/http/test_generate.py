"""Triton's generate extension on the HTTP port: a flat JSON object becomes one inference request."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.config.model_config import ModelConfig, parse_pbtxt
from nereid.core.errors import NereidError
from nereid.core.types import InferenceResponse, OutputTensor
from nereid.frontends.http.generate import generate_body, generate_request

_BATCHED = parse_pbtxt(
    'name: "adder" max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    "adder",
)


def test_a_flat_list_becomes_a_batch_of_one() -> None:
    request = generate_request(b'{"INPUT0": [1, 2, 3, 4]}', "adder", "", _BATCHED)
    (tensor,) = request.inputs
    assert tensor.shape == (1, 4) and tensor.data.dtype == np.float32
    assert tensor.data.tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_a_nested_list_is_taken_flat_instead_of_failing_the_server() -> None:
    request = generate_request(b'{"INPUT0": [[1, 2, 3, 4]]}', "adder", "", _BATCHED)
    assert request.inputs[0].shape == (1, 4)


def test_a_ragged_or_mistyped_value_is_refused_naming_the_model_and_input() -> None:
    for body in (b'{"INPUT0": [[1, 2], [3]]}', b'{"INPUT0": ["a", "b"]}'):
        with pytest.raises(NereidError) as caught:
            generate_request(body, "adder", "", _BATCHED)
        assert "model 'adder'" in str(caught.value) and "'INPUT0'" in str(caught.value)


def _config(datatype: str) -> ModelConfig:
    return parse_pbtxt(f'name: "m" max_batch_size: 0 input [ {{ name: "X" data_type: TYPE_{datatype} dims: [ -1 ] }} ]', "m")


@pytest.mark.parametrize(
    "datatype, value, shown",
    [("FP32", "[true, 1.0]", "true"), ("FP32", "[null, 1.0]", "null"), ("FP64", '["1.0"]', '"1.0"'),
     ("INT32", "[1.5, 2]", "1.5"), ("BOOL", "[1, 0]", "1"), ("STRING", '[1, "a"]', "1"), ("STRING", '{"a": 1}', '{"a": 1}')],
)  # fmt: skip
def test_a_value_of_the_wrong_kind_for_its_type_is_refused_as_triton_does(datatype: str, value: str, shown: str) -> None:
    with pytest.raises(NereidError) as caught:
        generate_request(b'{"X": %s}' % value.encode(), "m", "", _config(datatype))
    triton = {"STRING": ": attempt to access JSON non-string as string", "BOOL": ": attempt to access JSON non-boolean as boolean"}.get(datatype, "")
    assert str(caught.value).endswith(f"input 'X' expects {'BYTES' if datatype == 'STRING' else datatype}, got {shown}{triton}")


def test_strings_bools_and_numbers_of_their_own_kind_are_taken() -> None:
    request = generate_request(b'{"X": ["a", "b"]}', "m", "", _config("STRING"))
    assert request.inputs[0].data.tolist() == [b"a", b"b"]
    request = generate_request(b'{"X": [true, false]}', "m", "", _config("BOOL"))
    assert request.inputs[0].data.tolist() == [True, False]


def test_nan_and_infinity_literals_are_read_and_written_as_triton_does() -> None:
    request = generate_request(b'{"X": [NaN, -Infinity, 1.5]}', "m", "", _config("FP32"))
    values = request.inputs[0].data
    assert np.isnan(values[0]) and values[1] == -np.inf and values[2] == 1.5
    out = OutputTensor("Y", "FP32", (3,), np.array([np.nan, np.inf, 0.5], np.float32))
    body = generate_body(InferenceResponse("m", "1", outputs=[out, OutputTensor("Z", "FP32", (1,), np.ones(1, np.float32))]))
    assert body == b'{"model_name":"m","model_version":"1","Y":[NaN,Infinity,0.5],"Z":1.0}'
    with pytest.raises(NereidError, match="expects INT32, got NaN"):
        generate_request(b'{"X": [NaN]}', "m", "", _config("INT32"))


_LLM = parse_pbtxt(
    'name: "llm" max_batch_size: 0 input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },'
    ' { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] }, { name: "ids" data_type: TYPE_INT32 dims: [ 1, -1 ] } ]',
    "llm",
)


def test_values_are_shaped_to_the_input_s_dims_as_triton_pads_them() -> None:
    request = generate_request(b'{"PROMPT": "hi", "STREAM": [true], "ids": [1, 2, 3]}', "llm", "", _LLM)
    assert [t.shape for t in request.inputs] == [(1, 1), (1, 1), (1, 3)]
    with pytest.raises(NereidError, match="The schema can not convert input 'PROMPT' to tensor with proper shape"):
        generate_request(b'{"PROMPT": ["a", "b"]}', "llm", "", _LLM)


def test_a_key_that_names_no_input_is_a_request_parameter() -> None:
    request = generate_request(b'{"PROMPT": "hi", "temperature": 0.5, "stop": "x", "parameters": {"n": 2}}', "llm", "", _LLM)
    assert request.parameters == {"temperature": 0.5, "stop": "x", "n": 2}
    with pytest.raises(NereidError, match="parameter 'P' has invalid type. It should be either 'int', 'bool', or 'string'."):
        generate_request(b'{"PROMPT": "hi", "P": {"a": 1}}', "llm", "", _LLM)
    with pytest.raises(NereidError, match="Expected JSON object for keyword: 'parameters'"):
        generate_request(b'{"PROMPT": "hi", "parameters": 1}', "llm", "", _LLM)
    with pytest.raises(NereidError, match="Converting keyword: 'parameters': parameter 'nested' has invalid type."):
        generate_request(b'{"PROMPT": "hi", "parameters": {"nested": {"a": 1}}}', "llm", "", _LLM)
    with pytest.raises(NereidError, match="attempt to access JSON non-string as string"):
        generate_request(b'{"PROMPT": 123}', "llm", "", _LLM)


_TWO_INPUTS = parse_pbtxt(
    'name: "m" max_batch_size: 0 input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },'
    ' { name: "STREAM" data_type: TYPE_BOOL dims: [ 1 ] } ]',
    "m",
)


@pytest.mark.parametrize(
    ("body", "repeated"),
    [
        (b'{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate"}', "PROMPT"),
        (b'{"PROMPT": "hello", "STREAM": false, "STREAM": false}', "STREAM"),
        (b'{"PROMPT": "hello", "STREAM": false, "PROMPT": "duplicate", "STREAM": true}', "PROMPT"),  # the first repeat
        (b'{"PROMPT": "hello", "STREAM": false, "STREAM": true, "PROMPT": "duplicate"}', "STREAM"),
    ],
)
def test_an_input_given_twice_is_refused_as_triton_refuses_it(body: bytes, repeated: str) -> None:
    with pytest.raises(NereidError, match=f"input '{repeated}' already exists in request"):
        generate_request(body, "m", "", _TWO_INPUTS)


def test_an_input_name_repeated_only_inside_values_is_not_a_repeated_input() -> None:
    body = b'{"PROMPT": "say \\"PROMPT\\"", "STREAM": false, "parameters": {"PROMPT": 1, "STREAM": 2}}'
    request = generate_request(body, "m", "", _TWO_INPUTS)
    assert [t.name for t in request.inputs] == ["PROMPT", "STREAM"]
