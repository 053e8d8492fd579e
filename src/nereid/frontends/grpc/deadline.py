"""gRPC's `grpc-timeout` request header (how long the client will wait for a call), parsed into seconds. Only
the parsing lives here; the transport arms a timer per call that carries one."""

from __future__ import annotations

__all__ = ["DEADLINE_EXCEEDED", "DEADLINE_MESSAGE", "parse_grpc_timeout"]

DEADLINE_EXCEEDED = 4  # the gRPC status code
DEADLINE_MESSAGE = "Deadline Exceeded"  # grpc-core's words, as tritonserver sends them

# TimeoutValue is 1 to 8 ASCII digits, TimeoutUnit one of these (gRPC over HTTP/2, PROTOCOL-HTTP2.md).
_UNIT_SECONDS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_grpc_timeout(value: str) -> float | None:
    """Seconds from a header value such as "500m" or "20S"; None for a malformed one, which gRPC servers
    treat as no deadline."""
    digits, unit = value[:-1], value[-1:]
    scale = _UNIT_SECONDS.get(unit)
    if scale is None or not digits.isascii() or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * scale
