"""In-process fuzzing (hypothesis) of the parsers that read what a client or a repository sends: the binary-tensor
parser and the /infer body decoder, config.pbtxt and JSON model configurations, and the HTTP/2 frame parser.
A parser may refuse its input only with NereidError (or, for HTTP/2, a GOAWAY and a close); nothing else escapes."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import numpy as np
import orjson
from hpack import Encoder
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nereid.config.model_config import config_from_json, normalize, parse_pbtxt, validate
from nereid.core.dtypes import deserialize_bytes, element_size, serialize_bytes
from nereid.core.errors import NereidError
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.tensor_codec import array_from_buffer
from nereid.frontends.grpc import http2
from nereid.frontends.grpc.http2 import Http2Connection, Stream, frame
from nereid.frontends.http.codec import decode_request
from tests.fuzz_support import DERANDOMIZE
from tests.unit.fakes.transport import FakeTransport

_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=DERANDOMIZE)
_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
              "FP64", "BF16", "BYTES", "STRING", "", "fp32", "INT128"]
_shapes = st.lists(st.one_of(st.integers(0, 8), st.integers(0, 2**62), st.integers(-3, -1)), max_size=5)


# -- the binary-tensor parser ----------------------------------------------------------------------------------------
@_FUZZ
@given(buffer=st.binary(max_size=256), datatype=st.sampled_from(_DATATYPES), shape=_shapes)
@example(buffer=b"", datatype="BYTES", shape=[1, 2**40])
@example(buffer=b"\xff\xff\xff\xff", datatype="BYTES", shape=[1])
def test_array_from_buffer_returns_the_declared_shape_or_refuses(buffer: bytes, datatype: str, shape: list[int]) -> None:
    try:
        array = array_from_buffer(memoryview(buffer), datatype, tuple(shape), "INPUT0", "fuzz")
    except NereidError as exc:
        assert "INPUT0" in exc.message or datatype not in _DATATYPES[:14], exc.message
        return
    assert list(array.shape) == shape
    if datatype != "BYTES":
        assert array.size * element_size(datatype) == len(buffer)


@_FUZZ
@given(items=st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_tensors_survive_serialization(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    assert list(deserialize_bytes(serialize_bytes(array), len(items))) == items


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["INPUT0", "INPUT1"]), "datatype": st.sampled_from(_DATATYPES), "shape": _shapes},
    optional={
        "data": _json_values,
        "parameters": st.one_of(
            st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-2, 64), st.text(max_size=3))}),
            st.dictionaries(st.text(max_size=12), _json_values, max_size=3),
            _json_values,
        ),
    },
)
_request_doc = st.fixed_dictionaries(
    {"inputs": st.one_of(st.lists(_tensor, max_size=3), _json_values)},
    optional={"id": _json_values, "parameters": _json_values, "outputs": _json_values},
)


@_FUZZ
@given(doc=st.one_of(_request_doc, _json_values), binary=st.binary(max_size=128), split=st.one_of(st.none(), st.integers(-4, 400)))
def test_infer_body_decoder_builds_a_request_or_refuses(doc: Any, binary: bytes, split: int | None) -> None:
    header = orjson.dumps(doc)
    body = header + binary if split is not None else header
    header_length = None if split is None else (len(header) if split > 300 else split)
    try:
        request = decode_request(body, header_length, "fuzz", "", SharedMemoryRegistry())
    except NereidError:
        return
    for tensor in request.inputs:
        assert tensor.data.shape == tuple(tensor.shape)


@_FUZZ
@given(body=st.binary(max_size=300), header_length=st.one_of(st.none(), st.integers(-1, 310)))
def test_infer_body_decoder_refuses_random_bytes_cleanly(body: bytes, header_length: int | None) -> None:
    try:
        decode_request(body, header_length, "fuzz", "", SharedMemoryRegistry())
    except NereidError:
        pass


# -- the config parsers ----------------------------------------------------------------------------------------------
_PBTXT_PIECES = [
    'name: "m"', 'backend: "python"', 'platform: "onnxruntime_onnx"', 'platform: "ensemble"', "max_batch_size: 8",
    "max_batch_size: -1", 'input [ { name: "I" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    'output [ { name: "O" data_type: TYPE_STRING dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]',
    'input { name: "I" data_type: TYPE_INVALID dims: [ -2 ] }', "dynamic_batching { }",
    "dynamic_batching { preferred_batch_size: [ 0, 4 ] max_queue_delay_microseconds: 100 }",
    "sequence_batching { max_sequence_idle_microseconds: 5 }", "instance_group [ { count: 0 kind: KIND_CPU } ]",
    'ensemble_scheduling { step [ { model_name: "x" model_version: -1 input_map { key: "a" value: "b" } } ] }',
    'parameters { key: "k" value: { string_value: "v" } }', "version_policy { specific { versions: [ 0, -1 ] } }",
    "{", "}", "[", "]", ":", '"', "dims: [ 99999999999999999999 ]", "\x00", "#",
]


@_FUZZ
@given(pieces=st.lists(st.sampled_from(_PBTXT_PIECES), max_size=8), noise=st.text(max_size=20))
def test_pbtxt_parser_and_validation_accept_or_refuse_cleanly(pieces: list[str], noise: str) -> None:
    text = "\n".join(pieces) + noise
    try:
        config = parse_pbtxt(text, "config.pbtxt")
        normalize(config, "m")
        validate(config, "m")
    except NereidError:
        pass


@_FUZZ
@given(doc=_json_values, raw=st.binary(max_size=60))
def test_json_config_parser_accepts_or_refuses_cleanly(doc: Any, raw: bytes) -> None:
    for text in (orjson.dumps(doc), raw):
        try:
            config = config_from_json(text, "m")
            normalize(config, "m")
            validate(config, "m")
        except NereidError:
            pass


# -- the HTTP/2 frame parser -----------------------------------------------------------------------------------------
class _Connection(Http2Connection):
    def on_request_headers(self, stream: Stream, headers: list[tuple[str, str]], end_stream: bool) -> None:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers)

    def on_request_data(self, stream: Stream, data: bytes, end_stream: bool) -> None:
        assert isinstance(data, bytes)

    def on_stream_reset(self, stream: Stream) -> None:
        pass

    def on_connection_lost(self) -> None:
        pass


def _valid_headers(encoder: Encoder) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/p.S/M"), ("content-type", "application/grpc")])


_frames = st.lists(
    st.tuples(
        st.integers(0, 12),  # the ten frame types and unknown ones
        st.integers(0, 255),
        st.one_of(st.integers(0, 9), st.integers(0, 2**31 - 1)),
        st.one_of(st.binary(max_size=64), st.just(b"valid-headers")),
    ),
    max_size=12,
)


def _sent_kinds(sent: bytes) -> list[int]:
    kinds, pos = [], 0
    while pos + 9 <= len(sent):
        high, low, kind, _, _ = struct.unpack_from(">HBBBI", sent, pos)
        kinds.append(kind)
        pos += 9 + ((high << 8) | low)
    return kinds


def _drive(frames: list[tuple[int, int, int, bytes]], cut: int) -> None:
    async def body() -> None:
        connection, transport = _Connection(), FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        encoder = Encoder()
        wire = bytearray(http2.PREFACE)
        for kind, flags, stream_id, payload in frames:
            if payload == b"valid-headers":
                payload = _valid_headers(encoder)
            wire += frame(kind, flags, stream_id, payload)
        wire += frame(http2.PING, 0, 0, b"12345678")
        # Delivered in two chunks cut anywhere: the parser must not care where reads split the stream.
        position = cut % (len(wire) + 1)
        connection.data_received(bytes(wire[:position]))
        if not transport.closed:
            connection.data_received(bytes(wire[position:]))
        sent = bytes(transport.written)
        if transport.closed:
            # Closed by us with a GOAWAY, or after the client's own GOAWAY.
            client_went_away = any(kind == http2.GOAWAY for kind, _, _, _ in frames)
            assert client_went_away or _sent_kinds(sent).count(http2.GOAWAY) == 1, "closed without GOAWAY"
        elif connection.continuing is None:
            # Still open and not inside a header block: the trailing PING is answered.
            assert frame(http2.PING, http2.ACK, 0, b"12345678") in sent
        connection.connection_lost(None)

    asyncio.run(body())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=DERANDOMIZE)
@given(frames=_frames, cut=st.integers(0, 10_000))
def test_http2_frame_parser_answers_or_goes_away_on_any_frames(frames: list[tuple[int, int, int, bytes]], cut: int) -> None:
    _drive(frames, cut)


@settings(max_examples=200, deadline=None, derandomize=DERANDOMIZE)
@given(noise=st.binary(max_size=200))
def test_http2_frame_parser_survives_random_bytes_after_the_preface(noise: bytes) -> None:
    async def body() -> None:
        connection, transport = _Connection(), FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(http2.PREFACE + noise)
        connection.connection_lost(None)

    asyncio.run(body())
