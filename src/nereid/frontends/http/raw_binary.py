"""A raw binary /infer body (`Inference-Header-Content-Length: 0`): the whole body is the data of a model's only
input, whose shape is deduced from the body's size, as Triton's binary tensor data extension allows.

It builds the request only; the usual validation runs on it afterwards. It must not be reached for other bodies."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nereid.config.model_config import mc
from nereid.core.dtypes import config_to_triton, element_size
from nereid.core.errors import NereidError
from nereid.core.tensor_codec import array_from_buffer
from nereid.core.types import InferenceRequest, InputTensor

__all__ = ["decode_raw_request"]

# Triton names the input of a raw request this way in its size errors.
_RAW_INPUT = "raw_input"


def decode_raw_request(body: bytes, model: str, version: str, config: Any) -> InferenceRequest:
    """The request for a body that is only the binary data of the model's single input. A batching model gets a
    batch of one; every output comes back as binary data."""
    prefix = "[request id: <id_unknown>]"
    if len(config.input) != 1:
        raise NereidError.invalid(
            f"{prefix} Raw request must only have 1 input (found 1) to be deduced but got {len(config.input)} inputs "
            f"in '{model}' model configuration"
        )
    spec = config.input[0]
    datatype = config_to_triton(mc.DataType.Name(spec.data_type))
    dims = list(spec.dims)
    if datatype == "BYTES":
        if dims != [1]:
            raise NereidError.invalid(
                f"{prefix} For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
        # The body is the one element's bytes, without the length prefix of the binary form.
        array = np.empty(1, dtype=object)
        array[0] = bytes(body)
        shape: tuple[int, ...] = (1,)
    else:
        variable = [i for i, d in enumerate(dims) if d < 0]
        if len(variable) > 1:
            raise NereidError.invalid(
                f"{prefix} The shape of the raw input '{spec.name}' can not be deduced because there are more than "
                f"one variable-sized dimension"
            )
        if variable:
            fixed = math.prod(d for d in dims if d >= 0) * element_size(datatype)
            dims[variable[0]] = len(body) // fixed if fixed else 0
        shape = tuple(dims)
        array = array_from_buffer(memoryview(body), datatype, shape, _RAW_INPUT, model)
    if config.max_batch_size > 0:
        shape = (1, *shape)
        array = array.reshape(shape)
    request = InferenceRequest(model, version, [InputTensor(spec.name, datatype, shape, array, {})])
    request.parameters = {"binary_data_output": True}
    return request
