"""Request bytes on the wire: the precomputed templates a worker receives, and the cheap per-request assembly
(request id and sequence parameters spliced in without re-encoding tensors). Imports nothing heavy, so worker
processes start fast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "GrpcTemplate",
    "HttpTarget",
    "HttpTemplate",
    "grpc_request_suffix",
    "http_request",
]


@dataclass(slots=True)
class HttpTarget:
    host: str
    port: int
    path: bytes  # b"/v2/models/NAME[/versions/V]/infer"
    host_header: bytes
    extra_headers: bytes  # b"Name: value\r\n" lines
    binary_format: bool  # the body carries binary tensors after a JSON header


@dataclass(slots=True)
class HttpTemplate:
    header_tail: bytes  # the JSON inference header after its opening '{'
    binary: bytes  # binary tensor data appended after the header (b"" for JSON or shared memory)


@dataclass(slots=True)
class GrpcTemplate:
    message: bytes  # a serialized ModelInferRequest


def http_request(target: HttpTarget, template: HttpTemplate, request_id: str = "", parameters: dict[str, Any] | None = None) -> bytes:
    """The whole HTTP/1.1 request: request line, headers and body."""
    head = b"{"
    if request_id:
        head += b'"id":' + orjson.dumps(request_id) + b","
    if parameters:
        head += b'"parameters":' + orjson.dumps(parameters) + b","
    header = head + template.header_tail
    body_length = len(header) + len(template.binary)
    lines = [b"POST ", target.path, b" HTTP/1.1\r\nHost: ", target.host_header, b"\r\n"]
    if target.binary_format:
        lines += [
            b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ",
            str(len(header)).encode(),
            b"\r\n",
        ]
    else:
        lines.append(b"Content-Type: application/json\r\n")
    lines += [b"Content-Length: ", str(body_length).encode(), b"\r\n", target.extra_headers, b"\r\n", header, template.binary]
    return b"".join(lines)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint((field_number << 3) | 2) + _varint(len(payload)) + payload


def _infer_parameter(value: Any) -> bytes:
    """An InferParameter message: bool_param=1, int64_param=2, string_param=3, double_param=4."""
    if isinstance(value, bool):
        return _varint(1 << 3) + _varint(int(value))
    if isinstance(value, int):
        return _varint(2 << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        import struct

        return _varint((4 << 3) | 1) + struct.pack("<d", value)
    return _length_delimited(3, str(value).encode())


def grpc_request_suffix(request_id: str = "", parameters: dict[str, Any] | None = None) -> bytes:
    """Serialized ModelInferRequest fields (id=3, parameters=4) to append to a template: protobuf merges
    concatenated messages, so the template's tensors need no re-encoding."""
    out = b""
    if request_id:
        out += _length_delimited(3, request_id.encode())
    for key, value in (parameters or {}).items():
        entry = _length_delimited(1, key.encode()) + _length_delimited(2, _infer_parameter(value))
        out += _length_delimited(4, entry)
    return out
