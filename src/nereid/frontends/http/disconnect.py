"""Cancel the work done for an HTTP request when its client goes away: the one watcher that /infer, generate,
Server-Sent Events and the OpenAI API run their requests under. It only cancels and tells whether the cancellation
was the client's; what to answer (or not) is the caller's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from nereid.core.errors import NereidError, Status

__all__ = ["DisconnectWatch", "client_disconnected"]

Receive = Callable[[], Awaitable[dict[str, Any]]]

_MESSAGE = "Request was cancelled: the client disconnected"


def client_disconnected() -> NereidError:
    """The error of a request whose client went away (a queued one never executes)."""
    return NereidError(Status.CANCELLED, _MESSAGE)


class DisconnectWatch:
    """`with DisconnectWatch(receive, lost) as watch:` cancels the current task when the client disconnects; the
    cancellation it caused ends the `with` quietly, with `watch.disconnected` set. `lost` is the connection-lost
    future Nereid's own HTTP server hands over (a callback, no task); without it a task watches `receive` for
    http.disconnect. A connection already lost when the watch starts raises the CANCELLED error at once."""

    __slots__ = ("_receive", "_lost", "_task", "_watcher", "disconnected")

    def __init__(self, receive: Receive, lost: asyncio.Future[None] | None = None) -> None:
        self._receive = receive
        self._lost = lost
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False

    def __enter__(self) -> DisconnectWatch:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        lost = self._lost
        if lost is not None:
            if lost.done():
                raise client_disconnected()
            lost.add_done_callback(self._on_lost)
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        if self._lost is not None:
            self._lost.remove_done_callback(self._on_lost)
        elif self._watcher is not None:
            self._watcher.cancel()
        if kind is asyncio.CancelledError and self.disconnected:
            self._task.uncancel()
            return True
        return False

    def _on_lost(self, _: Any) -> None:
        self.disconnected = True
        self._task.cancel()

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self._task.cancel()
