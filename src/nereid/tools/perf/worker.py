"""Load-generator worker processes (multiprocessing spawn): each runs one uvloop event loop with async HTTP or
gRPC clients, records per-request timestamps, and answers the parent's start / drain / stop / exit commands
over a pipe (`worker_pool.WorkerPool` is the parent's side). Workers never print; they report errors."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nereid.tools.perf.load_modes import LevelPlan, SequencePlan, SequenceSource, send_times, sequence_parameters
from nereid.tools.perf.wire import GrpcTemplate, HttpTarget, HttpTemplate, grpc_request_suffix, http_request

__all__ = ["Records", "WorkerPlan", "worker_main"]

_ERROR_PAUSE_S = 0.005
_MIN_SLEEP_NS = 1_000_000  # after a failed request, so a refusing server does not turn a worker into a busy loop


@dataclass(slots=True)
class WorkerPlan:
    index: int
    count: int
    protocol: str  # http | grpc
    streaming: bool
    decoupled: bool
    http: HttpTarget | None
    grpc_target: str
    templates: list[list[Any]]  # [stream][step] -> HttpTemplate | GrpcTemplate
    sequence: SequencePlan | None
    num_of_sequences: int  # this worker's share in request-rate mode
    request_timeout_s: float
    grpc_channels: int
    seed: int


@dataclass(slots=True)
class Records:
    """What a worker completed since the previous drain, plus running totals."""

    start_ns: array = field(default_factory=lambda: array("q"))
    end_ns: array = field(default_factory=lambda: array("q"))
    first_ns: array = field(default_factory=lambda: array("q"))  # streaming: first response
    responses: array = field(default_factory=lambda: array("q"))  # streaming: responses per request
    errors: int = 0
    first_error: str = ""
    send_ns: int = 0
    recv_ns: int = 0
    delayed: int = 0
    sent_total: int = 0  # since the level started
    completed_total: int = 0
    errors_total: int = 0
    in_flight: int = 0
    cpu_s: float = 0.0  # this process's CPU time so far
    at_ns: int = 0


class _PerfWorker:
    """The load loop of one `nereid perf` client process: sends its share of the plan's requests and reports."""

    def __init__(self, plan: WorkerPlan, conn: multiprocessing.connection.Connection) -> None:
        self.plan = plan
        self.conn = conn
        self.records = Records()
        self.running = False
        self.tasks: list[asyncio.Task[None]] = []
        self.open_requests: set[asyncio.Task[None]] = set()
        self.counter = 0
        self.sent = 0
        self.completed = 0
        self.errors = 0
        self.in_flight = 0
        self.http_connections: list[Any] = []
        self.channels: list[Any] = []
        self.prebuilt: list[bytes] = []
        self.sequences: SequenceSource | None = None
        self.stop_hooks: list[Callable[[], object]] = []

    # -- control ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_exception)
        self.commands: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        loop.add_reader(self.conn.fileno(), self._on_command)
        # uvloop makes watched descriptors non-blocking; replies (drained records can be megabytes) must be
        # written whole, and the parent is always reading when we answer.
        os.set_blocking(self.conn.fileno(), True)
        self._setup()
        self.conn.send(("ready",))
        while True:
            command = await self.commands.get()
            kind = command[0]
            if kind == "start":
                self._start(command[1])
                self.conn.send(("started",))
            elif kind == "drain":
                self.conn.send(("records", self._drain()))
            elif kind == "stop":
                await self._stop(float(command[1]))
                self.conn.send(("stopped", self._drain()))
            else:  # exit
                loop.remove_reader(self.conn.fileno())
                await self._close()
                return

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self._error(f"load worker internal error: {type(exc).__name__ if exc else ''} {exc or context.get('message')}")

    def _watch(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self._error(f"load worker internal error: {type(exc).__name__}: {exc}")

    def _on_command(self) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            message = ("exit",)
        self.commands.put_nowait(message)

    def _setup(self) -> None:
        plan = self.plan
        if plan.sequence is not None:
            self.sequences = SequenceSource(plan.sequence, plan.index, plan.count, plan.seed)
        if plan.protocol == "grpc":
            from nereid.tools.perf.grpc_client import open_channels

            self.channels = open_channels(plan.grpc_target, plan.grpc_channels)
        if plan.sequence is None and not plan.streaming:
            # Ordinary requests are fixed: build every byte once.
            if plan.protocol == "http":
                assert plan.http is not None
                self.prebuilt = [http_request(plan.http, t) for t in plan.templates[0]]
            else:
                self.prebuilt = [t.message for t in plan.templates[0]]

    def _drain(self) -> Records:
        records = self.records
        for conn in self.http_connections:
            records.recv_ns += conn.recv_ns
            conn.recv_ns = 0
        records.sent_total = self.sent
        records.completed_total = self.completed
        records.errors_total = self.errors
        records.in_flight = self.in_flight
        records.cpu_s = time.process_time()
        records.at_ns = time.monotonic_ns()
        self.records = Records()
        return records

    def _start(self, level: LevelPlan) -> None:
        self.running = True
        self.sent = self.completed = self.errors = 0  # totals are per level
        if level.concurrency > 0:
            body = {
                ("http", False): self._http_closed_loop,
                ("grpc", False): self._grpc_closed_loop,
                ("grpc", True): self._stream_closed_loop,
            }[(self.plan.protocol, self.plan.streaming)]
            self.tasks = [self._watch(asyncio.ensure_future(body(slot))) for slot in range(level.concurrency)]
        elif level.rate > 0:
            self.tasks = [self._watch(asyncio.ensure_future(self._open_loop(level)))]

    async def _stop(self, timeout_s: float) -> None:
        self.running = False
        for hook in self.stop_hooks:
            hook()
        self.stop_hooks.clear()
        waiting = [*self.tasks, *self.open_requests]
        if waiting:
            _, pending = await asyncio.wait(waiting, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
                lost = self.in_flight
                if lost:
                    self._error(f"{lost} request(s) got no response within {timeout_s:g} s", count=lost)
                    self.in_flight = 0
        self.tasks = []
        self.open_requests.clear()

    async def _close(self) -> None:
        for conn in self.http_connections:
            conn.close()
        for channel in self.channels:
            await channel.close()

    # -- bookkeeping -----------------------------------------------------------------------------------------
    def _error(self, message: str, count: int = 1) -> None:
        self.errors += count
        self.records.errors += count
        if not self.records.first_error:
            self.records.first_error = message

    def _request_bytes(self) -> tuple[bytes, str]:
        """The next ordinary request (round-robin over the data) and, for streams, its id."""
        plan = self.plan
        k = self.counter
        self.counter = k + 1
        if self.prebuilt:
            return self.prebuilt[k % len(self.prebuilt)], ""
        request_id = f"{plan.index}.{k}"
        template = plan.templates[0][k % len(plan.templates[0])]
        return self._assemble(template, request_id, None), request_id

    def _assemble(self, template: Any, request_id: str, parameters: dict[str, Any] | None) -> bytes:
        if isinstance(template, HttpTemplate):
            assert self.plan.http is not None
            return http_request(self.plan.http, template, request_id if self.plan.streaming else "", parameters)
        assert isinstance(template, GrpcTemplate)
        return template.message + grpc_request_suffix(request_id, parameters)

    def _sequence_steps(self) -> Any:
        """Endless (bytes, request id) pairs for one closed-loop slot: sequence after sequence."""
        assert self.sequences is not None
        plan = self.plan
        while True:
            sequence_id, length, stream = self.sequences.next_sequence()
            steps = plan.templates[stream]
            for step in range(length):
                k = self.counter
                self.counter = k + 1
                request_id = f"{plan.index}.{k}"
                yield self._assemble(steps[step % len(steps)], request_id, sequence_parameters(sequence_id, step, length)), request_id

    # -- closed loop (concurrency) ---------------------------------------------------------------------------
    async def _http_closed_loop(self, slot: int) -> None:
        from nereid.tools.perf.http_client import open_connection

        assert self.plan.http is not None
        host, port = self.plan.http.host, self.plan.http.port
        steps = self._sequence_steps() if self.sequences is not None else None
        now = time.monotonic_ns
        conn = None
        while self.running:
            if conn is None or conn.closed:
                try:
                    conn = await open_connection(host, port)
                except OSError as exc:
                    self._error(f"cannot connect to {host}:{port}: {exc.strerror or exc}")
                    await asyncio.sleep(_ERROR_PAUSE_S)
                    continue
                self.http_connections.append(conn)
            data = next(steps)[0] if steps is not None else self._request_bytes()[0]
            self.sent += 1
            self.in_flight += 1
            t0 = now()
            try:
                waiter = conn.request(data)
                t1 = now()
                status, body = await waiter
            except ConnectionError as exc:
                self.in_flight -= 1
                self._error(str(exc))
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            end = now()
            self.in_flight -= 1
            records = self.records
            records.send_ns += t1 - t0
            if status == 200:
                self.completed += 1
                records.start_ns.append(t0)
                records.end_ns.append(end)
            else:
                self._error(f"HTTP {status}: {_error_text(body)}")
                await asyncio.sleep(_ERROR_PAUSE_S)

    async def _grpc_closed_loop(self, slot: int) -> None:
        import grpc

        from nereid.tools.perf.grpc_client import unary_method

        call = unary_method(self.channels[slot % len(self.channels)])
        steps = self._sequence_steps() if self.sequences is not None else None
        timeout = self.plan.request_timeout_s
        now = time.monotonic_ns
        while self.running:
            data = next(steps)[0] if steps is not None else self._request_bytes()[0]
            self.sent += 1
            self.in_flight += 1
            t0 = now()
            try:
                await call(data, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                self.in_flight -= 1
                self._error(f"gRPC {exc.code().name}: {exc.details()}")
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            end = now()
            self.in_flight -= 1
            self.completed += 1
            self.records.start_ns.append(t0)
            self.records.end_ns.append(end)

    async def _stream_closed_loop(self, slot: int) -> None:
        import grpc

        from nereid.tools.perf.grpc_client import decode_stream_reply, stream_method

        method = stream_method(self.channels[slot % len(self.channels)])
        steps = self._sequence_steps() if self.sequences is not None else None
        decoupled = self.plan.decoupled
        now = time.monotonic_ns
        call = None
        while self.running:
            if call is None:
                call = method()
            data, request_id = next(steps) if steps is not None else self._request_bytes()
            self.sent += 1
            self.in_flight += 1
            t0 = now()
            first = 0
            count = 0
            try:
                await call.write(data)
                t1 = now()
                while True:
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        raise ConnectionError("the server ended the stream")
                    reply = decode_stream_reply(raw, decoupled)
                    if reply.request_id and reply.request_id != request_id:
                        continue  # a late reply to an earlier, failed request
                    if reply.error:
                        raise _RequestFailed(reply.error)
                    if reply.has_outputs:
                        count += 1
                        if not first:
                            first = now()
                    if reply.final:
                        break
            except _RequestFailed as exc:
                self.in_flight -= 1
                self._error(f"stream: {exc}")
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            except (grpc.aio.AioRpcError, ConnectionError, grpc.aio.UsageError) as exc:
                self.in_flight -= 1
                self._error(_grpc_error(exc))
                call.cancel()
                call = None
                await asyncio.sleep(_ERROR_PAUSE_S)
                continue
            end = now()
            self.in_flight -= 1
            self.completed += 1
            records = self.records
            records.send_ns += t1 - t0
            records.start_ns.append(t0)
            records.end_ns.append(end)
            records.first_ns.append(first or end)
            records.responses.append(count)
        if call is not None:
            await call.done_writing()

    # -- open loop (request rate) ----------------------------------------------------------------------------
    async def _open_loop(self, level: LevelPlan) -> None:
        plan = self.plan
        now = time.monotonic_ns
        # Live sequences: [id, length, stream, next step, busy]. A sequence has one request in flight at most, so
        # its requests reach the server in order over any connection; when every live sequence is busy, another
        # one starts, which keeps the rate.
        live: list[list[int]] = []
        if self.sequences is not None:
            live = [[*self.sequences.next_sequence(), 0, 0] for _ in range(plan.num_of_sequences)]
        send = self._open_sender()
        rr = 0
        for scheduled in send_times(level, now()):
            while self.running:
                wait = scheduled - now()
                if wait <= 0:
                    break
                # uvloop's timers have millisecond resolution and spin on shorter sleeps: sleep at least 1 ms and
                # send everything that fell due meanwhile.
                await asyncio.sleep(max(wait, _MIN_SLEEP_NS) / 1e9)
            if not self.running:
                return
            if now() - scheduled > 2_000_000:
                self.records.delayed += 1
            k = self.counter
            self.counter = k + 1
            request_id = f"{plan.index}.{k}"
            state = None
            if self.sequences is not None:
                for offset in range(len(live)):
                    candidate = live[(rr + offset) % len(live)]
                    if not candidate[4]:
                        state = candidate
                        rr += offset + 1
                        break
                if state is None:
                    state = [*self.sequences.next_sequence(), 0, 0]
                    live.append(state)
                sequence_id, length, stream, step, _ = state
                steps = plan.templates[stream]
                data = self._assemble(steps[step % len(steps)], request_id, sequence_parameters(sequence_id, step, length))
                state[3] = step + 1
                state[4] = 1
            elif self.prebuilt:
                data = self.prebuilt[k % len(self.prebuilt)]
            else:
                data = self._assemble(plan.templates[0][k % len(plan.templates[0])], request_id, None)
            task = self._watch(asyncio.ensure_future(send(data, request_id)))
            self.open_requests.add(task)
            task.add_done_callback(self.open_requests.discard)
            if state is not None:
                task.add_done_callback(functools.partial(self._sequence_step_done, state, live))

    def _sequence_step_done(self, state: list[int], live: list[list[int]], _task: object = None) -> None:
        state[4] = 0
        if state[3] >= state[1]:  # finished: the slot takes a new sequence, or retires if it was an extra one
            assert self.sequences is not None
            if len(live) > self.plan.num_of_sequences:
                live.remove(state)
            else:
                state[:] = [*self.sequences.next_sequence(), 0, 0]

    def _open_sender(self) -> Any:
        plan = self.plan
        now = time.monotonic_ns
        if plan.protocol == "http":
            from nereid.tools.perf.http_client import HttpConnectionPool

            assert plan.http is not None
            pool = HttpConnectionPool(plan.http.host, plan.http.port)
            self.http_connections = pool.all

            async def send_http(data: bytes, request_id: str) -> None:
                self.sent += 1
                self.in_flight += 1
                try:
                    conn = await pool.acquire()
                except OSError as exc:
                    self.in_flight -= 1
                    self._error(f"cannot connect to {pool.host}:{pool.port}: {exc.strerror or exc}")
                    return
                t0 = now()
                try:
                    status, body = await conn.request(data)
                except ConnectionError as exc:
                    self.in_flight -= 1
                    pool.release(conn)
                    self._error(str(exc))
                    return
                end = now()
                self.in_flight -= 1
                pool.release(conn)
                if status == 200:
                    self.completed += 1
                    self.records.start_ns.append(t0)
                    self.records.end_ns.append(end)
                else:
                    self._error(f"HTTP {status}: {_error_text(body)}")

            return send_http
        import grpc

        from nereid.tools.perf.grpc_client import unary_method

        if plan.streaming:
            return _StreamDispatcher(self).send
        calls = [unary_method(channel) for channel in self.channels]
        timeout = plan.request_timeout_s

        async def send_grpc(data: bytes, request_id: str) -> None:
            self.sent += 1
            self.in_flight += 1
            t0 = now()
            try:
                await calls[self.sent % len(calls)](data, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                self.in_flight -= 1
                self._error(f"gRPC {exc.code().name}: {exc.details()}")
                return
            end = now()
            self.in_flight -= 1
            self.completed += 1
            self.records.start_ns.append(t0)
            self.records.end_ns.append(end)

        return send_grpc


class _RequestFailed(Exception):
    pass


class _StreamDispatcher:
    """Open-loop streaming: a few long-lived streams; replies find their request by id."""

    def __init__(self, worker: _PerfWorker) -> None:
        from nereid.tools.perf.grpc_client import stream_method

        self.worker = worker
        self.streams: list[Any] = []
        self.queues: list[asyncio.Queue[bytes | None]] = []
        self.pending: dict[str, list[Any]] = {}  # id -> [start, first, count, future]
        self.k = 0
        for channel in worker.channels:
            call = stream_method(channel)()
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            self.streams.append(call)
            self.queues.append(queue)
            worker.open_requests.add(worker._watch(asyncio.ensure_future(self._writer(call, queue))))
            worker.open_requests.add(worker._watch(asyncio.ensure_future(self._reader(call))))
        worker.stop_hooks.append(self._close_queues)

    def _close_queues(self) -> None:
        for queue in self.queues:
            queue.put_nowait(None)

    async def _writer(self, call: Any, queue: asyncio.Queue[bytes | None]) -> None:
        while True:
            data = await queue.get()
            if data is None:  # the worker is stopping
                break
            await call.write(data)
        while self.pending and any(not state[3].done() for state in self.pending.values()):
            await asyncio.sleep(0.01)
        await call.done_writing()

    async def _reader(self, call: Any) -> None:
        import grpc

        from nereid.tools.perf.grpc_client import decode_stream_reply

        decoupled = self.worker.plan.decoupled
        now = time.monotonic_ns
        try:
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    break
                reply = decode_stream_reply(raw, decoupled)
                state = self.pending.get(reply.request_id)
                if state is None:
                    continue
                if reply.error:
                    del self.pending[reply.request_id]
                    state[3].set_exception(_RequestFailed(reply.error))
                    continue
                if reply.has_outputs:
                    state[2] += 1
                    if not state[1]:
                        state[1] = now()
                if reply.final:
                    del self.pending[reply.request_id]
                    state[3].set_result(now())
        except grpc.aio.AioRpcError as exc:
            for state in self.pending.values():
                if not state[3].done():
                    state[3].set_exception(ConnectionError(_grpc_error(exc)))
            self.pending.clear()

    async def send(self, data: bytes, request_id: str) -> None:
        worker = self.worker
        worker.sent += 1
        worker.in_flight += 1
        self.k += 1
        t0 = time.monotonic_ns()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        state = [t0, 0, 0, future]
        self.pending[request_id] = state
        self.queues[self.k % len(self.queues)].put_nowait(data)
        try:
            end = await future
        except (ConnectionError, _RequestFailed) as exc:
            worker.in_flight -= 1
            worker._error(f"stream: {exc}")
            return
        worker.in_flight -= 1
        worker.completed += 1
        records = worker.records
        records.start_ns.append(t0)
        records.end_ns.append(end)
        records.first_ns.append(state[1] or end)
        records.responses.append(state[2])


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        import orjson

        doc = orjson.loads(body)
        if isinstance(doc, dict) and "error" in doc:
            return str(doc["error"])
    except ValueError:
        pass
    return text[:300] or "(empty body)"


def _grpc_error(exc: BaseException) -> str:
    import grpc

    if isinstance(exc, grpc.aio.AioRpcError):
        return f"gRPC {exc.code().name}: {exc.details()}"
    return str(exc)


def worker_main(plan: WorkerPlan, conn: multiprocessing.connection.Connection) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass
    try:
        asyncio.run(_PerfWorker(plan, conn).run())
    except Exception as exc:  # report, never print a traceback into the user's terminal
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
    finally:
        conn.close()
