"""Both ends of the channel between the server and a Python-backend worker, over a Unix socket pair.

`BlockingChannel` is the worker's end (and the auto-complete runner's): blocking reads, calls that wait for their
CallReply, safe to use from several threads. `WorkerLink` is the server's end: an asyncio protocol that cuts the bytes
into messages for the server's side of one worker. Only framing and routing here: what a message means is decided
by whoever receives it. The worker imports this module: keep it free of server imports.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from nereid.backends.python.protocol import (
    FRAME,
    BlsResponse,
    Call,
    CallReply,
    Execute,
    ExecuteGroup,
    IsReady,
    Message,
    ReadyState,
    encode,
    split_frames,
)

__all__ = ["BlockingChannel", "CallError", "MessageReceiver", "WorkerLink"]

log = logging.getLogger("nereid.python")

# Answers to something one side asked, routed by their call_id (field 0).
_ANSWERS = (CallReply, ReadyState, BlsResponse)
# What a worker waiting for a BLS reply on its main thread handles meanwhile (BlockingChannel.wait's `service`).
_SERVICEABLE = (Execute, ExecuteGroup, IsReady)
_HEADER = FRAME.size

Sink = Callable[[Any], None]


class BlockingChannel:
    """One end of the channel over a blocking socket, safe to use from several threads.

    `recv` returns the next message that is not an answer (CallReply, ReadyState, BlsResponse); `call` sends a Call and
    waits for its CallReply; `wait` blocks until a condition that answers make true holds. Whichever thread is reading
    dispatches what it reads: an answer goes to the sink registered for its call (`expect`) or is kept for `call`,
    anything else is kept for `recv` (or, once `forward_to` is set, handed to that function). So a call made from a
    model's own thread while the main loop waits for work still gets its answer, and the common path (one thread)
    costs no thread hand-off.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._frames: deque[Message] = deque()  # read from the socket, not yet dispatched
        self._inbox: deque[Message] = deque()
        self._replies: dict[int, CallReply] = {}
        self._sinks: dict[int, Sink] = {}
        self._forward: Callable[[Message | None], None] | None = None
        self._next_call = 0
        self._closed = False
        self._waiters = 0  # threads in `wait`: when a reading thread stops reading, one of them takes over
        self._poll_until = 0  # the next socket read polls until then (monotonic ns) before it blocks

    @property
    def closed(self) -> bool:
        return self._closed

    def poll_next(self, budget_ns: int) -> None:
        """Let the next read poll the socket for up to `budget_ns` before it blocks: a message due that soon is
        then read without this process going to sleep and being woken for it. Only on a blocking socket: one with a
        timeout waits in select() before any read."""
        if self._sock.gettimeout() is None:
            self._poll_until = time.monotonic_ns() + budget_ns

    def send(self, message: Message) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Send a message already framed (by one of protocol's frame builders)."""
        with self._send_lock:
            self._sock.sendall(frame)

    def next_call_id(self) -> int:
        with self._cond:
            self._next_call += 1
            return self._next_call

    def expect(self, call_id: int, sink: Sink) -> None:
        """Hand every answer to `call_id` to `sink`, in the reading thread (None: the channel closed)."""
        self._sinks[call_id] = sink

    def forget(self, call_id: int) -> None:
        self._sinks.pop(call_id, None)

    def notify(self) -> None:
        """Wake the threads in `wait` (a sink made their condition true)."""
        with self._cond:
            self._cond.notify_all()

    def forward_to(self, forward: Callable[[Message | None], None]) -> None:
        """From now on, messages that are not answers (and None at end of file) go to `forward`, not to `recv`."""
        with self._cond:
            self._forward = forward
            pending = list(self._inbox)
            self._inbox.clear()
        for message in pending:
            forward(message)

    def _dispatch(self, message: Message | None) -> Message | None:
        """Route what the reading thread read; returns a message that is for `recv`."""
        if message is None:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            sinks = list(self._sinks.values())
            self._sinks.clear()
            for closed_sink in sinks:
                closed_sink(None)
            if self._forward is not None:
                self._forward(None)
            return None
        if isinstance(message, _ANSWERS):
            call_id: int = message[0]
            sink = self._sinks.get(call_id)
            if sink is not None:
                sink(message)
                return None
            if isinstance(message, CallReply):  # for `call`, which waits for it
                with self._cond:
                    self._replies[call_id] = message
                    self._cond.notify_all()
            return None  # any other answer nobody expects any more is dropped
        forward = self._forward
        if forward is not None:
            forward(message)
            return None
        return message

    def recv(self) -> Message | None:
        """The next message that is not an answer, or None once the peer has closed the channel."""
        while True:
            with self._cond:
                if self._inbox:
                    return self._inbox.popleft()
                if self._closed:
                    return None
            if self._read_lock.acquire(timeout=0.05):
                try:
                    message = self._dispatch(self._read_message())
                finally:
                    self._read_lock.release()
                if message is not None:
                    if self._waiters:
                        self.notify()  # this thread stops reading: a waiting one must read its reply itself
                    return message

    def read_forever(self) -> None:
        """The reading loop of a dedicated reader thread (after `forward_to`); returns at end of file."""
        while not self._closed:
            with self._read_lock:
                if self._closed:
                    return
                message = self._dispatch(self._read_message())
            if message is not None:  # not forwarded: forward_to was not called
                with self._cond:
                    self._inbox.append(message)
                    self._cond.notify_all()

    def wait(self, done: Callable[[], bool], service: Callable[[Message], None] | None = None) -> None:
        """Block until `done()` (which answers make true), reading the channel meanwhile when no other thread is.

        With `service`, Execute, ExecuteGroup and IsReady messages that arrive meanwhile are handed to it at once (the worker's
        main thread, waiting for a BLS call, runs the next batch: that batch may be the very request it waits for).
        """
        if done():
            return
        with self._cond:
            self._waiters += 1
        try:
            while not done():
                if self._closed:
                    raise ConnectionError("the server closed the channel")
                if service is not None:
                    pending = self._take_serviceable()
                    if pending is not None:
                        service(pending)
                        continue
                if self._read_lock.acquire(blocking=False):
                    try:
                        if done():
                            return
                        message = self._dispatch(self._read_message())
                    finally:
                        self._read_lock.release()
                    if message is not None:
                        if service is not None and isinstance(message, _SERVICEABLE):
                            service(message)
                            continue
                        with self._cond:
                            self._inbox.append(message)
                            self._cond.notify_all()
                else:
                    with self._cond:
                        if not self._closed and not done():
                            self._cond.wait(0.05)
        finally:
            with self._cond:
                self._waiters -= 1
                if self._waiters:
                    self._cond.notify_all()  # this thread may have been the one reading

    def _take_serviceable(self) -> Message | None:
        with self._cond:
            for index, message in enumerate(self._inbox):
                if isinstance(message, _SERVICEABLE):
                    del self._inbox[index]
                    return message
        return None

    def call(self, kind: str, payload: Any) -> Any:
        """Ask the server and wait for its answer; raises CallError carrying the server's error."""
        call_id = self.next_call_id()
        self.send(Call(call_id, kind, payload))
        replies = self._replies
        self.wait(lambda: call_id in replies)
        with self._cond:
            reply = replies.pop(call_id)
        if reply.error is not None:
            raise CallError(reply.error[0], reply.error[1])
        return reply.value

    def _read_message(self) -> Message | None:
        """The next message off the socket (None at end of file); call with the read lock held."""
        frames = self._frames
        buf = self._buf
        while not frames:
            if len(buf) >= _HEADER:
                messages, used = split_frames(buf)
                if used:
                    del buf[:used]
                    frames.extend(messages)
                    break
            try:
                chunk = self._poll() if self._poll_until else self._sock.recv(1 << 16)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return None
            buf += chunk
        return frames.popleft()

    def _poll(self) -> bytes:
        """What the socket holds, read without blocking until the poll's deadline, then blocking."""
        deadline = self._poll_until
        self._poll_until = 0
        recv = self._sock.recv
        while True:
            try:
                return recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.monotonic_ns() > deadline:
                    return recv(1 << 16)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class CallError(RuntimeError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MessageReceiver(Protocol):
    """The server's side of one worker, as its WorkerLink sees it."""

    label: str

    def on_message(self, message: Message) -> None: ...

    def on_lost(self) -> None: ...


class WorkerLink(asyncio.Protocol):
    """The server's end: cuts the bytes from a worker's socket into messages for its receiver."""

    def __init__(self, receiver: MessageReceiver) -> None:
        self.receiver = receiver
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        if self.pending:
            data = self.pending + data
        messages, used = split_frames(data)
        on_message = self.receiver.on_message
        for message in messages:
            try:
                on_message(message)
            except Exception:
                log.exception("%s: failed to handle a message from its worker", self.receiver.label)
        self.pending = data[used:] if used < len(data) else b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.receiver.on_lost()
