"""The one decoder of Triton's request parameters: the reserved ones checked and set on the request, the others
passed to the model when they are strings, numbers, booleans or unset."""

from __future__ import annotations

from typing import Any

import pytest

from nereid.core.errors import NereidError, Status
from nereid.core.request_parameters import HIDDEN_PARAMETERS, apply_request_parameters, parameters_object
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.types import InferenceRequest


def _applied(parameters: dict[str, Any]) -> InferenceRequest:
    request = InferenceRequest("simple", "", [])
    apply_request_parameters(request, parameters)
    return request


def test_reserved_parameters_set_the_sequence_priority_and_timeout() -> None:
    parameters = {"sequence_id": "s1", "sequence_start": True, "sequence_end": True, "priority": 2, "timeout": 50, "x": None}
    request = _applied(parameters)
    assert request.parameters is parameters
    assert (request.correlation_id, request.flags, request.priority, request.timeout_us) == (
        "s1",
        SEQUENCE_START | SEQUENCE_END,
        2,
        50,
    )
    assert _applied({"sequence_start": False}).flags == 0


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("sequence_start", 1, "a boolean"),
        ("priority", -1, "an unsigned integer"),
        ("timeout", True, "an unsigned integer"),
        ("sequence_id", -5, "an unsigned integer or a string"),
        ("sequence_id", 1.5, "an unsigned integer or a string"),
    ],
)
def test_a_reserved_parameter_of_the_wrong_kind_is_refused_naming_it_and_the_model(key: str, value: Any, expected: str) -> None:
    with pytest.raises(NereidError) as excinfo:
        _applied({key: value})
    assert excinfo.value.status == Status.INVALID_ARG
    assert f"'{key}'" in excinfo.value.message and "'simple'" in excinfo.value.message and expected in excinfo.value.message


def test_another_parameter_must_be_a_scalar() -> None:
    with pytest.raises(NereidError) as excinfo:
        _applied({"custom": [1, 2]})
    assert "parameter 'custom'" in excinfo.value.message and "'int', 'bool', 'float' or 'string'" in excinfo.value.message


def test_a_json_parameters_field_must_be_an_object() -> None:
    assert parameters_object(None) == {} and parameters_object({}) == {} and parameters_object({"a": 1}) == {"a": 1}
    with pytest.raises(NereidError) as excinfo:
        parameters_object([1], "generate request")
    assert excinfo.value.message == "generate request 'parameters' must be a JSON object"


def test_the_hidden_names_are_the_reserved_ones_and_the_binary_data_size() -> None:
    assert HIDDEN_PARAMETERS == {
        "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "binary_data_size"
    }
