"""HPACK header blocks as the gRPC server needs them (RFC 7541): responses' blocks encoded without encoder state,
so each can be built once and reused, and requests' blocks decoded with a cache for the blocks a client repeats."""

from __future__ import annotations

from hpack import Decoder

__all__ = ["HeaderDecoder", "encode_headers"]


def _literal(text: bytes) -> bytes:
    """An HPACK string literal, not Huffman coded (7-bit prefix length)."""
    length = len(text)
    if length < 127:
        return bytes((length,)) + text
    out = bytearray((127,))
    length -= 127
    while length >= 128:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + text


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Literal header fields without indexing: no encoder state, so a block can be built once and reused."""
    out = []
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(b"\x88")  # static table entry 8
        else:
            out.append(b"\x00" + _literal(name) + _literal(value))
    return b"".join(out)


class HeaderDecoder:
    """HPACK decoding with a cache of the blocks that left the dynamic table as it was.

    A client repeating a call sends the same header block each time. If decoding a block did not change the
    table, the block decodes to the same headers for as long as the table stays unchanged; any block that
    does change it (a new entry, an eviction, a size update) empties the cache.
    """

    MAX_CACHED = 256

    def __init__(self) -> None:
        self.decoder = Decoder()
        self.cache: dict[bytes, list[tuple[str, str]]] = {}

    def _table_state(self) -> tuple[int, int, int]:
        table = self.decoder.header_table
        entries = table.dynamic_entries
        # A new entry goes to the front while the old front stays in the table, so its identity is a change mark.
        return len(entries), id(entries[0]) if entries else 0, table.maxsize

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        headers = self.cache.get(block)
        if headers is not None:
            return headers
        before = self._table_state()
        headers = list(self.decoder.decode(block))  # type: ignore[arg-type]
        if self._table_state() != before:
            self.cache.clear()
        elif len(self.cache) < self.MAX_CACHED:
            self.cache[block] = headers
        return headers
