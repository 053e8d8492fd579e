"""The TritonError codes that travel in the worker's messages, as the server's errors and back: the one place where
an `ErrorInfo` off the wire becomes a `NereidError`."""

from __future__ import annotations

from nereid.backends.python.protocol import ERROR_CODES, ErrorInfo
from nereid.core.errors import NereidError, Status

__all__ = ["STATUS_OF_CODE", "CODE_OF_STATUS", "error_from_wire", "error_to_wire"]

STATUS_OF_CODE = tuple(Status[name] for name in ERROR_CODES)
CODE_OF_STATUS = {status: code for code, status in enumerate(STATUS_OF_CODE)}


def error_from_wire(info: ErrorInfo) -> NereidError:
    """The server's error for a TritonError a worker sent (never RESCHEDULED_CODE, which is no error)."""
    return NereidError(STATUS_OF_CODE[info[0]], info[1])


def error_to_wire(error: NereidError) -> ErrorInfo:
    """A server error as the worker's pb_utils raises it."""
    return (CODE_OF_STATUS[error.status], error.message)
