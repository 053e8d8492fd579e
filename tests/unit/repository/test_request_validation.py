"""RequestValidator: a request checked against its model's config with Triton's messages, and its batch size set."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InputTensor, RequestedOutput
from nereid.repository.request_validation import RequestValidator

_CONFIG = """
name: "m"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ -1, 2 ] },
  { name: "C" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "R" data_type: TYPE_FP32 dims: [ 3 ] optional: true allow_ragged_batch: true }
]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _validator(text: str = _CONFIG) -> RequestValidator:
    return RequestValidator(parse_pbtxt(text, "test"))


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> InputTensor:
    return InputTensor(name, datatype, shape, np.zeros(shape, dtype=np.float32))


def _request(*inputs: InputTensor, outputs: list[str] | None = None) -> InferenceRequest:
    wanted = None if outputs is None else [RequestedOutput(n) for n in outputs]
    return InferenceRequest("m", "", list(inputs), id="r1", outputs=wanted)


def _a(batch: int = 2) -> InputTensor:
    return _tensor("A", "FP32", (batch, 4))


def _b(batch: int = 2, rows: int = 5) -> InputTensor:
    return _tensor("B", "INT32", (batch, rows, 2))


def _message(request: InferenceRequest, validator: RequestValidator | None = None) -> str:
    with pytest.raises(NereidError) as raised:
        (validator or _validator()).validate(request)
    return raised.value.message


def test_a_valid_request_gets_its_batch_size_whatever_the_order_and_variable_dims() -> None:
    request = _request(_b(3, rows=7), _a(3))
    _validator().validate(request)
    assert request.batch_size == 3


def test_optional_inputs_may_be_given_or_left_out() -> None:
    request = _request(_a(), _b(), _tensor("C", "FP32", (2, 1)))
    _validator().validate(request)
    assert request.batch_size == 2


def test_a_fixed_dim_that_differs_is_refused_with_triton_s_message() -> None:
    message = _message(_request(_tensor("A", "FP32", (2, 5)), _b()))
    assert message.startswith(
        "[request id: r1] unexpected shape for input 'A' for model 'm'. Expected [-1,4], got [2,5]. NOTE: Setting"
    )


def test_a_shape_of_the_wrong_rank_is_refused() -> None:
    assert "Expected [-1,-1,2], got [2,2]." in _message(_request(_a(), _tensor("B", "INT32", (2, 2))))


def test_a_ragged_input_may_have_any_shape() -> None:
    request = _request(_a(), _b(), _tensor("R", "FP32", (2, 9)))
    _validator().validate(request)


def test_a_missing_required_input_is_named() -> None:
    message = _message(_request(_a()))
    assert "expected number of inputs between 2 and 4 but got 1 inputs for model 'm'" in message
    assert "missing required input(s) ['B']" in message
    message = _message(_request())
    assert "Got input(s) [], but missing required input(s) ['A','B']. Please provide all required input(s)." in message


def test_an_input_given_twice_is_refused_even_when_the_count_matches() -> None:
    assert "input 'A' was given more than once for model 'm'" in _message(_request(_a(), _a()))
    assert "input 'A' was given more than once" in _message(_request(_a(), _b(), _a()))


def test_an_unknown_input_a_wrong_datatype_and_a_batch_mismatch_are_refused() -> None:
    assert _message(_request(_a(), _b(), _tensor("Z", "FP32", (2, 1)))) == "unexpected inference input 'Z' for model 'm'"
    assert "inference input 'A' data-type is 'INT32', but model 'm' expects 'FP32'" in _message(
        _request(_tensor("A", "INT32", (2, 4)), _b())
    )
    assert "input 'B' batch size does not match other inputs for 'm'" in _message(_request(_a(2), _b(3)))


def test_a_batch_over_the_maximum_and_an_unknown_output_are_refused() -> None:
    assert "inference request batch-size must be <= 8 for 'm'" in _message(_request(_a(9), _b(9)))
    assert _message(_request(_a(), _b(), outputs=["NOPE"])) == "unexpected inference output 'NOPE' for model 'm'"


def test_an_output_requested_twice_is_refused_with_triton_s_message() -> None:
    assert _message(_request(_a(), _b(), outputs=["OUT", "OUT"])) == "[request id: r1] output 'OUT' already exists in request"


def test_without_batching_the_whole_shape_is_compared_and_the_batch_size_is_one() -> None:
    validator = _validator('name: "m" max_batch_size: 0 input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]')
    request = _request(_tensor("A", "FP32", (2, 3)))
    validator.validate(request)
    assert request.batch_size == 1
    assert "Expected [2,3], got [3,2]. " in _message(_request(_tensor("A", "FP32", (3, 2))), validator)

