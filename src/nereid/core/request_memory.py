"""The server-wide bound on the bytes that requests in progress hold while they are received and decoded
(--request-memory-limit), shared by the HTTP and gRPC transports. It only counts: a transport reserves a
request's bytes when their size is known, before buffering them, and gives them back when the request ends."""

from __future__ import annotations

import functools
from pathlib import Path

from nereid.core.errors import NereidError, Status

__all__ = [
    "DEFAULT_SHARE_OF_MEMORY",
    "GRPC_DECODE_FACTOR",
    "JSON_DECODE_FACTOR",
    "SMALL_REQUEST_BYTES",
    "RequestMemoryBudget",
    "body_reservation",
    "default_request_memory_limit",
    "format_size",
    "usable_memory",
]

# The default limit, as a percentage of the memory the server may use (see docs/security.md for why a quarter).
DEFAULT_SHARE_OF_MEMORY = 25
# What a request counts per byte received, by how it is decoded (measured with ru_maxrss and RSS, 64 MiB requests):
# - an HTTP body with binary tensors: 1, the tensors are numpy views on the body;
# - an HTTP JSON body (or the JSON header of a binary one): 3, the text plus its numbers decoded into arrays that
#   live as long as the request (FP32 "0," is 2 bytes of text for 4 of tensor);
# - a gRPC message: 2, the message plus the tensor bytes that protobuf parsing copies out of it.
# Parsing itself takes more for a moment (simdjson's tape, upb's arena), but one request at a time: decoding runs
# on the event loop's one thread, so that peak does not add up across requests (docs/security.md).
JSON_DECODE_FACTOR = 3
GRPC_DECODE_FACTOR = 2
# A request that reserves at most this much is small: small requests may use the whole limit, large ones all but
# an eighth of it, so that requests of a few KiB are still served while large ones fill the budget.
SMALL_REQUEST_BYTES = 1 << 20
_SMALL_SHARE_DIVISOR = 8
_NO_LIMIT = 1 << 62  # --request-memory-limit=0: no limit (the same comparisons, never true)

_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@functools.cache
def usable_memory() -> int:
    """The memory this process may use: the machine's RAM (psutil), or a container's cgroup limit when lower
    (psutil reports the host's RAM inside a container)."""
    import psutil  # here: the settings module imports this one, and most of its users never need the RAM's size

    total = int(psutil.virtual_memory().total)
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def default_request_memory_limit() -> int:
    return usable_memory() * DEFAULT_SHARE_OF_MEMORY // 100


def body_reservation(length: int, json_header: int) -> int:
    """What an HTTP body of `length` bytes reserves: the body, and twice more its JSON part (all of it, or the
    `json_header` bytes that Inference-Header-Content-Length gives when the tensors follow in binary)."""
    json_part = length if json_header < 0 else min(json_header, length)
    return length + (JSON_DECODE_FACTOR - 1) * json_part


def format_size(size: int) -> str:
    """Bytes as an operator reads them in a message: `512 MiB`, `1.5 GiB`, `300 bytes`."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            value = size / unit
            return f"{value:.0f} {name}" if size % unit == 0 else f"{value:.1f} {name}"
    return f"{size} bytes"


class RequestMemoryBudget:
    """Bytes reserved by the requests in progress against the limit. Not locked: every reservation and release
    happens on the event loop's thread (the transports' callbacks, and model answers, which reach the loop through
    call_soon_threadsafe before they are written). The HTTP and gRPC transports repeat `try_reserve` and `release`
    inline where they run for every request (marked there): a change to the rule changes those too."""

    __slots__ = ("limit", "large_limit", "small_size", "held", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit if limit > 0 else _NO_LIMIT  # 0: no limit
        kept_for_small = self.limit // _SMALL_SHARE_DIVISOR
        self.small_size = min(SMALL_REQUEST_BYTES, kept_for_small)
        self.large_limit = self.limit - kept_for_small  # what requests larger than `small_size` may fill
        self.held = 0
        self.refused = 0  # reservations refused so far, for operators and tests

    def try_reserve(self, size: int) -> bool:
        """Reserve `size` bytes, or False (nothing reserved) when the requests in progress leave no room."""
        held = self.held + size
        if held > (self.limit if size <= self.small_size else self.large_limit):
            self.refused += 1
            return False
        self.held = held
        return True

    def release(self, size: int) -> None:
        self.held -= size

    def error(self, size: int) -> NereidError:
        """Why a reservation of `size` bytes was refused, naming the limit and the flag."""
        limit = format_size(self.limit)
        if size > self.large_limit and size > self.small_size:
            # Never admitted, however idle the server: say so, rather than invite a retry.
            return NereidError(
                Status.RESOURCE_EXHAUSTED,
                f"request memory limit of {limit} reached: this request needs {format_size(size)}, more than requests "
                f"of its size may hold; raise --request-memory-limit to serve it",
            )
        return NereidError(
            Status.RESOURCE_EXHAUSTED,
            f"request memory limit of {limit} reached: requests in progress hold {format_size(self.held)} and this "
            f"request needs {format_size(size)} more; retry later, or raise --request-memory-limit",
        )
