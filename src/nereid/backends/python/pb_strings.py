"""How pb_utils takes a string argument: as Triton's pybind11 layer converts it to a std::string.

Triton accepts str and its subclasses (numpy.str_), and bytes, numpy.bytes_ and bytearray, whose bytes become the
string; a model that reads a name out of a BYTES tensor (`.as_numpy()[0]`) passes bytes. Everything here returns a
plain str, so nothing downstream sees a subclass or bytes. It must not accept other types for names."""

from __future__ import annotations

from typing import Any

__all__ = ["as_text", "as_message"]


def as_text(value: Any, argument: str) -> str:
    """`value` as a plain str; TypeError (as pybind11 raises it) for anything that is not text or bytes."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)  # numpy.str_ and other subclasses: the plain str
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TypeError(f"{argument}: {bytes(value)!r} is not UTF-8 text ({exc.reason})") from None
    raise TypeError(f"{argument} must be a str or bytes, got {type(value).__name__}")


def as_message(value: Any) -> str:
    """A message (log line, error text): text and bytes as as_text reads them, anything else through str()."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
