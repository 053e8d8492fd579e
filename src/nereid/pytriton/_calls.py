"""The thread an instance's inference callable runs on, whether a batch goes there or runs on the event loop, and
how one call's result is driven to completion: plain results, generators, coroutines and async generators, as
PyTriton accepts them.

Only threading and iteration here: what the results mean is the backend's business.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CallPlacement", "CallThread", "iterate_results", "LOOP_BATCH_NS"]

# A batch expected to take less than this runs on the event loop (see CallPlacement).
LOOP_BATCH_NS = 500_000
# Runs on the thread measured before their fastest decides; the weight of each run on the loop in its average.
_THREAD_SAMPLES = 8
_LOOP_WEIGHT = 0.2


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


class CallPlacement:
    """Whether a batch runs on the event loop or goes to the instance thread, from the measured cost per request.

    Handing a batch to the thread and taking the responses back costs about 170 µs of latency per batch here (two
    thread wake-ups and the GIL's hand-offs: an add/sub batch's server-side compute input and output take about 88
    and 105 µs through the thread, 5 and 15 µs on the loop), and a function that holds the GIL cannot run beside the
    loop anyway. So a batch whose call is expected to take less than LOOP_BATCH_NS runs on the loop; slower
    callables (a model that computes for milliseconds with the GIL released, a call that waits) keep the loop free
    on their thread. Runs on the thread wait for the GIL under load and look slower than they are, so the estimate
    from them is the fastest of a few; runs on the loop are timed cleanly, and their moving average sends bigger
    batches, or all of them, back to the thread when the callable slows down.
    """

    __slots__ = ("_per_request_ns", "_thread_runs")

    def __init__(self) -> None:
        self._per_request_ns = float("inf")  # unknown until measured: the thread
        self._thread_runs: list[float] = []

    def on_loop(self, requests: int) -> bool:
        return requests * self._per_request_ns < LOOP_BATCH_NS

    def observe(self, run_ns: int, requests: int, on_loop: bool) -> None:
        per_request = run_ns / max(1, requests)
        if on_loop:
            self._per_request_ns += _LOOP_WEIGHT * (per_request - self._per_request_ns)
            return
        self._thread_runs.append(per_request)
        if len(self._thread_runs) >= _THREAD_SAMPLES:
            self._per_request_ns = min(self._thread_runs)
            self._thread_runs.clear()

    def leave_loop(self) -> None:
        """The callable turned out to need the thread (it returned a coroutine): measure it there again."""
        self._per_request_ns = float("inf")
        self._thread_runs.clear()


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
