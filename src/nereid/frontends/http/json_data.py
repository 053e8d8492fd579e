"""What a JSON tensor's data may hold, per data type, as Triton's parser reads it: numbers for the float types
(integers too), integers for the integer types, true/false for BOOL, strings for BYTES. /infer's `data` and the
generate extension's values are held to it, so a bool, null or string among numbers is refused instead of being
turned into a number by numpy, and 1.5 is not truncated into an integer tensor."""

from __future__ import annotations

import json
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["MAX_NESTING", "flatten", "wrong_kind"]

MAX_NESTING = 100  # Triton's HTTP_MAX_JSON_NESTING_DEPTH: no value of `data` may sit this deep (the array itself is 0)

# `type()` is compared exactly: a bool is not an integer here.
_KINDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("FP16", "BF16", "FP32", "FP64"), (float, int)),
    **dict.fromkeys(("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"), (int,)),
    "BOOL": (bool,),
    "BYTES": (str,),
}


def wrong_kind(values: list[Any], datatype: str) -> str | None:
    """The JSON text of the first value Triton would not read as `datatype` (None when all are fine, or when the
    data type is unknown: the caller names that)."""
    kinds = _KINDS.get(datatype)
    if kinds is None or set(map(type, values)).issubset(kinds):
        return None
    return json.dumps(next(value for value in values if type(value) not in kinds))


def flatten(data: Any) -> list[Any]:
    """The elements of nested JSON arrays in order. Iterative: a deeply nested body must not exhaust the stack; a
    value MAX_NESTING arrays deep is refused, as Triton refuses it."""
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if item and len(stack) + 1 >= MAX_NESTING:  # its values would sit MAX_NESTING deep
                    raise NereidError.invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_NESTING})")
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat
