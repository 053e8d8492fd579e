"""The body step every HTTP route shares, run once before dispatch: the whole body within --http-max-input-size
(however many ASGI messages carry it), refused in the one wording the transport's refusal uses too, and
Content-Encoding undone within the same limit."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import pytest

from nereid.core.errors import NereidError, Status
from nereid.frontends.http.body import body_too_large, inflate, read_body


def _read(messages: list[dict[str, Any]], limit: int) -> bytes:
    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return asyncio.run(read_body(receive, limit))


def test_a_body_in_one_message_is_handed_over_as_it_came() -> None:
    body = b'{"inputs":[]}'
    assert _read([{"type": "http.request", "body": body}], 100) is body


def test_a_body_in_several_messages_is_joined() -> None:
    messages = [{"body": b"ab", "more_body": True}, {"body": b"", "more_body": True}, {"body": b"cd"}]
    assert _read(messages, 4) == b"abcd"


@pytest.mark.parametrize(
    ("messages", "size"),
    [
        ([{"body": b"x" * 11}], 11),
        ([{"body": b"x" * 11, "more_body": True}, {"body": b"y"}], 11),  # refused before the rest is read
        ([{"body": b"x" * 6, "more_body": True}, {"body": b"y" * 6, "more_body": True}, {"body": b"z"}], 12),
    ],
)
def test_a_body_past_the_limit_is_refused_with_its_size_so_far(messages: list[dict[str, Any]], size: int) -> None:
    with pytest.raises(NereidError) as caught:
        _read(messages, 10)
    assert caught.value.status is Status.INVALID_ARG
    assert caught.value.message == (
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of 10 bytes. "
        "Use --http-max-input-size to increase the limit."
    )


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [(b"gzip", lambda data: gzip.compress(data)), (b" Deflate ", zlib.compress), (b"identity", lambda data: data)],
)
def test_a_compressed_body_is_inflated(encoding: bytes, compress: Any) -> None:
    assert inflate(compress(b"payload" * 10), encoding, 100) == b"payload" * 10


def test_a_body_that_inflates_past_the_limit_is_refused() -> None:
    with pytest.raises(NereidError) as caught:
        inflate(gzip.compress(b"0" * 1000), b"gzip", 999)
    assert caught.value.status is Status.INVALID_ARG
    assert caught.value.message == body_too_large(None, 999)
    assert "Decompressed data size exceeds the maximum allowed value of 999 bytes" in caught.value.message


def test_a_raw_binary_body_past_the_limit_is_named_as_tritonserver_names_it() -> None:
    assert body_too_large(20, 10, json_header=0) == (
        "Raw input has a byte_size (20 bytes) that exceeds the maximum allowed value of 10 bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def test_an_unknown_or_broken_encoding_is_refused() -> None:
    with pytest.raises(NereidError) as unknown:
        inflate(b"x", b"br", 100)
    assert unknown.value.status is Status.UNSUPPORTED and "'br'" in unknown.value.message
    with pytest.raises(NereidError) as broken:
        inflate(b"not gzip", b"gzip", 100)
    assert broken.value.status is Status.INVALID_ARG and "failed to decompress the request body (gzip)" in broken.value.message
