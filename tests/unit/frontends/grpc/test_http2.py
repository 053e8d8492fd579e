"""The HTTP/2 connection layer under the gRPC transport, driven frame by frame with a fake transport."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from hpack import Encoder

from nereid.core.settings import GrpcConnectionOptions, TransportLimits
from nereid.frontends.grpc import http2
from nereid.frontends.grpc.http2 import DATA, HEADERS, PING, SETTINGS, WINDOW_UPDATE, Http2Connection, Stream, frame
from tests.unit.fakes.transport import FakeTransport


class _Recorder(Http2Connection):
    def __init__(self, options: GrpcConnectionOptions | None = None, limits: TransportLimits | None = None) -> None:
        super().__init__(options, limits)
        self.failures: list[str] = []
        self.requests: list[tuple[int, dict[str, str], bool]] = []
        self.data: list[tuple[int, bytes, bool]] = []
        self.resets: list[int] = []

    def on_request_headers(self, stream: Stream, headers: list[tuple[str, str]], end_stream: bool) -> None:
        self.requests.append((stream.id, dict(headers), end_stream))

    def on_request_data(self, stream: Stream, data: bytes, end_stream: bool) -> None:
        self.data.append((stream.id, data, end_stream))

    def on_stream_reset(self, stream: Stream) -> None:
        self.resets.append(stream.id)

    def on_connection_lost(self) -> None:
        pass

    def on_connection_failure(self, message: str) -> None:
        self.failures.append(message)


def _open(initial_window: int = 65_535, options: GrpcConnectionOptions | None = None) -> tuple[_Recorder, FakeTransport]:
    connection, transport = _Recorder(options), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    settings = struct.pack(">HI", http2.SETTING_INITIAL_WINDOW_SIZE, initial_window)
    connection.data_received(http2.PREFACE + frame(SETTINGS, 0, 0, settings))
    return connection, transport


def _request_headers(encoder: Encoder, path: str) -> bytes:
    return encoder.encode(
        [(":method", "POST"), (":scheme", "http"), (":path", path), ("content-type", "application/grpc")]
    )


def _run(test: Any) -> None:
    async def body() -> None:
        test()

    asyncio.run(body())


def test_server_announces_its_settings_and_acknowledges_the_clients() -> None:
    def test() -> None:
        _, transport = _open()
        kinds = [(kind, flags) for kind, flags, _, _ in transport.frames()]
        assert kinds == [(SETTINGS, 0), (WINDOW_UPDATE, 0), (SETTINGS, http2.ACK)]

    _run(test)


def test_headers_split_across_frames_and_bytes_reach_the_subclass_decoded() -> None:
    def test() -> None:
        connection, _ = _open()
        encoder = Encoder()
        block = _request_headers(encoder, "/pkg.Service/Method")
        wire = frame(HEADERS, 0, 1, block[:3]) + frame(http2.CONTINUATION, http2.END_HEADERS, 1, block[3:])
        wire += frame(DATA, http2.END_STREAM, 1, b"payload")
        for i in range(0, len(wire), 7):  # dribbled in 7-byte pieces
            connection.data_received(wire[i : i + 7])
        assert connection.requests == [
            (
                1,
                {
                    ":method": "POST",
                    ":scheme": "http",
                    ":path": "/pkg.Service/Method",
                    "content-type": "application/grpc",
                },
                False,
            )
        ]
        assert connection.data == [(1, b"payload", True)]
        # The same header block again decodes from the cache to the same headers.
        connection.data_received(
            frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, 3, _request_headers(encoder, "/pkg.Service/Method"))
        )
        assert connection.requests[1] == (3, connection.requests[0][1], True)

    _run(test)


def test_data_beyond_the_peers_window_waits_for_window_update() -> None:
    async def test() -> None:
        connection, transport = _open(initial_window=10)
        connection.data_received(
            frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, _request_headers(Encoder(), "/a/b"))
        )
        transport.frames()
        stream = connection.streams[1]
        connection.send(stream, (HEADERS, b"\x88", False), (DATA, b"x" * 25, False), (HEADERS, b"\x88", True))
        await asyncio.sleep(0)  # response frames leave at the end of the loop's turn
        sent = transport.frames()
        assert [(kind, len(payload)) for kind, _, _, payload in sent] == [(HEADERS, 1), (DATA, 10)]
        connection.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 10)))
        await asyncio.sleep(0)
        assert [(kind, len(payload)) for kind, _, _, payload in transport.frames()] == [(DATA, 10)]
        connection.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
        await asyncio.sleep(0)
        rest = transport.frames()
        assert [(kind, flags & http2.END_STREAM, len(payload)) for kind, flags, _, payload in rest] == [
            (DATA, 0, 5),
            (HEADERS, 1, 1),
        ]
        assert 1 not in connection.streams  # the stream is over once its trailers left

    asyncio.run(test())


def test_responses_of_one_loop_turn_leave_in_one_write_and_other_frames_keep_their_order() -> None:
    async def test() -> None:
        connection, transport = _open()
        encoder = Encoder()
        for stream_id in (1, 3, 5):
            connection.data_received(
                frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, stream_id, _request_headers(encoder, "/a/b"))
            )
        transport.frames()
        writes = transport.writes
        for stream_id in (1, 3):
            stream = connection.streams[stream_id]
            connection.send(stream, (HEADERS, b"\x88", False), (DATA, b"r", False), (HEADERS, b"\x88", True))
        assert transport.writes == writes  # nothing yet: the loop's turn is not over
        await asyncio.sleep(0)
        assert transport.writes == writes + 1
        assert [(kind, stream_id) for kind, _, stream_id, _ in transport.frames()] == [
            (HEADERS, 1), (DATA, 1), (HEADERS, 1), (HEADERS, 3), (DATA, 3), (HEADERS, 3),
        ]  # fmt: skip
        # A frame written at once (here RST_STREAM) goes after the response frames queued before it.
        connection.send(connection.streams[5], (HEADERS, b"\x88", False))
        connection.reset(5, http2.CANCEL)
        assert [kind for kind, _, _, _ in transport.frames()] == [HEADERS, http2.RST_STREAM]
        await asyncio.sleep(0)
        assert transport.frames() == []

    asyncio.run(test())


def test_ping_is_answered_and_reset_reaches_the_subclass() -> None:
    def test() -> None:
        connection, transport = _open()
        transport.frames()
        connection.data_received(frame(PING, 0, 0, b"12345678"))
        assert transport.frames() == [(PING, http2.ACK, 0, b"12345678")]
        connection.data_received(frame(HEADERS, http2.END_HEADERS, 1, _request_headers(Encoder(), "/a/b")))
        connection.data_received(frame(http2.RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL)))
        assert connection.resets == [1] and not connection.streams

    _run(test)


def test_a_frame_over_our_maximum_size_closes_the_connection_with_goaway() -> None:
    def test() -> None:
        connection, transport = _open()
        transport.frames()
        too_big = http2.LOCAL_MAX_FRAME + 1
        connection.data_received(struct.pack(">HBBBI", too_big >> 8, too_big & 0xFF, DATA, 0, 1))
        ((kind, _, _, payload),) = transport.frames()
        assert kind == http2.GOAWAY and struct.unpack_from(">I", payload, 4)[0] == http2.FRAME_SIZE_ERROR
        assert transport.closed

    _run(test)


def test_pings_too_soon_after_each_other_are_strikes_and_too_many_end_the_connection() -> None:
    def test() -> None:
        connection, transport = _open(options=GrpcConnectionOptions(http2_max_ping_strikes=2))
        transport.frames()
        for n in range(3):  # the first is free, the next two are strikes: still allowed
            connection.data_received(frame(PING, 0, 0, bytes([n]) * 8))
        assert [kind for kind, *_ in transport.frames()] == [PING, PING, PING] and not transport.closed
        connection.data_received(frame(PING, 0, 0, b"33333333"))
        ack, goaway = transport.frames()
        assert ack[0] == PING and goaway[0] == http2.GOAWAY
        assert (
            struct.unpack_from(">II", goaway[3]) == (0, http2.ENHANCE_YOUR_CALM) and goaway[3][8:] == b"too_many_pings"
        )
        assert transport.closed and connection.failures == ["Too many pings"]

    _run(test)


def test_a_new_call_between_pings_forgives_the_strikes() -> None:
    def test() -> None:
        connection, transport = _open(options=GrpcConnectionOptions(http2_max_ping_strikes=1))
        encoder = Encoder()
        for n in range(4):
            stream_id = 2 * n + 1
            connection.data_received(
                frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, stream_id, _request_headers(encoder, "/a/b"))
            )
            connection.data_received(frame(PING, 0, 0, bytes([n]) * 8))
        assert not transport.closed

    _run(test)


def test_timers_of_a_connection_are_cancelled_when_it_closes() -> None:
    def test() -> None:
        options = GrpcConnectionOptions(keepalive_time_ms=60_000, max_connection_age_ms=60_000)
        connection, _ = _open(options=options)
        handles = list(connection.timers.values())
        assert len(handles) == 2
        connection.connection_lost(None)
        assert not connection.timers and all(handle.cancelled() for handle in handles)

    _run(test)


def test_a_connection_without_options_starts_no_timers_and_polices_no_pings() -> None:
    def test() -> None:
        connection, transport = _open()
        for n in range(10):
            connection.data_received(frame(PING, 0, 0, bytes([n]) * 8))
        assert not connection.timers and not transport.closed

    _run(test)


def test_data_sent_between_pings_forgives_the_strikes_even_when_window_updates_restore_the_window() -> None:
    """grpc-core clients PING to estimate bandwidth while a stream's responses flow; the server's DATA in between
    forgives those PINGs (the send window, topped up by WINDOW_UPDATE, may read the same at each PING)."""

    def test() -> None:
        connection, transport = _open(options=GrpcConnectionOptions(http2_max_ping_strikes=1))
        connection.data_received(frame(HEADERS, http2.END_HEADERS, 1, _request_headers(Encoder(), "/a/b")))
        stream = connection.streams[1]
        for n in range(6):
            connection.send(stream, (DATA, b"r" * 100, False))
            connection.data_received(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 100)))
            connection.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
            connection.data_received(frame(PING, 0, 0, bytes([n]) * 8))
        assert not transport.closed and not connection.failures

    _run(test)


def test_a_connection_that_never_sends_the_preface_is_closed_after_the_header_timeout() -> None:
    async def main() -> None:
        connection, transport = _Recorder(limits=TransportLimits(http_header_timeout_secs=0.05)), FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        deadline = asyncio.get_running_loop().time() + 10
        while not transport.closed:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        other, other_transport = _Recorder(limits=TransportLimits(http_header_timeout_secs=0.05)), FakeTransport()
        other.connection_made(other_transport)  # type: ignore[arg-type]
        other.data_received(http2.PREFACE + frame(SETTINGS, 0, 0))
        await asyncio.sleep(0.2)
        assert not other_transport.closed  # the preface came in time

    asyncio.run(main())
