"""Triton's generate extension on the HTTP port: a flat JSON object becomes one inference request."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError
from nereid.frontends.http.generate import generate_request

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
