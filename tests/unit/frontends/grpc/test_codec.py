"""The gRPC ModelInfer codec against messages the official tritonclient builds and reads: raw and typed contents,
reserved parameters (a negative int64 sequence id read as Triton reads it), typed parameters both ways, responses
back through the client, and Triton's refusals for contents that do not add up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from nereid.core.errors import NereidError, Status
from nereid.core.sequence_flags import SEQUENCE_START
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.types import InferenceResponse, OutputTensor
from nereid.frontends.grpc import codec
from nereid.frontends.grpc.codec import (
    _header_of,
    decode_infer_request,
    dict_to_parameters,
    encode_infer_response,
    parameters_to_dict,
)


def _message(inputs: list[grpcclient.InferInput], **options: object) -> pb.ModelInferRequest:
    defaults: dict[str, object] = {
        "model_version": "",
        "request_id": "g-1",
        "outputs": None,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    defaults.update(options)
    return _get_inference_request(model_name="simple", inputs=inputs, **defaults)


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_raw_contents_from_the_client_decode_to_the_same_arrays() -> None:
    fp = np.arange(4, dtype=np.float16).reshape(2, 2)
    text = np.array([b"hello", b""], dtype=np.object_)
    request = decode_infer_request(_message([_input("FP", fp, "FP16"), _input("TEXT", text, "BYTES")]), SharedMemoryRegistry())
    assert request.id == "g-1" and [t.name for t in request.inputs] == ["FP", "TEXT"]
    np.testing.assert_array_equal(request.inputs[0].data, fp)
    assert request.inputs[0].data.dtype == np.float16
    assert request.inputs[1].data.tolist() == [b"hello", b""]


def test_typed_contents_decode_like_raw_ones() -> None:
    message = pb.ModelInferRequest(model_name="simple")
    tensor = message.inputs.add(name="X", datatype="INT32", shape=[3])
    tensor.contents.int_contents.extend([1, -2, 3])
    request = decode_infer_request(message, SharedMemoryRegistry())
    assert request.inputs[0].data.dtype == np.int32 and request.inputs[0].data.tolist() == [1, -2, 3]


def test_reserved_parameters_and_a_negative_int64_sequence_id() -> None:
    message = _message([_input("X", np.zeros(1, np.float32), "FP32")], sequence_id=5, sequence_start=True, priority=3, timeout=99)
    request = decode_infer_request(message, SharedMemoryRegistry())
    assert (request.correlation_id, request.flags, request.priority, request.timeout_us) == (5, SEQUENCE_START, 3, 99)
    message.parameters["sequence_id"].int64_param = -1
    assert decode_infer_request(message, SharedMemoryRegistry()).correlation_id == (1 << 64) - 1


def test_typed_parameters_round_trip() -> None:
    values = {"flag": True, "count": -4, "name": "x", "ratio": 0.5}
    message = pb.ModelInferResponse()
    dict_to_parameters(message.parameters, values)
    assert parameters_to_dict(message.parameters) == values


def test_responses_read_back_through_the_client() -> None:
    fp = np.array([[0.25, 1.0]], dtype=np.float32)
    text = np.array([b"a", b"bc"], dtype=np.object_)
    response = InferenceResponse(
        "simple", "1", id="g-2",
        outputs=[OutputTensor("FP", "FP32", fp.shape, fp), OutputTensor("TEXT", "BYTES", text.shape, text)],
        parameters={"sequence_id": 8},
    )
    result = grpcclient.InferResult(encode_infer_response(response))
    np.testing.assert_array_equal(result.as_numpy("FP"), fp)
    assert result.as_numpy("TEXT").tolist() == [b"a", b"bc"]
    assert result.get_response().id == "g-2"
    assert parameters_to_dict(result.get_response().parameters) == {"sequence_id": 8}


def test_contents_beside_raw_contents_and_missing_data_are_refused() -> None:
    message = _message([_input("X", np.zeros(2, np.float32), "FP32")])
    message.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(NereidError, match="contents field must not be specified when using raw_input_contents for 'X'") as refused:
        decode_infer_request(message, SharedMemoryRegistry())
    assert refused.value.status == Status.INVALID_ARG
    empty = pb.ModelInferRequest(model_name="simple")
    empty.inputs.add(name="Y", datatype="FP32", shape=[1])
    with pytest.raises(NereidError, match="unable to find data for input tensor 'Y' for model 'simple' in request."):
        decode_infer_request(empty, SharedMemoryRegistry())
    extra = _message([_input("X", np.zeros(2, np.float32), "FP32")])
    extra.raw_input_contents.append(b"spare")
    with pytest.raises(NereidError, match="has 2 raw input contents but only 1 inputs read raw contents"):
        decode_infer_request(extra, SharedMemoryRegistry())


def test_a_raw_size_that_does_not_match_the_shape_names_tensor_and_model() -> None:
    message = _message([_input("X", np.zeros(2, np.float32), "FP32")])
    message.raw_input_contents[0] = b"\0" * 4
    with pytest.raises(NereidError, match="input byte size mismatch for input 'X' for model 'simple'. Expected 8, got 4"):
        decode_infer_request(message, SharedMemoryRegistry())


@pytest.mark.parametrize("value", [pb.InferParameter(), pb.InferParameter(uint64_param=7)])
def test_a_parameter_of_a_kind_triton_refuses_is_refused_in_its_words(value: pb.InferParameter) -> None:
    message = _message([_input("IN", np.zeros(2, np.float32), "FP32")], priority=3)  # priority: a uint64_param
    message.parameters["custom"].CopyFrom(value)
    with pytest.raises(NereidError) as excinfo:
        decode_infer_request(message, SharedMemoryRegistry())
    assert excinfo.value.message == "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param."
    message.parameters["custom"].CopyFrom(pb.InferParameter(double_param=1.5))
    assert decode_infer_request(message, SharedMemoryRegistry()).parameters["custom"] == 1.5


def _raw_message(values: np.ndarray) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id="same")
    message.parameters["triton_enable_empty_final_response"].bool_param = True  # as perf_analyzer sends
    tensor = message.inputs.add(name="X", datatype="FP32", shape=list(values.shape))
    tensor.parameters["note"].string_param = "kept"
    message.outputs.add(name="OUT").parameters["binary_data"].bool_param = True
    message.raw_input_contents.append(values.astype(np.float32).tobytes())
    return message


def _decode_payload(payload: bytes, forwarded: dict[str, str] | None = None) -> object:
    return decode_infer_request(pb.ModelInferRequest.FromString(payload), SharedMemoryRegistry(), forwarded, payload)


def test_a_repeated_raw_request_header_decodes_each_requests_own_data_into_its_own_objects() -> None:
    first_payload = _raw_message(np.array([[1, 2]])).SerializeToString()
    second_payload = _raw_message(np.array([[3, 4]])).SerializeToString()
    assert first_payload[:-8] == second_payload[:-8]  # one header: the second request reuses its decoding
    first = _decode_payload(first_payload)
    first.inputs[0].parameters["changed"] = True  # type: ignore[attr-defined]  # stays the first request's own
    first.outputs[0].parameters["binary_data"] = False  # type: ignore[attr-defined]
    first.parameters["changed"] = True  # type: ignore[attr-defined]
    second = _decode_payload(second_payload, {"forwarded": "yes"})
    assert second.id == "same" and second.model_name == "m" and second.inputs[0].shape == (1, 2)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(second.inputs[0].data, [[3, 4]])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(first.inputs[0].data, [[1, 2]])  # type: ignore[attr-defined]
    assert second.inputs[0].parameters == {"note": "kept"}  # type: ignore[attr-defined]
    assert second.outputs[0].parameters == {"binary_data": True}  # type: ignore[attr-defined]
    assert second.parameters == {"triton_enable_empty_final_response": True, "forwarded": "yes"}  # type: ignore[attr-defined]
    assert codec._plan_key(first_payload[:-10], pb.ModelInferRequest.FromString(first_payload))[0] in codec._PLANS
    with pytest.raises(NereidError, match="Expected 8, got 12"):  # other sizes: decoded, and refused, in full
        wrong = _raw_message(np.array([[1, 2]]))
        wrong.raw_input_contents[0] = np.zeros(3, np.float32).tobytes()
        _decode_payload(wrong.SerializeToString())


def test_requests_that_differ_only_by_their_id_share_one_plan_and_keep_their_own_ids() -> None:
    """perf_analyzer's async mode sends a new id with every request."""
    codec._PLANS._plans.clear()
    ids = ["1", "2", "a much longer id " * 10, ""]
    decoded: list[Any] = []
    for i, request_id in enumerate(ids):
        message = _raw_message(np.array([[i, i]]))
        message.id = request_id
        message.model_version = "1" if i else ""
        decoded.append(_decode_payload(message.SerializeToString()))
    assert [request.id for request in decoded] == ids
    np.testing.assert_array_equal(decoded[2].inputs[0].data, [[2, 2]])
    # Without a version, with one, and without an id: three keys, not one per id.
    assert len(codec._PLANS._plans) == 3
    message = _raw_message(np.array([[1, 2]]))
    message.id = "fresh"
    header = message.SerializeToString()[:-10]
    assert codec._plan_key(header, message) == (codec.ID_CUT + header.replace(b"\x1a\x05fresh", b""), "fresh")
    other = pb.ModelInferRequest()
    other.MergeFrom(message)
    other.id = "other"  # the parsed id is not the field at the header's id place: the header stays whole
    assert codec._plan_key(header, other) == (header, None)


def test_the_header_is_only_what_comes_before_raw_contents_written_last() -> None:
    message = _raw_message(np.array([1, 2]))
    payload = message.SerializeToString()
    raw = list(message.raw_input_contents)
    assert _header_of(payload, raw) == payload[: len(payload) - 10]
    # Raw contents first and the name after (a valid order no client we know uses): no header, no plan.
    reordered = payload[len(payload) - 10 :] + payload[: len(payload) - 10]
    assert _header_of(reordered, raw) is None
    assert pb.ModelInferRequest.FromString(reordered) == message
    request = _decode_payload(reordered)
    np.testing.assert_array_equal(request.inputs[0].data, [1, 2])  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["sequence_id", "timeout", "headers", "triton_final_response"])
def test_forwarded_metadata_that_takes_a_name_reserved_for_triton_is_refused(name: str) -> None:
    payload = _raw_message(np.array([[1, 2]])).SerializeToString()
    with pytest.raises(NereidError, match=f"header '{name}' is a parameter name reserved for Triton usage"):
        _decode_payload(payload, {name: "dummy-value"})
