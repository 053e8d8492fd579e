"""HttpRequest, what an HTTP handler receives: its disconnect watch follows the transport's lost-connection future
when there is one (a client already gone is refused at once), else the ASGI receive; headers are read by name."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nereid.core.errors import NereidError, Status
from nereid.frontends.http.request import HttpRequest


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


def test_the_watch_cancels_the_work_when_the_connection_is_lost() -> None:
    async def main() -> bool:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request = HttpRequest(b"", [], _never, lost)
        asyncio.get_running_loop().call_later(0.01, lost.set_result, None)
        with request.disconnect_watch() as watch:
            await asyncio.sleep(30)
        return watch.disconnected

    assert asyncio.run(asyncio.wait_for(main(), 10))


def test_a_client_already_gone_is_refused_before_any_work() -> None:
    async def main() -> None:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lost.set_result(None)
        with HttpRequest(b"", [], _never, lost).disconnect_watch():
            pytest.fail("the work ran for a client that was gone")

    with pytest.raises(NereidError) as caught:
        asyncio.run(main())
    assert caught.value.status is Status.CANCELLED


def test_without_a_lost_future_the_watch_reads_receive_for_the_disconnect() -> None:
    messages = [{"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return messages.pop(0)

    async def main() -> bool:
        with HttpRequest(b"", [], receive).disconnect_watch() as watch:
            await asyncio.sleep(30)
        return watch.disconnected

    assert asyncio.run(asyncio.wait_for(main(), 10))


def test_a_header_is_read_by_its_lower_case_name() -> None:
    request = HttpRequest(b"", [(b"Traceparent", b"00-abc-01"), (b"host", b"h")], _never)
    assert request.header(b"traceparent") == "00-abc-01" and request.header(b"missing") == ""
    assert request.parameters == ()
