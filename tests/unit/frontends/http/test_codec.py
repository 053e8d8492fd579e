"""The HTTP /infer codec against bodies the official tritonclient writes and reads: JSON and binary tensors in,
reserved parameters into request fields (sequence flags, priority, timeout), responses back as JSON or binary, and
refusals of malformed bodies with INVALID_ARG and words that name the tensor and model."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid.core.errors import NereidError, Status
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor
from nereid.frontends.http import codec
from nereid.frontends.http.codec import decode_request, encode_response

_Client = httpclient.InferenceServerClient


def _input(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _decode(body: bytes, header_length: int | None) -> InferenceRequest:
    return decode_request(body, header_length, "simple", "", SharedMemoryRegistry())


@pytest.mark.parametrize("binary", [False, True])
def test_client_tensors_decode_to_the_same_arrays(binary: bool) -> None:
    fp = np.arange(6, dtype=np.float32).reshape(2, 3)
    ints = np.array([[-1, 7]], dtype=np.int64)
    text = np.array([b"a", b"", "é".encode()], dtype=np.object_)
    flags = np.array([True, False])
    inputs = [
        _input("FP", fp, "FP32", binary),
        _input("INTS", ints, "INT64", binary),
        _input("TEXT", text, "BYTES", binary),
        _input("FLAGS", flags, "BOOL", binary),
    ]
    body, json_size = _Client.generate_request_body(inputs, request_id="r-1")
    request = _decode(body, json_size)
    assert request.id == "r-1" and request.model_name == "simple"
    got = {t.name: t for t in request.inputs}
    assert [t.name for t in request.inputs] == ["FP", "INTS", "TEXT", "FLAGS"]
    np.testing.assert_array_equal(got["FP"].data, fp)
    assert got["FP"].data.dtype == np.float32 and got["FP"].shape == (2, 3)
    np.testing.assert_array_equal(got["INTS"].data, ints)
    assert got["TEXT"].data.tolist() == text.tolist()
    np.testing.assert_array_equal(got["FLAGS"].data, flags)


def test_reserved_parameters_become_request_fields() -> None:
    body, json_size = _Client.generate_request_body(
        [_input("X", np.zeros(1, np.float32), "FP32", False)],
        sequence_id=42,
        sequence_start=True,
        sequence_end=True,
        priority=2,
        timeout=1500,
    )
    request = _decode(body, json_size)
    assert request.correlation_id == 42
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert request.priority == 2 and request.timeout_us == 1500
    body, json_size = _Client.generate_request_body([_input("X", np.zeros(1, np.float32), "FP32", False)], sequence_id=7, sequence_end=True)
    assert _decode(body, json_size).flags == SEQUENCE_END


def test_requested_outputs_keep_their_binary_choice() -> None:
    outputs = [httpclient.InferRequestedOutput("A", binary_data=True), httpclient.InferRequestedOutput("B", binary_data=False)]
    body, json_size = _Client.generate_request_body([_input("X", np.zeros(1, np.float32), "FP32", False)], outputs=outputs)
    request = _decode(body, json_size)
    assert request.outputs is not None
    assert [(o.name, o.parameters.get("binary_data")) for o in request.outputs] == [("A", True), ("B", False)]


def _response(*outputs: OutputTensor, **fields: Any) -> InferenceResponse:
    return InferenceResponse("simple", "1", id="r-9", outputs=list(outputs), **fields)


@pytest.mark.parametrize("binary", [False, True])
def test_responses_read_back_through_the_client(binary: bool) -> None:
    fp = np.array([[1.5, -2.0]], dtype=np.float32)
    text = np.array([b"x", b"yz"], dtype=np.object_)
    response = _response(OutputTensor("FP", "FP32", fp.shape, fp), OutputTensor("TEXT", "BYTES", text.shape, text))
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("FP", "TEXT")]
    req_body, json_size = _Client.generate_request_body([_input("X", np.zeros(1, np.float32), "FP32", False)], outputs=outputs)
    body, header_length = encode_response(response, _decode(req_body, json_size))
    assert (header_length is not None) == binary
    result = _Client.parse_response_body(body, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("FP"), fp)
    # A JSON string reads back as text, as it does from Triton; binary BYTES keep their bytes.
    assert result.as_numpy("TEXT").tolist() == (text.tolist() if binary else ["x", "yz"])
    assert result.get_response()["id"] == "r-9" and result.get_response()["model_version"] == "1"


def test_non_finite_floats_are_written_as_tritons_literals() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    as_json = [httpclient.InferRequestedOutput("Y", binary_data=False)]
    request = _decode(*_Client.generate_request_body([_input("X", np.zeros(1, np.float32), "FP32", False)], outputs=as_json))
    body, header_length = encode_response(_response(OutputTensor("Y", "FP32", values.shape, values)), request)
    assert header_length is None
    assert b"NaN" in body and b"Infinity" in body and b"-Infinity" in body


def test_response_parameters_are_written_beside_the_outputs() -> None:
    request = _decode(*_Client.generate_request_body([_input("X", np.zeros(1, np.float32), "FP32", False)]))
    body, _ = encode_response(_response(parameters={"sequence_id": 3}), request)
    assert _Client.parse_response_body(body).get_response()["parameters"] == {"sequence_id": 3}


@pytest.mark.parametrize(
    ("body", "header_length", "words"),
    [
        (b"{not json", None, "failed to parse the request JSON buffer"),
        (b"[1]", None, "expected a JSON object"),
        (b"{}", None, "must have an 'inputs' array"),
        (b'{"id": 5, "inputs": []}', None, "Unable to parse 'id'"),
        (b'{"inputs": [{"name": "X", "shape": [1], "data": [1]}]}', None, "input 'X' for model 'simple' needs a 'datatype'"),
        (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1]}]}', None, "has no 'data', binary data or shared memory"),
        (
            b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}abcd',
            100,
            "unexpected size for input 'X', expecting 8 additional bytes",
        ),
        (b'{"inputs": []}', 999, "is larger than the"),
        (b'{"inputs": []}xx', 14, "2 bytes of binary data that no input claims"),
    ],
)
def test_malformed_bodies_are_refused_as_invalid_arg(body: bytes, header_length: int | None, words: str) -> None:
    with pytest.raises(NereidError) as refused:
        _decode(body, header_length)
    assert refused.value.status == Status.INVALID_ARG
    assert words in refused.value.message


@pytest.mark.parametrize(
    "datatype, data, shown",
    [
        ("FP32", [True, 1.0], "true"),
        ("FP32", [None, 1.0], "null"),
        ("FP64", ["1.0", 1.0], '"1.0"'),
        ("INT32", [1.5, 2], "1.5"),
        ("INT64", [1.0, 2], "1.0"),
        ("INT8", [True, 2], "true"),
        ("BOOL", [1, 0], "1"),
        ("UINT16", [[1], ["x"]], '"x"'),
    ],
)
def test_json_data_of_the_wrong_kind_for_its_type_is_refused_naming_the_value(datatype: str, data: list, shown: str) -> None:
    """Triton's parser takes numbers for floats, integers for integer types, true/false for BOOL; numpy would
    quietly turn a bool, null or string into a number, or truncate 1.5."""
    body = b'{"inputs":[{"name":"X","datatype":"%s","shape":[2],"data":%s}]}' % (datatype.encode(), json.dumps(data).encode())
    with pytest.raises(NereidError) as refused:
        _decode(body, None)
    assert refused.value.status == Status.INVALID_ARG
    assert refused.value.message == f"Unable to parse 'data' of input 'X' for model 'simple': expected {datatype} values, got {shown}"


@pytest.mark.parametrize("data", [[[1.0], [2.0, 3.0]], [[[1, 2]], [[3]]], [1, 2, 3]])
def test_json_data_nested_in_any_shape_is_flattened_as_triton_reads_it(data: list) -> None:
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[3],"data":%s}]}' % json.dumps(data).encode()
    assert _decode(body, None).inputs[0].data.tolist() == [1.0, 2.0, 3.0]


def test_deeply_nested_json_data_is_refused_without_exhausting_the_stack() -> None:
    data = "[" * 1000 + "1.0" + "]" * 1000  # orjson's own nesting limit is 1024
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":%s}]}' % data.encode()
    with pytest.raises(NereidError, match=r"JSON nesting depth exceeds maximum allowed limit \(100\)"):
        _decode(body, None)


def test_a_binary_size_mismatch_names_the_input_and_model() -> None:
    header = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}]}'
    with pytest.raises(NereidError, match="input byte size mismatch for input 'X' for model 'simple'. Expected 8, got 4"):
        _decode(header + b"abcd", len(header))


def test_a_bytes_element_that_is_not_a_string_is_refused_without_allocating_it() -> None:
    """bytes(n) of a JSON number would allocate n zero bytes: 10**10 here would be 10 GB."""
    body = b'{"inputs":[{"name":"IN","datatype":"BYTES","shape":[1],"data":[10000000000]}]}'
    with pytest.raises(NereidError) as refused:
        _decode(body, None)
    assert refused.value.status is Status.INVALID_ARG
    assert "input 'IN'" in refused.value.message and "expected a string, got int" in refused.value.message


def _binary_body(values: np.ndarray, request_id: str = "") -> tuple[bytes, int]:
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    body, json_size = _Client.generate_request_body([_input("X", values, "FP32", True)], outputs=outputs, request_id=request_id)
    return body, json_size


def test_a_repeated_binary_header_decodes_each_requests_own_data_into_its_own_objects() -> None:
    first_body, size = _binary_body(np.array([[1, 2]], dtype=np.float32), "same")
    second_body, second_size = _binary_body(np.array([[3, 4]], dtype=np.float32), "same")
    assert first_body[:size] == second_body[:second_size]  # one header: the second request reuses its decoding
    first = _decode(first_body, size)
    first.inputs[0].parameters["changed"] = True  # what one request does to its objects stays its own
    assert first.outputs is not None
    first.outputs[0].parameters["binary_data"] = False
    first.parameters["forwarded"] = "x"
    assert codec._plan_key(first_body[:size])[0] in codec._PLANS
    second = _decode(second_body, second_size)
    assert second.id == "same" and second.inputs[0].shape == (1, 2)
    np.testing.assert_array_equal(second.inputs[0].data, [[3, 4]])
    np.testing.assert_array_equal(first.inputs[0].data, [[1, 2]])
    assert second.inputs[0].parameters == {"binary_data_size": 8}
    assert second.outputs is not None and second.outputs[0].parameters == {"binary_data": True}
    assert second.parameters == {}


def test_headers_that_differ_only_by_a_leading_request_id_share_one_plan_and_keep_their_own_ids() -> None:
    """perf_analyzer's async mode and tritonclient's request_id send a new id with every request."""
    codec._PLANS._plans.clear()
    values = np.array([[1, 2]], dtype=np.float32)
    bodies = [_binary_body(values + i, f"req-{i}") for i in range(3)]
    compact = b'{"id":"pa-7","inputs":[{"name":"X","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}}]}'
    bodies.append((compact + values.tobytes(), len(compact)))  # perf_analyzer writes it without spaces
    decoded = [_decode(body, size) for body, size in bodies]
    assert [r.id for r in decoded] == ["req-0", "req-1", "req-2", "pa-7"]
    np.testing.assert_array_equal(decoded[2].inputs[0].data, [[3, 4]])
    assert len(codec._PLANS._plans) == 2  # one per spelling, not one per id
    # The same header without its id equals a cut key but for ID_CUT: it never takes the plan made for cut ids.
    bare = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}}]}'
    assert _decode(bare + values.tobytes(), len(bare)).id == ""
    assert _decode(compact + values.tobytes(), len(compact)).id == "pa-7"


def test_tritonclients_binary_output_request_is_planned_and_keeps_its_parameter() -> None:
    """tritonclient asks for binary outputs with the reserved binary_data_output: checked, not a setting."""
    codec._PLANS._plans.clear()
    first_body, size = _Client.generate_request_body([_input("X", np.array([1, 2], np.float32), "FP32", True)])
    first = _decode(first_body, size)
    assert codec._plan_key(first_body[:size])[0] in codec._PLANS
    first.parameters["binary_data_output"] = False  # stays the first request's own
    second_body, _ = _Client.generate_request_body([_input("X", np.array([3, 4], np.float32), "FP32", True)])
    second = _decode(second_body, size)
    assert second.parameters == {"binary_data_output": True}
    np.testing.assert_array_equal(second.inputs[0].data, [3, 4])


def test_an_id_the_key_cannot_cut_safely_stays_in_the_key() -> None:
    escaped = b'{"id":"a\\"b","inputs":[]}'
    assert codec._plan_key(escaped) == (escaped, None)
    repeated = b'{"id":"a","inputs":[],"id":"b"}'  # JSON's last value wins: "b"
    assert codec._plan_key(repeated) == (repeated, None)
    not_utf8 = b'{"id":"\xff","inputs":[]}'
    assert codec._plan_key(not_utf8) == (not_utf8, None)
    with pytest.raises(NereidError, match="failed to parse the request JSON"):  # decoded in full, and refused
        _decode(not_utf8, len(not_utf8))
    header = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}],"id":"z"}'
    assert codec._plan_key(header) == (header, None)  # an id further in is part of the header, as before
    for request_id in ("first", "second"):
        body = header.replace(b'"z"', b'"%s"' % request_id.encode())
        assert _decode(body + b"\x00\x00\x80\x3f", len(body)).id == request_id


def test_a_repeated_header_with_the_wrong_amount_of_binary_data_is_still_refused() -> None:
    body, size = _binary_body(np.array([1, 2], dtype=np.float32))
    _decode(body, size)
    with pytest.raises(NereidError, match="unexpected size for input 'X'"):
        _decode(body[:-4], size)
    with pytest.raises(NereidError, match="binary data that no input claims"):
        _decode(body + b"abcd", size)


def test_a_repeated_header_of_bytes_or_with_parameters_is_decoded_every_time() -> None:
    good = np.array([b"ok"], dtype=np.object_)
    body, size = _Client.generate_request_body([_input("T", good, "BYTES", True)])
    assert _decode(body, size).inputs[0].data.tolist() == [b"ok"]
    bad = body[:size] + b"\xff\xff\xff\x7fok"  # the same header, an element length past the data
    with pytest.raises(NereidError, match="input 'T' for model 'simple'"):
        _decode(bad, size)
    header = b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"parameters":{"binary_data_size":4}}],' \
             b'"parameters":{"priority":2}}'
    assert _decode(header + b"\x01\x00\x00\x00", len(header)).priority == 2
    assert _decode(header + b"\x02\x00\x00\x00", len(header)).priority == 2


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ([2**4, 2**60 + 2], "invalid shape for input 'INPUT0': shape [16,1152921504606846978] causes total element count to exceed maximum size of 9223372036854775807"),
        ([2**2, 2**60 + 2], "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data type size (4) exceeds maximum allowed size (9223372036854775807)"),
    ],
)
def test_a_json_shape_whose_size_overflows_64_bits_is_refused_in_triton_s_words(shape: list[int], words: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": [1.0]}]}).encode()
    with pytest.raises(NereidError) as caught:
        _decode(body, None)
    assert caught.value.status is Status.INVALID_ARG and caught.value.message == words


@pytest.mark.parametrize("datatype", ["INT64", "BYTES"])
@pytest.mark.parametrize("padding", [0, 5000])  # orjson's path and simdjson's (bodies past 4 kB)
def test_json_data_nested_as_deep_as_triton_s_limit_is_refused(datatype: str, padding: int) -> None:
    value = '"x"' if datatype == "BYTES" else "1"

    def body(depth: int) -> bytes:
        data = "[" * depth + value + "]" * depth
        return b'{"inputs":[{"name":"X","datatype":"%s","shape":[1],"data":%s}],"id":"%s"}' % (
            datatype.encode(), data.encode(), b"p" * padding)  # fmt: skip

    assert _decode(body(99), None).inputs[0].data.size == 1
    with pytest.raises(NereidError) as refused:
        _decode(body(100), None)
    assert refused.value.status == Status.INVALID_ARG
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in refused.value.message


def test_bytes_that_are_not_utf8_are_refused_as_json_and_sent_whole_as_binary() -> None:
    values = np.array([b"ok", b"\xfa\x00\xff"], dtype=np.object_)
    output = OutputTensor("OUT", "BYTES", values.shape, values)
    as_json = _decode(b'{"inputs":[],"outputs":[{"name":"OUT","parameters":{"binary_data":false}}]}', None)
    with pytest.raises(NereidError, match="output 'OUT' holds BYTES that are not valid UTF-8") as refused:
        encode_response(_response(output), as_json)
    assert refused.value.status is Status.INVALID_ARG
    as_binary = _decode(b'{"inputs":[],"outputs":[{"name":"OUT","parameters":{"binary_data":true}}]}', None)
    body, header_length = encode_response(_response(output), as_binary)
    assert header_length is not None and body[header_length:].endswith(b"\xfa\x00\xff")


def test_a_json_parameter_named_triton_something_is_refused_as_tritonserver_refuses_it() -> None:
    body = b'{"inputs":[],"parameters":{"triton_enable_empty_final_response":"dummy-value"}}'
    with pytest.raises(NereidError, match="parameter 'triton_enable_empty_final_response' is a parameter name reserved for Triton usage"):
        _decode(body, None)
