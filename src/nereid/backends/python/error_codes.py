"""The TritonError codes that travel in the worker's messages, as the server's `Status` values and back."""

from __future__ import annotations

from nereid.backends.python.protocol import ERROR_CODES
from nereid.core.errors import Status

__all__ = ["STATUS_OF_CODE", "CODE_OF_STATUS", "INTERNAL_CODE"]

STATUS_OF_CODE = tuple(Status[name] for name in ERROR_CODES)
CODE_OF_STATUS = {status: code for code, status in enumerate(STATUS_OF_CODE)}
INTERNAL_CODE = ERROR_CODES.index("INTERNAL")
