"""The server side of an HTTP/2 connection (RFC 9113), as much of it as gRPC needs, on an asyncio Protocol.

Frames are parsed with one struct call each and a whole unary response (headers, data, trailers) leaves in one
write. Flow control is honoured both ways: we advertise large receive windows and top them up as data arrives,
and we never send more DATA than the peer's windows allow (the excess waits per stream until WINDOW_UPDATE).
Subclasses get `on_request_headers`, `on_request_data` and `on_stream_reset`.

With `GrpcConnectionOptions` a connection also does what gRPC C++ servers do with tritonserver's channel flags:
keepalive PINGs and their watchdog, policing of clients that PING too often, and a maximum connection age.

`TransportLimits` bound what a hostile client can make it hold (docs/security.md): MAX_CONCURRENT_STREAMS and
MAX_HEADER_LIST_SIZE are advertised and enforced (a header block is bounded across CONTINUATION frames), flow
control is checked both ways (FLOW_CONTROL_ERROR), a connection that resets more streams than it completes is
sent GOAWAY (rapid reset, CVE-2023-44487), and floods of SETTINGS, PING and empty frames are refused.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import struct
from collections.abc import Callable
from typing import Any

from hpack.exceptions import HPACKError

from nereid.core.settings import GrpcConnectionOptions, TransportLimits
from nereid.frontends.grpc.header_blocks import HeaderDecoder

__all__ = ["Http2Connection", "Stream"]

log = logging.getLogger("nereid.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (RFC 9113 section 7) that this side sends, and CANCEL, which clients send.
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

SETTING_MAX_CONCURRENT_STREAMS, SETTING_INITIAL_WINDOW_SIZE, SETTING_MAX_FRAME_SIZE = 3, 4, 5
SETTING_MAX_HEADER_LIST_SIZE = 6

_FRAME_HEAD = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")

DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
# What we let a peer send before it must wait for us: large, so a big tensor arrives without round trips.
RECEIVE_WINDOW = 16 * 1024 * 1024
CONNECTION_RECEIVE_WINDOW = 64 * 1024 * 1024
LOCAL_MAX_FRAME = 1024 * 1024
# Keepalive times at or above this are off (gRPC core's INT_MAX sentinel; tritonserver's default is 2 hours).
KEEPALIVE_OFF_MS = 2**31 - 1
# A client that PINGs while it has no calls may do so every two hours (gRPC core's rule), unless permitted.
IDLE_PING_INTERVAL_S = 7200.0
MAX_STREAM_ID = 2**31 - 1
_AGE_PING = b"nereid-a"  # our PING before the final GOAWAY of a connection past its age


class _ConnectionError(Exception):
    """A connection error (RFC 9113 section 5.4.1): GOAWAY with this code, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


class Stream:
    """One request stream: its send window, DATA waiting for that window, and the subclass's call state."""

    __slots__ = ("id", "send_window", "pending", "unacked", "remote_closed", "flushed", "call")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.pending: collections.deque[tuple[int, bytes, bool]] = collections.deque()
        self.unacked = 0  # bytes received since our last WINDOW_UPDATE for this stream
        self.remote_closed = False
        self.flushed: asyncio.Future[None] | None = None
        self.call: Any = None


LINGER_SECS = 1.0
# Our ACKs a client may leave unread in our write buffer before its SETTINGS/PING are a flood.
MAX_UNREAD_CONTROL_BYTES = 1024 * 1024
_CONTROL_ACK_BYTES = 17  # a PING ACK: the 9-byte frame header and 8 bytes of payload


class Http2Connection(asyncio.Protocol):
    def __init__(self, options: GrpcConnectionOptions | None = None, limits: TransportLimits | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.options = options
        self.limits = limits = limits or TransportLimits()
        self.max_streams = limits.grpc_max_concurrent_streams
        self.max_header_block = limits.grpc_max_header_list_size
        self.reset_excess = 0  # streams the client reset, less the streams completed (never below 0)
        self.control_frames = 0  # SETTINGS, PING and empty frames from the client in the current second
        self.control_window = 0.0
        # Control frames answered while our write buffer never shrank: the client is not reading their ACKs.
        self.unread_control = 0
        self.last_buffered = 0
        self.lingering = False  # sent GOAWAY for an error: input is dropped until the connection closes
        self.transport: asyncio.Transport | None = None
        # Response frames written in one go at the end of the loop's turn: the responses of a batch that share
        # this connection leave in one write (one syscall here, one read and one wake-up for the client).
        self.outbox: list[bytes] = []
        self.buffer = bytearray()
        self.skipping = 0  # bytes still to come of a DATA frame whose stream has ended: dropped as they arrive
        self.preface_seen = False
        self.streams: dict[int, Stream] = {}
        self.headers = HeaderDecoder()
        self.headers.decoder.max_header_list_size = limits.grpc_max_header_list_size
        self.continuing: tuple[int, int, bytearray] | None = None  # stream id, flags, header block so far
        self.last_stream_id = 0
        self.going_away = False
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with DATA waiting for window, in arrival order
        self.timers: dict[str, asyncio.TimerHandle] = {}  # keepalive, watchdog, age...: all cancelled on close
        self.last_read = 0.0  # loop time of the client's last bytes: keepalive PINGs follow silence
        self.keepalive_pings = 0
        self.keepalive_ping_at = 0.0
        self.ping_strikes = 0
        self.last_ping_at = -IDLE_PING_INTERVAL_S
        self.frames_sent = 0  # HEADERS and DATA frames written: sending forgives a client's ping strikes
        self.ping_mark: tuple[int, int] | None = None  # (last stream, frames sent) at the client's last PING

    # -- subclass hooks ---------------------------------------------------------------------------------------
    def on_request_headers(self, stream: Stream, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def on_request_data(self, stream: Stream, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def on_stream_reset(self, stream: Stream) -> None:
        raise NotImplementedError

    def on_connection_lost(self) -> None:
        raise NotImplementedError

    def on_connection_failure(self, message: str) -> None:
        """The connection closes under its open calls (keepalive timeout, too many pings, age grace over)."""

    # -- transport events -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        assert self.transport is not None
        settings = (
            _SETTING.pack(SETTING_MAX_CONCURRENT_STREAMS, self.max_streams)
            + _SETTING.pack(SETTING_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
            + _SETTING.pack(SETTING_MAX_FRAME_SIZE, LOCAL_MAX_FRAME)
            + _SETTING.pack(SETTING_MAX_HEADER_LIST_SIZE, self.max_header_block)
        )
        raise_connection_window = _U32.pack(CONNECTION_RECEIVE_WINDOW - DEFAULT_WINDOW)
        self._write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, raise_connection_window))
        if self.options is not None:
            self._start_timers(self.options)
        # A connection that never sends the client preface holds a socket for nothing (slowloris on HTTP/2).
        self._schedule("preface", self.limits.http_header_timeout_secs, self._no_preface)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.outbox.clear()
        self.buffer = bytearray()  # freed now: a closed connection waits for the cyclic collector
        self.skipping = 0
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()
        for stream in self.streams.values():
            if stream.flushed is not None and not stream.flushed.done():
                stream.flushed.set_result(None)
        self.on_connection_lost()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_outbox()
            self.transport.close()

    def _queue(self, data: bytes) -> None:
        """Response frames: written by _flush_outbox, with those queued after them, when the loop's turn is over."""
        if not self.outbox:
            self.loop.call_soon(self._flush_outbox)
        self.outbox.append(data)

    def _flush_outbox(self) -> None:
        outbox = self.outbox
        if outbox:
            data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
            outbox.clear()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(data)

    def _write(self, data: bytes) -> None:
        """Any other frame: written now, after the response frames queued before it."""
        assert self.transport is not None
        if self.outbox:
            self._flush_outbox()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if self.lingering:
            return
        if self.skipping:  # the rest of a dropped stream's DATA frame, read off the socket and not kept
            if len(data) <= self.skipping:
                self.skipping -= len(data)
                return
            data = data[self.skipping :]
            self.skipping = 0
        if self.buffer:
            self.buffer += data
            buf: bytes | bytearray = self.buffer
        else:
            buf = data
        pos = 0
        if not self.preface_seen:
            if len(buf) < len(PREFACE):
                self.buffer = bytearray(buf)
                return
            if buf[: len(PREFACE)] != PREFACE:
                self.close()  # not HTTP/2 with prior knowledge, which every gRPC client speaks
                return
            self.preface_seen = True
            self._cancel_timer("preface")
            pos = len(PREFACE)
        size = len(buf)
        try:
            while size - pos >= 9:
                high, low, kind, flags, stream_id = _FRAME_HEAD.unpack_from(buf, pos)
                length = (high << 8) | low
                if length > LOCAL_MAX_FRAME:
                    self.fail(FRAME_SIZE_ERROR, f"frame of {length} bytes is over the {LOCAL_MAX_FRAME} we allow")
                    return
                end = pos + 9 + length
                stream_id &= 0x7FFFFFFF
                if end > size:
                    if kind == DATA and stream_id not in self.streams:
                        # A dropped stream's frame still arriving: counted now, and its bytes skipped as they come.
                        self._on_frame(DATA, flags & ~PADDED, stream_id, b"", length)
                        self.skipping = end - size
                        pos = size
                    break
                if kind == DATA and stream_id not in self.streams:
                    # DATA of a stream that has ended (refused, reset, answered) only counts against the connection's
                    # window: not copied, so a client sending on after a refusal costs no more than reading it.
                    self._on_frame(DATA, flags & ~PADDED, stream_id, b"", length)
                else:
                    self._on_frame(kind, flags, stream_id, bytes(buf[pos + 9 : end]), length)
                pos = end
                if self.transport is None or self.lingering:
                    return
        except _ConnectionError as exc:
            self.fail(exc.code, str(exc))
            return
        except (HPACKError, ValueError, IndexError, struct.error) as exc:
            self.fail(COMPRESSION_ERROR if isinstance(exc, HPACKError) else PROTOCOL_ERROR, str(exc))
            return
        if pos >= size:
            self.buffer = bytearray()
        elif pos or buf is not self.buffer:
            self.buffer = bytearray(buf[pos:])
        # (else the buffer holds one incomplete frame and nothing else: kept, not copied again on every read)

    def fail(self, code: int, reason: str) -> None:
        log.warning("closing HTTP/2 connection: %s", reason)
        self._write_goaway(self.last_stream_id, code, reason.encode()[:200])
        transport = self.transport
        if transport is None or not transport.can_write_eof():
            self.close()
            return
        # End our side and drop what the client still sends for a moment before closing: closing with unread
        # bytes (a flood) would reset the connection and destroy the GOAWAY that says why.
        self.lingering = True
        transport.write_eof()  # after the GOAWAY, which went out with every response frame queued before it
        self._schedule("linger", LINGER_SECS, self.close)

    def _write_goaway(self, last_stream_id: int, code: int, debug: bytes = b"") -> None:
        if self.transport is not None:
            self._write(frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug))

    # -- incoming frames --------------------------------------------------------------------------------------
    def _count_control_frame(self) -> None:
        """SETTINGS, PING and empty frames cost us work and (for the first two) an ACK each: more than the
        limit in one second, or ACKs left unread in our buffer, is a flood (CVE-2019-9512/9515/9518)."""
        now = self.loop.time()
        if now - self.control_window >= 1.0:
            self.control_window, self.control_frames = now, 0
        self.control_frames += 1
        if self.control_frames > self.limits.grpc_max_control_frames:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many control frames (SETTINGS, PING, empty frames)")
        if self.transport is None:
            return
        # A full buffer alone proves nothing (a large response fills it while the client reads on); a buffer
        # that never shrinks while control frames keep coming does.
        buffered = self.transport.get_write_buffer_size()
        if buffered == 0 or buffered < self.last_buffered:
            self.unread_control = 0
        else:
            self.unread_control += 1
        self.last_buffered = buffered
        if self.unread_control * _CONTROL_ACK_BYTES > MAX_UNREAD_CONTROL_BYTES:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "the client does not read our answers to its control frames")

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes, length: int) -> None:
        if self.continuing is not None and kind != CONTINUATION:
            raise ValueError("expected a CONTINUATION frame")
        if not length and kind != SETTINGS and kind != HEADERS and not flags & END_STREAM:
            self._count_control_frame()  # an empty DATA or CONTINUATION does nothing but cost a frame's work
        if kind == DATA:
            self._on_data(flags, stream_id, payload, length)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._on_headers(stream_id, flags, payload)
            else:
                self._check_header_block(len(payload))
                self.continuing = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self.continuing is None or self.continuing[0] != stream_id:
                raise ValueError("unexpected CONTINUATION frame")
            self.continuing[2].extend(payload)
            self._check_header_block(len(self.continuing[2]))
            if flags & END_HEADERS:
                first_flags, block = self.continuing[1], bytes(self.continuing[2])
                self.continuing = None
                self._on_headers(stream_id, first_flags, block)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._count_control_frame()
                self._on_settings(payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, _U32.unpack(payload)[0] & 0x7FFFFFFF)
        elif kind == PING:
            if flags & ACK:
                self._on_ping_ack(payload)
            elif self.transport is not None:
                self._count_control_frame()
                self._write(frame(PING, ACK, 0, payload))
                if self.options is not None and self._ping_strike(self.options):
                    self._too_many_pings()
        elif kind == RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self.blocked.pop(stream_id, None)
                if stream.flushed is not None and not stream.flushed.done():
                    stream.flushed.set_result(None)
                self.on_stream_reset(stream)
                self.reset_excess += 1
                if self.reset_excess > self.limits.grpc_max_reset_streams:
                    raise _ConnectionError(ENHANCE_YOUR_CALM, "too many streams reset by the client (rapid reset)")
        elif kind == GOAWAY:
            self.going_away = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            raise ValueError("a client cannot push")
        # PRIORITY and unknown frame types are ignored, as the RFC asks.

    def _check_header_block(self, size: int) -> None:
        # Bounded before it is decoded: a CONTINUATION flood (2024) would otherwise grow it without end.
        if size > self.max_header_block:
            raise _ConnectionError(
                ENHANCE_YOUR_CALM, f"header block over the {self.max_header_block} bytes of SETTINGS_MAX_HEADER_LIST_SIZE"
            )

    def _on_headers(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self.headers.decode(block)  # always decoded: the HPACK table is shared by the connection
        end_stream = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client end its side of the stream
            if end_stream:
                stream.remote_closed = True
                self.on_request_data(stream, b"", True)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            return  # a stream we already closed
        self.last_stream_id = stream_id
        if self.going_away:
            self.reset(stream_id, REFUSED_STREAM)
            return
        if len(self.streams) >= self.max_streams:
            self.reset(stream_id, REFUSED_STREAM)  # over the SETTINGS_MAX_CONCURRENT_STREAMS we advertised
            self.reset_excess += 1  # refused streams cost work too: a client that only opens them is flooding
            if self.reset_excess > self.limits.grpc_max_reset_streams:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "too many streams over SETTINGS_MAX_CONCURRENT_STREAMS")
            return
        stream = Stream(stream_id, self.peer_initial_window)
        stream.remote_closed = end_stream
        self.streams[stream_id] = stream
        self.on_request_headers(stream, headers, end_stream)

    def _on_data(self, flags: int, stream_id: int, payload: bytes, length: int) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        end_stream = bool(flags & END_STREAM)
        self.unacked += length
        if self.unacked > CONNECTION_RECEIVE_WINDOW:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection's flow-control window")
        updates = b""
        if self.unacked >= CONNECTION_RECEIVE_WINDOW // 2:
            updates = frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.unacked))
            self.unacked = 0
        stream = self.streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.unacked += length
            if stream.unacked > RECEIVE_WINDOW:
                self._reset_stream(stream, FLOW_CONTROL_ERROR)
                return
            if not end_stream and stream.unacked >= RECEIVE_WINDOW // 2:
                updates += frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked))
                stream.unacked = 0
        if updates and self.transport is not None:
            self._write(updates)
        if stream is None or stream.remote_closed:
            return
        stream.remote_closed = end_stream
        self.on_request_data(stream, payload, end_stream)

    def _on_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTING_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window size above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise _ConnectionError(FLOW_CONTROL_ERROR, "a stream's window above 2^31-1")
            elif key == SETTING_MAX_FRAME_SIZE:
                self.peer_max_frame = value
        if self.transport is not None:
            self._write(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            if not increment:
                raise ValueError("WINDOW_UPDATE with an increment of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if not increment:
                self._reset_stream(stream, PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset_stream(stream, FLOW_CONTROL_ERROR)
                return
        self._flush_blocked()

    def _reset_stream(self, stream: Stream, code: int) -> None:
        """A stream error: RST_STREAM to the client, and the call ends as if the client had reset it."""
        self.reset(stream.id, code)
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if stream.flushed is not None and not stream.flushed.done():
            stream.flushed.set_result(None)
        self.on_stream_reset(stream)

    # -- sending ----------------------------------------------------------------------------------------------
    def reset(self, stream_id: int, code: int) -> None:
        if self.transport is not None:
            self._write(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def send(self, stream: Stream, *items: tuple[int, bytes, bool]) -> None:
        """Queue (HEADERS or DATA, payload, end of stream) items and write what the windows allow, in one write;
        the rest waits on the stream for WINDOW_UPDATE. While other streams are open, more responses may follow
        in this turn of the loop, and the write waits for its end; the last open stream's frames go at once."""
        if self.transport is None:
            return
        stream.pending.extend(items)
        out: list[bytes] = []
        self._drain(stream, out)
        if out:
            if self.streams:
                self._queue(b"".join(out))
            else:
                self._write(b"".join(out))
        if stream.pending:
            self.blocked[stream.id] = stream

    def _drain(self, stream: Stream, out: list[bytes]) -> None:
        pending = stream.pending
        while pending:
            kind, payload, end = pending[0]
            if kind != DATA:
                pending.popleft()
                out.append(frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), stream.id, payload))
                self.frames_sent += 1
                if end:
                    self._finish(stream)
                continue
            allowed = min(self.send_window, stream.send_window, self.peer_max_frame)
            if allowed <= 0 and payload:
                return
            chunk = payload[:allowed]
            whole = len(chunk) == len(payload)
            out.append(frame(DATA, END_STREAM if whole and end else 0, stream.id, chunk))
            self.frames_sent += 1
            self.send_window -= len(chunk)
            stream.send_window -= len(chunk)
            if not whole:
                pending[0] = (DATA, payload[len(chunk) :], end)
                continue
            pending.popleft()
            if end:
                self._finish(stream)
        if stream.flushed is not None and not stream.flushed.done():
            stream.flushed.set_result(None)

    def _finish(self, stream: Stream) -> None:
        """We ended the stream. Whatever the client still sends on it is dropped (grpc-core reads an
        RST_STREAM here as a failed call, even with NO_ERROR, so none is sent)."""
        if self.reset_excess:
            self.reset_excess -= 1  # a completed stream makes up for one the client reset
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if self.going_away and not self.streams:
            self.loop.call_soon(self.close)

    def _flush_blocked(self) -> None:
        if not self.blocked or self.transport is None:
            return
        out: list[bytes] = []
        for stream in list(self.blocked.values()):
            self._drain(stream, out)
            if not stream.pending:
                self.blocked.pop(stream.id, None)
            if self.send_window <= 0:
                break
        if out:
            self._queue(b"".join(out))

    async def flushed(self, stream: Stream) -> None:
        """Wait until the stream's queued DATA has been written (backpressure for streaming responses)."""
        if stream.pending and self.transport is not None:
            stream.flushed = self.loop.create_future()
            await stream.flushed

    def go_away(self) -> None:
        """Graceful shutdown: no new streams; the connection closes when its last stream ends."""
        if self.going_away or self.transport is None:
            return
        self.going_away = True
        self._write(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream_id) + _U32.pack(NO_ERROR)))
        if not self.streams:
            self.close()

    # -- keepalive, ping policing and connection age, as gRPC C++ servers do them -----------------------------
    def _schedule(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        old = self.timers.pop(name, None)
        if old is not None:
            old.cancel()
        self.timers[name] = self.loop.call_later(delay, self._fire, name, callback)

    def _fire(self, name: str, callback: Callable[[], None]) -> None:
        self.timers.pop(name, None)
        if self.transport is not None:
            callback()

    def _cancel_timer(self, name: str) -> bool:
        handle = self.timers.pop(name, None)
        if handle is not None:
            handle.cancel()
        return handle is not None

    def _no_preface(self) -> None:
        if not self.preface_seen:
            log.info("closing HTTP/2 connection: no client preface within the header timeout")
            self.close()

    def _start_timers(self, options: GrpcConnectionOptions) -> None:
        if 0 < options.keepalive_time_ms < KEEPALIVE_OFF_MS:
            self._schedule("keepalive", options.keepalive_time_ms / 1000, self._keepalive)
        if options.max_connection_age_ms > 0:
            # gRPC core's +-10% jitter, so connections opened together do not all end together.
            age = options.max_connection_age_ms / 1000 * random.uniform(0.9, 1.1)
            self._schedule("age", age, self._age_reached)

    def _keepalive(self) -> None:
        """After a keepalive time without a byte from the client, PING it (while it has calls, unless permitted
        without) and expect an answer within the keepalive timeout."""
        assert self.options is not None and self.transport is not None
        interval = self.options.keepalive_time_ms / 1000
        silence = self.loop.time() - self.last_read
        if silence < interval:
            self._schedule("keepalive", interval - silence, self._keepalive)
        elif not (self.streams or self.options.keepalive_permit_without_calls):
            self._schedule("keepalive", interval, self._keepalive)
        else:
            self.keepalive_pings += 1
            self.keepalive_ping_at = self.loop.time()
            self._write(frame(PING, 0, 0, self.keepalive_pings.to_bytes(8, "big")))
            self._schedule("watchdog", self.options.keepalive_timeout_ms / 1000, self._keepalive_timed_out)

    def _keepalive_timed_out(self) -> None:
        assert self.options is not None
        if self.last_read > self.keepalive_ping_at:  # no ACK, but the client is sending: alive, as gRPC core sees it
            self._keepalive()
            return
        log.info("closing gRPC connection: no answer to a keepalive PING")
        self.on_connection_failure("keepalive watchdog timeout")
        self.close()

    def _on_ping_ack(self, payload: bytes) -> None:
        if payload == _AGE_PING:
            if self._cancel_timer("age_ping"):
                self.go_away()
        elif self._cancel_timer("watchdog"):
            assert self.options is not None
            self._schedule("keepalive", self.options.keepalive_time_ms / 1000, self._keepalive)

    def _ping_strike(self, options: GrpcConnectionOptions) -> bool:
        """A client PING sooner than allowed after its last is a strike; True when the strikes are too many.
        Strikes are forgiven once we have sent or begun calls since the client's last PING (gRPC core forgives
        them when it sends data)."""
        if options.http2_max_ping_strikes <= 0:  # 0: no limit
            return False
        # Not the send window: WINDOW_UPDATEs can bring it back to where it was while DATA flowed in between.
        mark = (self.last_stream_id, self.frames_sent)
        if mark != self.ping_mark:
            self.ping_mark, self.ping_strikes, self.last_ping_at = mark, 0, -IDLE_PING_INTERVAL_S
        idle = not self.streams and not options.keepalive_permit_without_calls
        interval = IDLE_PING_INTERVAL_S if idle else options.http2_min_recv_ping_interval_without_data_ms / 1000
        now = self.loop.time()
        if now < self.last_ping_at + interval:
            self.ping_strikes += 1
        self.last_ping_at = now
        return self.ping_strikes > options.http2_max_ping_strikes

    def _too_many_pings(self) -> None:
        log.info("closing gRPC connection: the client sends too many PINGs")
        self._write_goaway(self.last_stream_id, ENHANCE_YOUR_CALM, b"too_many_pings")
        self.on_connection_failure("Too many pings")
        self.close()

    def _age_reached(self) -> None:
        """Past --grpc-max-connection-age: a first GOAWAY that still admits streams already on their way, and a
        PING; its ACK (or, from a silent client, the keepalive timeout) brings the final GOAWAY, after which the
        connection closes when its last call ends, or when the grace period is over."""
        assert self.options is not None and self.transport is not None
        if self.going_away:
            return
        self._write_goaway(MAX_STREAM_ID, NO_ERROR)
        self._write(frame(PING, 0, 0, _AGE_PING))
        self._schedule("age_ping", self.options.keepalive_timeout_ms / 1000, self.go_away)
        if self.options.max_connection_age_grace_ms > 0:  # 0: no limit, as in tritonserver
            self._schedule("grace", self.options.max_connection_age_grace_ms / 1000, self._grace_over)

    def _grace_over(self) -> None:
        log.info("closing gRPC connection: its calls outlived --grpc-max-connection-age-grace")
        self.on_connection_failure("max connection age grace period is over")
        self.close()
