"""A fake asyncio transport for driving a connection protocol (HTTP/1.1 or HTTP/2) byte by byte in unit tests: it
records what the server writes and whether it closed, and reads back HTTP/2 frames."""

from __future__ import annotations

import struct

__all__ = ["FakeTransport"]


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False  # a failing connection then closes at once, which tests watch for

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """The HTTP/2 frames written since the last call, as (type, flags, stream id, payload)."""
        out, pos = [], 0
        while pos < len(self.written):
            high, low, kind, flags, stream_id = struct.unpack_from(">HBBBI", self.written, pos)
            length = (high << 8) | low
            out.append((kind, flags, stream_id, bytes(self.written[pos + 9 : pos + 9 + length])))
            pos += 9 + length
        self.written.clear()
        return out
