"""Triton's request parameters, decoded once for every frontend: the reserved ones (sequence control, priority,
timeout, binary output) are checked as Triton checks them and set on the request; the others pass to the model.

Wire formats (a JSON object, a protobuf parameter map) become a plain dict before they reach this module; it knows
nothing of either."""

from __future__ import annotations

import re
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.types import InferenceRequest

__all__ = [
    "HIDDEN_PARAMETERS", "RESERVED_PARAMETERS", "apply_request_parameters", "header_pattern", "parameters_object",
    "reserved_for_triton", "reserved_header_error",
]  # fmt: skip


def header_pattern(pattern: str) -> re.Pattern[str]:
    """--http/grpc-header-forward-pattern as tritonserver reads it (RE2, case-insensitive): a leading `(?-i)`, which
    Python's re takes only inside a group, makes it case-sensitive. re.error where the expression is bad."""
    if pattern.startswith("(?-i)"):
        return re.compile(pattern[len("(?-i)") :])
    return re.compile(pattern, re.IGNORECASE)

# The request parameters Triton reserves, and the kind of value each must have.
_RESERVED_KINDS = {
    "sequence_id": "id",
    "sequence_start": "bool",
    "sequence_end": "bool",
    "priority": "uint",
    "timeout": "uint",
    "binary_data_output": "bool",
}

RESERVED_PARAMETERS = frozenset(_RESERVED_KINDS)

# The names a model never sees among its request's parameters and that a forwarded header may not take: the reserved
# ones, and the binary-data size of the tensor extension.
HIDDEN_PARAMETERS = frozenset({*_RESERVED_KINDS, "binary_data_size"})


# The parameter names a forwarded header may not take, as tritonserver refuses them: the reserved ones, `headers`, and
# every `triton_` name.
_TRITON_RESERVED = frozenset({*_RESERVED_KINDS, "headers"})


def reserved_for_triton(name: str) -> bool:
    lower = name.lower()
    return lower in _TRITON_RESERVED or lower.startswith("triton_")


def reserved_header_error(name: str, what: str = "header") -> NereidError:
    return NereidError.invalid(f"{what} '{name}' is a parameter name reserved for Triton usage")


def parameters_object(value: Any, what: str = "request") -> dict[str, Any]:
    """A JSON `parameters` field as a dict: absent or empty is {}, anything but an object is refused."""
    if not value:
        return {}
    if not isinstance(value, dict):
        raise NereidError.invalid(f"{what} 'parameters' must be a JSON object")
    return value


def _bad_parameter(request: InferenceRequest, key: str, value: Any, expected: str) -> NereidError:
    return NereidError.invalid(
        f"Unable to parse '{key}' of the request for model '{request.model_name}': expected {expected}, got {value!r}"
    )


def apply_request_parameters(request: InferenceRequest, parameters: dict[str, Any]) -> None:
    """Set `parameters` on the request: the reserved ones checked and applied (sequence ID and flags, priority,
    timeout), every other one a string, integer, float, boolean or null (an unset protobuf value)."""
    request.parameters = parameters
    for key, value in parameters.items():
        if key in _RESERVED_KINDS:
            kind = _RESERVED_KINDS[key]
            if kind == "bool":
                if not isinstance(value, bool):
                    raise _bad_parameter(request, key, value, "a boolean")
            elif kind == "uint":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise _bad_parameter(request, key, value, "an unsigned integer")
            elif not isinstance(value, (int, str)) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
                raise _bad_parameter(request, key, value, "an unsigned integer or a string")
        elif value is not None and not isinstance(value, (str, int, float)):
            raise NereidError.invalid(
                f"parameter '{key}' of the request for model '{request.model_name}' has invalid type. It should be "
                f"either 'int', 'bool', 'float' or 'string'."
            )
    if "sequence_id" in parameters:
        request.correlation_id = parameters["sequence_id"]
    if parameters.get("sequence_start"):
        request.flags |= SEQUENCE_START
    if parameters.get("sequence_end"):
        request.flags |= SEQUENCE_END
    if "priority" in parameters:
        request.priority = parameters["priority"]
    if "timeout" in parameters:
        request.timeout_us = parameters["timeout"]
