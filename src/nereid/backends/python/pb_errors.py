"""pb_utils' errors: TritonModelException, which pb_utils raises when a model misuses it, and TritonError, the error
a model puts in one InferenceResponse (with Triton's codes). Runs in the worker: it must not import the server."""

from __future__ import annotations

import enum

from nereid.backends.python.pb_strings import as_message

__all__ = ["TritonModelException", "ErrorCode", "TritonError"]


class TritonModelException(Exception):
    """Raised by this module when a model misuses it; a model may raise it too."""


class ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error for one response: `InferenceResponse(error=TritonError("bad input", TritonError.INVALID_ARG))`."""

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        self._message = as_message(message)
        try:
            self._code = ErrorCode(int(code))
        except ValueError:
            self._code = ErrorCode.INTERNAL

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"
