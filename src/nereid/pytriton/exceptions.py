"""PyTriton's exception types, under the same names, so `except PyTritonValidationError` keeps working.

Nothing here knows about the server: `nereid.pytriton.triton` and the function backend raise and recognise them.
"""

from __future__ import annotations

__all__ = [
    "PyTritonError",
    "PyTritonValidationError",
    "PyTritonInvalidOperationError",
    "PyTritonBadParameterError",
    "PyTritonModelConfigError",
    "PyTritonUnrecoverableError",
    "PyTritonRuntimeError",
]


class PyTritonError(Exception):
    """The base of every PyTriton error; `str()` and `.message` give the message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonValidationError(PyTritonError):
    """A configuration that cannot be served (a bad model name, a TritonConfig field Nereid does not support)."""


class PyTritonInvalidOperationError(PyTritonError):
    """An operation in the wrong state (binding the same model twice)."""


class PyTritonBadParameterError(PyTritonError):
    """A bad argument (max_batch_size below 1, an optional output, a decorator default of the wrong dtype)."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration that is inconsistent."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by an inference callable that cannot serve again: its requests fail and the server shuts down."""


class PyTritonRuntimeError(PyTritonError):
    """Any other error detected while serving (a decorator used where it cannot work)."""
