"""A connection's write back-pressure as the responses written on it see it: uvicorn's FlowControl for writing.
The connection pauses and resumes it from its transport's callbacks; a response waits on it, and never sees the
connection."""

from __future__ import annotations

import asyncio

__all__ = ["FlowControl"]


class FlowControl:
    """While the client does not read (the transport's write buffer is over its high mark), `drained` is a future
    that completes once it reads again or goes away, and `paused_at` is when that began (loop time)."""

    __slots__ = ("loop", "drained", "paused_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.drained: asyncio.Future[None] | None = None
        self.paused_at = 0.0

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()
            self.paused_at = self.loop.time()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
