"""The gRPC transport under --request-memory-limit, driven frame by frame with a fake transport: a message is
reserved from its length prefix, before it is buffered; past the limit its stream alone ends RESOURCE_EXHAUSTED
naming the limit, the connection's window is still topped up and its other streams are served; and every way a
call ends gives its bytes back (answered, reset by the client, connection lost, a stream's message parsed)."""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from hpack import Decoder, Encoder

from nereid.core.admission import InflightLimit
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import TransportLimits
from nereid.frontends.grpc import http2
from nereid.frontends.grpc.http2 import DATA, HEADERS, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame
from nereid.frontends.grpc.methods import Method
from nereid.frontends.grpc.transport import GrpcConnection
from tests.unit.fakes.transport import FakeTransport

MiB = 1 << 20
LIMIT = 8 * MiB  # large requests may hold 7 MiB of it; requests of at most 1 MiB all 8
_UNARY, _STREAM = "/test.Service/Unary", "/test.Service/Stream"
_RESOURCE_EXHAUSTED = "8"


class _Reply:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def SerializeToString(self) -> bytes:
        return self.payload


class _Peer:
    """The client side: frames in, and the server's frames out with their header blocks decoded."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.parsed: list[int] = []  # sizes of the stream messages the service has read
        self.budget = RequestMemoryBudget(LIMIT)
        methods = {
            _UNARY: Method(self._unary, lambda payload: payload, streaming=False),
            _STREAM: Method(self._stream, lambda payload: payload, streaming=True),
        }
        server = SimpleNamespace(
            options=None, limits=TransportLimits(), tracer=SimpleNamespace(enabled=False), request_memory=self.budget,
            inflight=InflightLimit(100), methods=methods, configured={}, connections=set(), connections_refused=0,
        )  # fmt: skip
        self.connection = GrpcConnection(server)  # type: ignore[arg-type]
        self.transport = FakeTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder, self.decoder = Encoder(), Decoder()
        self.send(http2.PREFACE + frame(SETTINGS, 0, 0))

    async def _unary(self, request: bytes, context: Any) -> _Reply:
        await self.release.wait()
        return _Reply(b"%d" % len(request))

    async def _stream(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[_Reply]:
        async for request in requests:
            self.parsed.append(len(request))
            yield _Reply(b"%d" % len(request))

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    def call(self, stream_id: int, path: str, *extra: tuple[str, str]) -> None:
        block = self.encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", path), ("content-type", "application/grpc"), *extra]
        )
        self.send(frame(HEADERS, http2.END_HEADERS, stream_id, block))

    def message(self, stream_id: int, declared: int, sent: int, end: bool = False) -> None:
        """A message's 5-byte prefix declaring `declared` bytes, and the first `sent` of them."""
        self.more(stream_id, b"\0" + declared.to_bytes(4, "big") + b"m" * sent, end)

    def more(self, stream_id: int, payload: bytes, end: bool = False) -> None:
        """DATA frames of at most 1 MiB carrying `payload`."""
        for pos in range(0, max(len(payload), 1), MiB):
            last = pos + MiB >= len(payload)
            self.send(frame(DATA, http2.END_STREAM if end and last else 0, stream_id, payload[pos : pos + MiB]))

    def frames(self) -> list[tuple[int, int, int, Any]]:
        """What the server wrote since the last call: (kind, flags, stream, payload or decoded headers)."""
        out, pos, written = [], 0, self.transport.written
        while pos < len(written):
            high, low, kind, flags, stream_id = struct.unpack_from(">HBBBI", written, pos)
            payload = bytes(written[pos + 9 : pos + 9 + ((high << 8) | low)])
            pos += 9 + len(payload)
            out.append((kind, flags, stream_id, dict(self.decoder.decode(payload)) if kind == HEADERS else payload))
        written.clear()
        return out

    def statuses(self) -> dict[int, tuple[str, str]]:
        """grpc-status and grpc-message of the streams the server ended since the last read."""
        return {
            stream_id: (fields["grpc-status"], fields.get("grpc-message", ""))
            for kind, _, stream_id, fields in self.frames()
            if kind == HEADERS and "grpc-status" in fields
        }


def _run(test: Callable[[_Peer], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(test(_Peer()), 30)

    asyncio.run(main())


async def _turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_message_past_the_limit_is_refused_from_its_prefix_and_the_connection_serves_on() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _UNARY)
        peer.message(1, 100 * MiB, 1024)  # declares 100 MiB: refused before a byte of it is kept
        await _turns()
        code, text = peer.statuses()[1]
        assert code == _RESOURCE_EXHAUSTED
        assert text.startswith("request memory limit of 8 MiB reached: this request needs 200.0 MiB")
        assert peer.budget.held == 0
        # The rest of the message is dropped as it arrives, and the connection's window is still topped up.
        for _ in range(40):
            peer.send(frame(DATA, 0, 1, b"m" * MiB))
        updates = [struct.unpack(">I", p)[0] for kind, _, sid, p in peer.frames() if kind == WINDOW_UPDATE and sid == 0]
        assert sum(updates) >= 32 * MiB
        peer.call(3, _UNARY)  # another call on the same connection is served
        peer.message(3, 100, 100, end=True)
        peer.release.set()
        await _turns()
        assert peer.statuses() == {3: ("0", "")}
        assert peer.budget.held == 0

    _run(test)


def test_a_refused_streams_data_is_skipped_across_reads_and_the_frames_after_it_are_read() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _UNARY)
        peer.message(1, 100 * MiB, 1024)
        await _turns()
        assert peer.statuses()[1][0] == _RESOURCE_EXHAUSTED
        wire = frame(DATA, 0, 1, b"m" * MiB) * 40
        block = peer.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", _UNARY)])
        wire += frame(HEADERS, http2.END_HEADERS, 3, block) + frame(DATA, http2.END_STREAM, 3, b"\0\0\0\0\x03abc")
        buffered = []
        for pos in range(0, len(wire), 100_000):  # frames split across reads, as a socket delivers them
            peer.send(wire[pos : pos + 100_000])
            buffered.append(len(peer.connection.buffer))
        assert max(buffered) < 100_000  # never more than part of one read: the dropped frames are not gathered
        assert buffered[-1] == 0 and peer.connection.skipping == 0
        peer.release.set()
        await _turns()
        frames = peer.frames()
        updates = [struct.unpack(">I", p)[0] for kind, _, sid, p in frames if kind == WINDOW_UPDATE and sid == 0]
        assert sum(updates) >= 32 * MiB  # the dropped bytes still give the connection its window back
        assert [(sid, f["grpc-status"]) for kind, _, sid, f in frames if kind == HEADERS and "grpc-status" in f] == [(3, "0")]
        assert peer.budget.held == 0

    _run(test)


def test_a_unary_call_holds_its_message_and_decoded_copy_until_it_is_answered() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _UNARY)
        peer.message(1, 3 * MiB, 1024)
        assert peer.budget.held == 2 * (3 * MiB + 5)  # reserved whole at the prefix
        peer.more(1, b"m" * (3 * MiB - 1024), end=True)
        await _turns()
        assert peer.budget.held == 2 * (3 * MiB + 5)  # still running
        peer.release.set()
        await _turns()
        assert peer.statuses() == {1: ("0", "")}
        assert peer.budget.held == 0

    _run(test)


def test_a_reset_stream_and_a_lost_connection_give_the_bytes_back() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _UNARY)
        peer.message(1, 2 * MiB, 100 * 1024)
        assert peer.budget.held == 2 * (2 * MiB + 5)
        peer.send(frame(RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL)))
        assert peer.budget.held == 0
        peer.call(3, _UNARY)
        peer.message(3, 2 * MiB, 2 * MiB, end=True)  # whole: its call is running
        peer.call(5, _UNARY)
        peer.message(5, 1 * MiB, 1024)  # still arriving
        await _turns()
        assert peer.budget.held == 2 * (3 * MiB + 10)
        calls = [stream.call for stream in peer.connection.streams.values()]
        peer.connection.connection_lost(None)
        assert peer.budget.held == 0
        # The bytes go too, not when the collector gets to the connection's cycles.
        assert all(not call.chunks and not call.buffer for call in calls) and not peer.connection.buffer

    _run(test)


def test_small_calls_are_served_while_large_ones_hold_the_budget() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _UNARY)
        peer.message(1, 3 * MiB, 1024)  # 6 MiB reserved: large calls may hold 7
        peer.call(3, _UNARY)
        peer.message(3, MiB, 1024)  # 2 MiB more: refused
        await _turns()
        code, text = peer.statuses()[3]
        assert code == _RESOURCE_EXHAUSTED and "requests in progress hold 6.0 MiB" in text
        peer.call(5, _UNARY)
        peer.message(5, 200, 200, end=True)  # small: fits in the share kept for small requests
        peer.release.set()
        await _turns()
        assert peer.statuses() == {5: ("0", "")}
        assert peer.budget.held == 2 * (3 * MiB + 5)

    _run(test)


def test_a_streams_messages_hold_their_bytes_from_prefix_until_parsed_and_one_past_the_limit_ends_it() -> None:
    async def test(peer: _Peer) -> None:
        peer.call(1, _STREAM)
        peer.message(1, 1000, 10)
        await _turns()
        assert peer.budget.held == 2 * 1005 and peer.parsed == []
        peer.more(1, b"m" * 990 + b"\0" + (500).to_bytes(4, "big") + b"m" * 500)
        await _turns()
        assert peer.parsed == [1000, 500] and peer.budget.held == 0
        peer.message(1, 5 * MiB, 10)  # 10 MiB: past the limit, the stream ends
        await _turns()
        code, text = peer.statuses()[1]
        assert code == _RESOURCE_EXHAUSTED and text.startswith("request memory limit of 8 MiB reached")
        assert peer.budget.held == 0

    _run(test)


def test_a_compressed_message_counts_what_it_inflates_into_and_a_bomb_is_refused() -> None:
    async def test(peer: _Peer) -> None:
        packed = zlib.compress(bytes(2 * MiB), wbits=31)  # 2 MiB of zeros in a few KiB of gzip
        peer.call(1, _UNARY, ("grpc-encoding", "gzip"))
        peer.more(1, b"\1" + len(packed).to_bytes(4, "big") + packed)
        await _turns()
        peer.send(frame(DATA, http2.END_STREAM, 1, b""))
        await _turns()
        assert peer.budget.held == 2 * (len(packed) + 5) + 2 * 2 * MiB  # the message, and what it inflated into
        peer.release.set()
        await _turns()
        assert peer.statuses() == {1: ("0", "")} and peer.budget.held == 0
        bomb = zlib.compress(bytes(5 * MiB), wbits=31)  # inflates into 10 MiB of reservation: past the limit
        peer.call(3, _UNARY, ("grpc-encoding", "gzip"))
        peer.more(3, b"\1" + len(bomb).to_bytes(4, "big") + bomb, end=True)
        await _turns()
        code, text = peer.statuses()[3]
        assert code == _RESOURCE_EXHAUSTED and text.startswith("request memory limit of 8 MiB reached: this request needs 10 MiB")
        assert peer.budget.held == 0

    _run(test)


def test_a_small_call_is_refused_only_once_the_whole_limit_is_held() -> None:
    async def test(peer: _Peer) -> None:
        assert peer.budget.try_reserve(7 * MiB) and peer.budget.try_reserve(MiB - 100)
        peer.call(1, _UNARY)
        peer.message(1, 200, 200, end=True)  # reserves 410 bytes: past the limit
        await _turns()
        code, text = peer.statuses()[1]
        assert code == _RESOURCE_EXHAUSTED and "this request needs 410 bytes more" in text
        peer.budget.release(MiB - 100)
        peer.call(3, _UNARY)
        peer.message(3, 200, 200, end=True)
        peer.release.set()
        await _turns()
        assert peer.statuses() == {3: ("0", "")} and peer.budget.held == 7 * MiB

    _run(test)
