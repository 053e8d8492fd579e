"""JSON with the NaN, Infinity and -Infinity literals that Triton reads and writes for floating-point data.

orjson refuses these literals, so this is the slow path only: a body is parsed here after orjson failed on it, and
a response is rewritten here only when orjson wrote a `null` that may stand for a non-finite float. It must not
widen what the protocol accepts anywhere else (numbers too big for a double, invalid UTF-8, lone surrogates)."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

import numpy as np
import orjson

__all__ = [
    "FLOAT_DATATYPES",
    "loads_with_non_finite",
    "first_non_finite",
    "literal",
    "mark_non_finite",
    "dumps_marked",
    "dumps_with_non_finite",
]

# The data types whose JSON data may hold the literals (Nereid also takes FP16 and BF16 data as JSON numbers).
FLOAT_DATATYPES = frozenset(("FP16", "BF16", "FP32", "FP64"))

_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} is too big to be stored in a double")
    return value


# A JSON string (left as it is) or one of the spellings Triton's parser takes: NaN, -NaN, Inf, -Inf, Infinity and
# -Infinity. Python's json knows only NaN, Infinity and -Infinity, so the others are respelt first.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|-?NaN|-?Inf(?:inity)?')


def _respell(match: re.Match[bytes]) -> bytes:
    token = match.group()
    if token[:1] == b'"':
        return token
    if token.endswith(b"NaN"):
        return b"NaN"
    return b"-Infinity" if token[:1] == b"-" else b"Infinity"


def loads_with_non_finite(body: bytes | memoryview) -> Any:
    """The document, when `body` is valid JSON apart from the non-finite literals Triton reads; raises ValueError
    otherwise (the caller then reports orjson's own error)."""
    text = _TOKENS.sub(_respell, bytes(body)).decode("utf-8")  # strict: invalid UTF-8 stays refused
    doc = json.loads(text, parse_constant=_CONSTANTS.__getitem__, parse_float=_finite_float)
    try:
        orjson.dumps(doc)  # refuses what orjson would never have produced, such as lone surrogates
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return doc


def first_non_finite(data: Any) -> float | None:
    """The first NaN or infinity in (nested lists of) JSON data, or None."""
    if isinstance(data, list):
        for item in data:
            found = first_non_finite(item)
            if found is not None:
                return found
        return None
    if isinstance(data, float) and not math.isfinite(data):
        return data
    return None


def literal(value: float) -> str:
    """How JSON (Triton's, Python's) spells a non-finite float."""
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


_MARKER = f"nereid-non-finite-{uuid.uuid4().hex}"
_LITERALS = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}


def mark_non_finite(items: list[Any]) -> None:
    """Each NaN or infinity among `items` (floats) becomes a marker that `dumps_marked` writes as Triton's literal."""
    for index, value in enumerate(items):
        if not math.isfinite(value):
            items[index] = f"{_MARKER}:{float(value)}"


def dumps_marked(doc: dict[str, Any]) -> bytes:
    """`doc` serialized with its markers (see mark_non_finite) written as NaN, Infinity and -Infinity."""
    text = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    for name, literal in _LITERALS.items():
        text = text.replace(f'"{_MARKER}:{name}"'.encode(), literal)
    return text


def dumps_with_non_finite(doc: dict[str, Any]) -> bytes:
    """Serialize a response document whose float outputs may hold NaN or infinities, writing them as Triton's
    literals instead of orjson's `null`."""
    for entry in doc.get("outputs", ()):
        data = entry.get("data")
        if not isinstance(data, np.ndarray) or data.dtype.kind != "f" or np.isfinite(data).all():
            continue
        items: list[Any] = list(data.reshape(-1))
        mark_non_finite(items)
        entry["data"] = items
    return dumps_marked(doc)
