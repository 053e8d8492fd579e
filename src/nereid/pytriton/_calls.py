"""The thread an instance's inference callable runs on, and how one call's result is driven to completion there:
plain results, generators, coroutines and async generators, as PyTriton accepts them.

Only threading and iteration here: what the results mean is the backend's business.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CallThread", "iterate_results"]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class CallThread:
    """One daemon thread that runs jobs in order; `run` awaits a job from the server's event loop.

    A thread of its own per instance (rather than a shared executor) keeps an instance's calls on one thread, as
    PyTriton's inference handlers do, so callables that keep thread-local state (CUDA streams, sessions) work.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's own loop, for async callables
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, loop: asyncio.AbstractEventLoop, job: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future = loop.create_future()
        self._jobs.put((job, args, loop, future))
        return future

    def async_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this thread runs coroutines on (created on first use, from inside the thread)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _serve(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, args, loop, future = item
            try:
                result, error = job(*args), None
            except BaseException as exc:  # the job's failure belongs to its caller, never to this thread
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the server's loop has closed: nobody waits for this answer
                pass
        if self._loop is not None:
            self._loop.close()

    def close(self) -> None:
        self._jobs.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class _LoopOwner(Protocol):
    def async_loop(self) -> asyncio.AbstractEventLoop: ...


def iterate_results(result: Any, thread: _LoopOwner) -> Any:
    """Each result a call produced, in order, on the calling (instance) thread: a plain value once, a generator's
    yields, a coroutine's value, an async generator's yields (run on the thread's own loop)."""
    if inspect.iscoroutine(result):
        yield thread.async_loop().run_until_complete(result)
    elif inspect.isasyncgen(result):
        loop = thread.async_loop()
        try:
            while True:
                try:
                    yield loop.run_until_complete(result.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(result.aclose())
    elif inspect.isgenerator(result):
        yield from result
    else:
        yield result
