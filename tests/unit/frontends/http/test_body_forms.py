"""The HTTP codec's less common body forms: NaN/Infinity literals (read on a second parse only when orjson refuses
a body) and raw binary bodies for a model's single input. The differential tests ask real Triton the same."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from nereid.core.errors import NereidError
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.types import InferenceResponse, OutputTensor
from nereid.frontends.http.codec import decode_request, encode_response
from nereid.frontends.http.non_finite_json import dumps_with_non_finite, loads_with_non_finite
from nereid.frontends.http.raw_binary import decode_raw_request


def test_every_spelling_tritons_parser_reads_is_read_and_strings_are_left_alone() -> None:
    doc = loads_with_non_finite(b'{"a": [NaN, -NaN, Inf, -Inf, Infinity, -Infinity, 1.5], "s": "NaN \\" -Inf"}')
    assert math.isnan(doc["a"][0]) and math.isnan(doc["a"][1])
    assert doc["a"][2:] == [math.inf, -math.inf, math.inf, -math.inf, 1.5]
    assert doc["s"] == 'NaN " -Inf'


@pytest.mark.parametrize(
    "body",
    [b"[+Infinity]", b"[nan]", b"[1e999]", b'["\\ud800"]', b"[\xff]", b"[NaNNaN]", b"{not json"],
    ids=["plus_infinity", "lower_case", "too_big", "lone_surrogate", "invalid_utf8", "glued", "garbage"],
)
def test_what_orjson_refuses_for_other_reasons_stays_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        loads_with_non_finite(body)


def _body(datatype: str, data: str) -> bytes:
    return b'{"inputs":[{"name":"IN","datatype":"%s","shape":[2],"data":%s}]}' % (datatype.encode(), data.encode())


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "FP32", "FP64"])
def test_non_finite_literals_are_float_data(datatype: str) -> None:
    request = decode_request(_body(datatype, "[NaN, -Infinity]"), None, "m", "", SharedMemoryRegistry())
    assert request.inputs[0].data.shape == (2,)


@pytest.mark.parametrize("datatype", ["INT32", "UINT8", "BOOL", "BYTES"])
def test_non_finite_literals_in_other_data_are_refused_naming_the_input(datatype: str) -> None:
    with pytest.raises(NereidError, match=f"input 'IN' for model 'm': expected {datatype} values, got NaN"):
        decode_request(_body(datatype, "[NaN, 1]"), None, "m", "", SharedMemoryRegistry())


@pytest.mark.parametrize("request_id", ["5", "{}", "null", "true", "[1]"])
def test_a_request_id_that_is_not_a_string_is_refused(request_id: str) -> None:
    body = b'{"id": %s, "inputs": []}' % request_id.encode()
    with pytest.raises(NereidError, match="Unable to parse 'id'"):
        decode_request(body, None, "m", "", SharedMemoryRegistry())


def test_json_outputs_write_tritons_literals_only_where_values_are_not_finite() -> None:
    out = OutputTensor("OUT", "FP32", (3,), np.array([math.nan, math.inf, 0.25], np.float32))
    request = decode_request(_body("FP32", "[1, 2]"), None, "m", "", SharedMemoryRegistry())
    body, length = encode_response(InferenceResponse("m", "1", "", [out]), request)
    assert length is None
    assert b'"data":[NaN,Infinity,0.25]' in body
    finite = OutputTensor("OUT", "FP32", (1,), np.array([0.1], np.float32))
    body, _ = encode_response(InferenceResponse("null", "1", "", [finite]), request)  # a null-looking name
    assert orjson.loads(body)["outputs"][0]["data"] == [pytest.approx(0.1)]
    assert dumps_with_non_finite({"outputs": [{"data": np.array([-math.inf], np.float16)}]}) == b'{"outputs":[{"data":[-Infinity]}]}'


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_a_raw_body_fills_the_variable_dimension_and_a_batching_model_gets_a_batch_of_one() -> None:
    config = _config('name: "m" max_batch_size: 4 input [ { name: "X" data_type: TYPE_INT16 dims: [ 2, -1 ] } ]')
    request = decode_raw_request(np.arange(6, dtype=np.int16).tobytes(), "m", "", config)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", "INT16", (1, 2, 3))
    np.testing.assert_array_equal(tensor.data, np.arange(6, dtype=np.int16).reshape(1, 2, 3))
    assert request.parameters == {"binary_data_output": True}


def test_a_raw_body_for_a_bytes_input_is_the_one_element() -> None:
    config = _config('name: "m" input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]')
    (tensor,) = decode_raw_request(b"\x05\x00\x00\x00hello", "m", "", config).inputs
    assert tensor.shape == (1,) and tensor.data[0] == b"\x05\x00\x00\x00hello"


@pytest.mark.parametrize(
    ("config", "body", "message"),
    [
        (
            'name: "m" input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            bytes(8),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration",
        ),
        (
            'name: "m" input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]',
            bytes(8),
            "The shape of the raw input 'A' can not be deduced because there are more than one variable-sized dimension",
        ),
        (
            'name: "m" input [ { name: "A" data_type: TYPE_STRING dims: [ -1 ] } ]',
            b"x",
            "For BYTE datatype raw input 'A', the model must have input shape [1]",
        ),
        (
            'name: "m" input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]',
            bytes(7),
            "input byte size mismatch for input 'raw_input' for model 'm'. Expected 4, got 7",
        ),
    ],
    ids=["two_inputs", "two_variable_dims", "bytes_shape", "partial_element"],
)
def test_a_raw_body_that_cannot_be_deduced_gets_tritons_error(config: str, body: bytes, message: str) -> None:
    with pytest.raises(NereidError) as caught:
        decode_raw_request(body, "m", "", _config(config))
    assert message in caught.value.message
