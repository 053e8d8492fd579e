"""pb_utils reads string arguments as Triton's pybind11 layer does: str, numpy.str_, bytes, numpy.bytes_ and
bytearray are text; other types are refused. (The differential tests run the same calls on real Triton.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nereid.backends.python import pb_utils
from nereid.backends.python.pb_strings import as_message, as_text

FORMS = [
    pytest.param("name", id="str"),
    pytest.param(b"name", id="bytes"),
    pytest.param(np.bytes_(b"name"), id="numpy_bytes"),
    pytest.param(np.str_("name"), id="numpy_str"),
    pytest.param(bytearray(b"name"), id="bytearray"),
    pytest.param(np.array([b"name"], dtype=object)[0], id="bytes_tensor_element"),
]


@pytest.mark.parametrize("value", FORMS)
def test_every_text_form_becomes_a_plain_str(value: Any) -> None:
    text = as_text(value, "argument")
    assert text == "name" and type(text) is str


@pytest.mark.parametrize("value", [7, None, 1.5, memoryview(b"name"), ["name"]])
def test_other_types_are_refused_naming_the_argument(value: Any) -> None:
    with pytest.raises(TypeError, match="model_name"):
        as_text(value, "model_name")


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(TypeError, match="not UTF-8"):
        as_text(b"\xff\xfe", "model_name")


def test_messages_take_any_value_and_decode_bytes() -> None:
    assert as_message(b"hello") == "hello"
    assert as_message(np.str_("hi")) == "hi" and type(as_message(np.str_("hi"))) is str
    assert as_message(42) == "42"


@pytest.mark.parametrize("value", FORMS)
def test_pb_utils_objects_built_with_any_text_form_hold_plain_strings(value: Any) -> None:
    tensor = pb_utils.Tensor(value, np.zeros(2, np.float32))
    assert tensor.name() == "name" and type(tensor.name()) is str
    request = pb_utils.InferenceRequest(
        model_name=value, requested_output_names=[value], inputs=[tensor], request_id=value
    )
    assert request._model_name == "name" and type(request._model_name) is str
    assert request.requested_output_names() == {"name"}
    assert request.request_id() == "name"
    assert pb_utils.TritonError(value).message() == "name"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"correlation_id": b"c1"}, "Correlation ID must be integer or string"),
        ({"parameters": {b"k": "v"}}, "Expect parameters keys to have type str, found type <class 'bytes'>"),
        ({"parameters": {"k": b"v"}}, "Expect parameters values to have type bool/int/str, found type <class 'bytes'>"),
        ({"parameters": {"k": 1.5}}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ],
)
def test_request_arguments_triton_refuses_are_refused_with_its_words(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=message.replace("(", r"\(").replace(")", r"\)")):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], **kwargs)


def test_a_models_own_request_renders_its_parameters_as_triton_does() -> None:
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters={"k": "v", "n": 1})
    assert request.parameters() == '{"k": "v", "n": 1}'
    assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[]).parameters() == "{}"
