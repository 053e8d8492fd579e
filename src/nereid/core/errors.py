"""One error type with a Triton status, and the single place that maps statuses to HTTP and gRPC codes."""

from __future__ import annotations

import enum

__all__ = ["Status", "NereidError", "http_status", "grpc_code_name"]


class Status(enum.Enum):
    """Triton's TRITONSERVER_Error codes."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    # Not one of Triton's codes: a server-wide resource limit (--request-memory-limit) refused the request, which
    # gRPC says as RESOURCE_EXHAUSTED and HTTP as 503, like the transports' other limits.
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


class NereidError(Exception):
    """An error a client may see: a status plus a message in Triton's words."""

    def __init__(self, status: Status, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # Set when the server refused for load, not for the request itself: the client may retry after this
        # many seconds (OpenAI's API says it as 429 with Retry-After; Triton's protocols as UNAVAILABLE).
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"NereidError({self.status.name}, {self.message!r})"

    @classmethod
    def invalid(cls, message: str) -> NereidError:
        return cls(Status.INVALID_ARG, message)

    @classmethod
    def not_found(cls, message: str) -> NereidError:
        return cls(Status.NOT_FOUND, message)

    @classmethod
    def unavailable(cls, message: str) -> NereidError:
        return cls(Status.UNAVAILABLE, message)

    @classmethod
    def overloaded(cls, message: str, retry_after: float = 1.0) -> NereidError:
        return cls(Status.UNAVAILABLE, message, retry_after)

    @classmethod
    def internal(cls, message: str) -> NereidError:
        return cls(Status.INTERNAL, message)

    @classmethod
    def unsupported(cls, message: str) -> NereidError:
        return cls(Status.UNSUPPORTED, message)


# As Triton's HTTP frontend maps them (unknown, already-exists and cancelled are plain 400s, unsupported is 501).
_HTTP = {
    Status.UNKNOWN: 400,
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.INVALID_ARG: 400,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
    Status.ALREADY_EXISTS: 400,
    Status.CANCELLED: 400,
    Status.RESOURCE_EXHAUSTED: 503,
}

_GRPC = {
    Status.UNKNOWN: "UNKNOWN",
    Status.INTERNAL: "INTERNAL",
    Status.NOT_FOUND: "NOT_FOUND",
    Status.INVALID_ARG: "INVALID_ARGUMENT",
    Status.UNAVAILABLE: "UNAVAILABLE",
    Status.UNSUPPORTED: "UNIMPLEMENTED",
    Status.ALREADY_EXISTS: "ALREADY_EXISTS",
    Status.CANCELLED: "CANCELLED",
    Status.RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
}


def http_status(status: Status) -> int:
    return _HTTP[status]


def grpc_code_name(status: Status) -> str:
    """The name of the grpc.StatusCode member for a status (kept as a name so core needs no grpc)."""
    return _GRPC[status]
