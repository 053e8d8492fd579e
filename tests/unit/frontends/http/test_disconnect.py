"""DisconnectWatch: a client that goes away cancels the work done for it, and the `with` ends quietly saying so;
any other cancellation still propagates."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nereid.core.errors import NereidError, Status
from nereid.frontends.http.disconnect import DisconnectWatch


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


def test_a_lost_connection_cancels_the_work_and_ends_the_watch_quietly() -> None:
    async def main() -> tuple[bool, bool]:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(lost.set_result, None)
        finished = False
        with DisconnectWatch(_never, lost) as watch:
            await asyncio.sleep(30)
            finished = True
        await asyncio.sleep(0)  # the task is not left cancelled
        return watch.disconnected, finished

    assert asyncio.run(asyncio.wait_for(main(), 10)) == (True, False)


def test_an_http_disconnect_message_cancels_the_work_without_a_lost_future() -> None:
    messages = [{"type": "http.request"}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0)
        return messages.pop(0)

    async def main() -> bool:
        with DisconnectWatch(receive) as watch:
            await asyncio.sleep(30)
        return watch.disconnected

    assert asyncio.run(asyncio.wait_for(main(), 10)) is True


def test_work_that_ends_first_is_untouched_and_another_cancellation_propagates() -> None:
    async def main() -> None:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with DisconnectWatch(_never, lost) as watch:
            await asyncio.sleep(0)
        assert not watch.disconnected and not lost._callbacks  # type: ignore[attr-defined]
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)
        with pytest.raises(asyncio.CancelledError), DisconnectWatch(_never, lost):
            await asyncio.sleep(30)
        task.uncancel()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_connection_already_lost_is_refused_before_any_work() -> None:
    async def main() -> None:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lost.set_result(None)
        with pytest.raises(NereidError) as excinfo, DisconnectWatch(_never, lost):
            raise AssertionError("the work must not start")
        assert excinfo.value.status == Status.CANCELLED

    asyncio.run(main())
