"""The channel between the server and a Python-backend worker: message kinds, framing and a blocking endpoint.

A message is a marshal-encoded tuple of metadata behind a 4-byte little-endian length; its first item is the
kind. Tensor bytes never travel here (they live in the shared-memory arenas of `arena`). The worker imports this
module, so it must not import the server, protobuf or anything heavy.
"""

from __future__ import annotations

import marshal
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = [
    "RESCHEDULED_CODE",
    "FRAME",
    "INIT",
    "EXECUTE",
    "SHUTDOWN",
    "REPLY",
    "IS_READY",
    "AUTO_COMPLETE",
    "READY",
    "RESULT",
    "LOG",
    "CALL",
    "METRICS",
    "DONE",
    "READY_STATE",
    "RESPONSE",
    "CONSUMED",
    "CONTROL_BYTES",
    "CALL_CANCELLED",
    "CALL_FAMILY",
    "CALL_METRIC_VALUE",
    "CALL_BLS",
    "CALL_LOAD",
    "CALL_UNLOAD",
    "CALL_MODEL_READY",
    "REPLIES_TAKEN",
    "ERROR_CODES",
    "RESERVED_PARAMETERS",
    "encode",
    "BlockingChannel",
    "CallError",
]

FRAME = struct.Struct("<I")

# -- server -> worker ------------------------------------------------------------------------------
# (INIT, args: dict[str, str], model_file: str, version_dir: str): load the model and call initialize(args);
# answered with READY. (Whether the model is decoupled travels in args["model_config"], as in Triton.)
INIT = 1
# (EXECUTE, seq, in_arena_size, requests); a request is
# (id, correlation_id, flags, timeout_us, parameters: dict, requested: tuple[str, ...] | None, inputs) and an input
# (name, datatype, shape, offset, nbytes) inside the input arena.
EXECUTE = 2
# (SHUTDOWN,): call finalize(), answer DONE and exit.
SHUTDOWN = 3
# (REPLY, call_id, error: (code, message) | None, value): the answer to a worker's CALL. A BLS call gets one REPLY
# per response of the model it called (many for a decoupled model), each with value
# (in_arena_size, error | None, parameters | None, outputs, final: bool, reply_no); an output is
# (name, datatype, shape, offset, nbytes) inside the input arena, where the server wrote it after everything else.
REPLY = 4
# (IS_READY, call_id): ask the model's optional is_ready(); answered with READY_STATE.
IS_READY = 5
# (AUTO_COMPLETE, config_json, model_file, version_dir): run auto_complete_config; answered with READY.
AUTO_COMPLETE = 6

# -- worker -> server ------------------------------------------------------------------------------
# (READY, error: (code, message) | None, value): after INIT (value: (pid, the model has is_ready())) or AUTO_COMPLETE
# (value: the completed config as JSON).
READY = 20
# (RESULT, seq, oseq, out_arena_size, batch_error | None, responses | None, (input_ns, infer_ns, output_ns), ops)
# A response is (error | None, parameters | None, outputs); an output is (name, datatype, shape, offset, nbytes).
# `oseq` numbers every message whose tensors are in the output arena (RESULT and RESPONSE); the server writes the
# last one it has consumed into the input arena's control word (CONSUMED), and the worker reuses space up to it.
RESULT = 21
# (LOG, level, message, filename, lineno); level 0 info, 1 warning, 2 error, 3 verbose.
LOG = 22
# (CALL, call_id, kind, payload): the worker asks the server something and blocks until the REPLY.
CALL = 23
# (METRICS, ops): custom-metric operations made outside execute (initialize, finalize, other threads).
METRICS = 24
# (DONE, error | None): finalize() has run; the worker exits next.
DONE = 25
# (READY_STATE, call_id, ready: bool)
READY_STATE = 26

# (RESPONSE, seq, request_index, oseq, out_arena_size, error | None, parameters | None, outputs | None, flags):
# one response of a decoupled model, sent by InferenceResponseSender.send at any time and from any thread; the
# server hands it to that request's `respond` (final when flags has TRITONSERVER_RESPONSE_COMPLETE_FINAL; outputs
# None is a bare final flag).
RESPONSE = 27
# The input arena's first bytes are a control block: at CONSUMED the server keeps (u64) the last `oseq` it has
# consumed. The server's input tensors start at CONTROL_BYTES.
CONSUMED = struct.Struct("<Q")
CONTROL_BYTES = 64
# The output arena's first CONTROL_BYTES are a control block too: at REPLIES_TAKEN the worker keeps (u64) the last
# BLS `reply_no` whose tensors it has copied out of the input arena; the server rewinds its input arena only when
# no batch is in flight and every reply has been taken. The worker's outputs start at CONTROL_BYTES.
REPLIES_TAKEN = struct.Struct("<Q")

# CALL kinds. CALL_CANCELLED asks whether a request's client went away (payload: seq, request_index).
CALL_CANCELLED = "cancelled"
CALL_FAMILY = "family"
CALL_METRIC_VALUE = "metric_value"
# Business-logic scripting: a model's InferenceRequest(...).exec(). The payload is
# (oseq, out_arena_size, model_name, model_version, request_id, correlation_id, flags, timeout_us, parameters,
#  requested_outputs, inputs, decoupled) and an input is (name, datatype, shape, offset, nbytes) inside the output
# arena, written there like a response's outputs (so the CALL takes an `oseq`; the server copies the inputs out
# before it marks that oseq consumed). The server runs the request through `ModelContext.server` and answers with
# one REPLY per response (see REPLY). Errors of the request come back inside a response, as Triton's BLS does.
CALL_BLS = "bls"
# pb_utils.load_model (payload: name, config_json, files: dict[str, bytes]), unload_model (name, unload_dependents)
# and is_model_ready (name, version): the server's model-repository API; REPLY value None, None and a bool.
CALL_LOAD = "load"
CALL_UNLOAD = "unload"
CALL_MODEL_READY = "model_ready"

# TritonError codes (pb_utils.TritonError.<NAME>) in the order of their integer values.
ERROR_CODES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)
# In a RESULT, the error of a request the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (an
# iterative_sequence model runs it again): a code no TritonError has.
RESCHEDULED_CODE = -1

# Request parameters the protocol reserves; a model's request.parameters() never shows them.
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "binary_data_size"}
)


# What a worker waiting for a BLS reply on its main thread handles meanwhile (BlockingChannel.wait's `service`).
_SERVICEABLE = (EXECUTE, IS_READY)


def encode(message: tuple[Any, ...]) -> bytes:
    data = marshal.dumps(message)
    return FRAME.pack(len(data)) + data


class BlockingChannel:
    """One end of the channel over a blocking socket, safe to use from several threads.

    `recv` returns the next message that is not a REPLY; `call` sends a CALL and waits for its REPLY; `wait` blocks
    until a condition that replies make true holds. Whichever thread is reading dispatches what it reads: a REPLY goes
    to the sink registered for its call (`expect`) or is kept for `call`, anything else is kept for `recv` (or, once
    `forward_to` is set, handed to that function). So a call made from a model's own thread while the main loop waits
    for work still gets its answer, and the common path (one thread) costs no thread hand-off.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._replies: dict[int, tuple[Any, ...]] = {}
        self._sinks: dict[int, Callable[[tuple[Any, ...] | None], None]] = {}
        self._forward: Callable[[tuple[Any, ...] | None], None] | None = None
        self._next_call = 0
        self._closed = False
        self._waiters = 0  # threads in `wait`: when a reading thread stops reading, one of them takes over

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, message: tuple[Any, ...]) -> None:
        frame = encode(message)
        with self._send_lock:
            self._sock.sendall(frame)

    def next_call_id(self) -> int:
        with self._cond:
            self._next_call += 1
            return self._next_call

    def expect(self, call_id: int, sink: Callable[[tuple[Any, ...] | None], None]) -> None:
        """Hand every REPLY to `call_id` to `sink`, in the reading thread (None: the channel closed)."""
        self._sinks[call_id] = sink

    def forget(self, call_id: int) -> None:
        self._sinks.pop(call_id, None)

    def notify(self) -> None:
        """Wake the threads in `wait` (a sink made their condition true)."""
        with self._cond:
            self._cond.notify_all()

    def forward_to(self, forward: Callable[[tuple[Any, ...] | None], None]) -> None:
        """From now on, messages that are not replies (and None at end of file) go to `forward`, not to `recv`."""
        with self._cond:
            self._forward = forward
            pending = list(self._inbox)
            self._inbox.clear()
        for message in pending:
            forward(message)

    def _dispatch(self, message: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
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
        kind = message[0]
        if kind == REPLY or kind == READY_STATE:
            sink = self._sinks.get(message[1])
            if sink is not None:
                sink(message)
                return None
            with self._cond:
                self._replies[message[1]] = message
                self._cond.notify_all()
            return None
        forward = self._forward
        if forward is not None:
            forward(message)
            return None
        return message

    def recv(self) -> tuple[Any, ...] | None:
        """The next non-REPLY message, or None once the peer has closed the channel."""
        while True:
            with self._cond:
                if self._inbox:
                    return self._inbox.popleft()
                if self._closed:
                    return None
            if self._read_lock.acquire(timeout=0.05):
                try:
                    message = self._dispatch(self._read_frame())
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
                message = self._dispatch(self._read_frame())
            if message is not None:  # not forwarded: forward_to was not called
                with self._cond:
                    self._inbox.append(message)
                    self._cond.notify_all()

    def wait(self, done: Callable[[], bool], service: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        """Block until `done()` (which replies make true), reading the channel meanwhile when no other thread is.

        With `service`, EXECUTE and IS_READY messages that arrive meanwhile are handed to it at once (the worker's
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
                        message = self._dispatch(self._read_frame())
                    finally:
                        self._read_lock.release()
                    if message is not None:
                        if service is not None and message[0] in _SERVICEABLE:
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

    def _take_serviceable(self) -> tuple[Any, ...] | None:
        with self._cond:
            for index, message in enumerate(self._inbox):
                if message[0] in _SERVICEABLE:
                    del self._inbox[index]
                    return message
        return None

    def call(self, kind: str, payload: Any) -> Any:
        """Ask the server and wait for its answer; raises CallError carrying the server's error."""
        call_id = self.next_call_id()
        self.send((CALL, call_id, kind, payload))
        replies = self._replies
        self.wait(lambda: call_id in replies)
        with self._cond:
            _, _, error, value = replies.pop(call_id)
        if error is not None:
            raise CallError(error[0], error[1])
        return value

    def _read_frame(self) -> tuple[Any, ...] | None:
        buf = self._buf
        while True:
            if len(buf) >= 4:
                (size,) = FRAME.unpack_from(buf, 0)
                end = 4 + size
                if len(buf) >= end:
                    message: tuple[Any, ...] = marshal.loads(buf[4:end])
                    del buf[:end]
                    return message
            try:
                chunk = self._sock.recv(1 << 16)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return None
            buf += chunk

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
