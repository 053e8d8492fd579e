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
from typing import Any

__all__ = [
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
    "ERROR_CODES",
    "RESERVED_PARAMETERS",
    "encode",
    "BlockingChannel",
    "CallError",
]

FRAME = struct.Struct("<I")

# -- server -> worker ------------------------------------------------------------------------------
# (INIT, args: dict[str, str], model_file: str, version_dir: str, decoupled: bool)
INIT = 1
# (EXECUTE, seq, in_arena_size, requests); a request is
# (id, correlation_id, flags, timeout_us, parameters: dict, requested: tuple[str, ...] | None, inputs) and an input
# (name, datatype, shape, offset, nbytes) inside the input arena.
EXECUTE = 2
# (SHUTDOWN,): call finalize(), answer DONE and exit.
SHUTDOWN = 3
# (REPLY, call_id, error: (code, message) | None, value): the answer to a worker's CALL.
REPLY = 4
# (IS_READY, call_id): ask the model's optional is_ready(); answered with READY_STATE.
IS_READY = 5
# (AUTO_COMPLETE, config_json, model_file, version_dir): run auto_complete_config; answered with READY.
AUTO_COMPLETE = 6

# -- worker -> server ------------------------------------------------------------------------------
# (READY, error: (code, message) | None, value): after INIT or AUTO_COMPLETE.
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

# CALL kinds. CALL_CANCELLED asks whether a request's client went away (payload: seq, request_index).
CALL_CANCELLED = "cancelled"
# CALL_BLS is the hook for business-logic scripting (a model calling the server); the server answers
# UNSUPPORTED until BLS lands. The plan: the payload names the model and carries the request's metadata and input
# tensors (written into the worker's arena like outputs); the server runs it through `ModelContext.server`, writes
# the response tensors into the input arena and answers REPLY with their metadata.
CALL_FAMILY = "family"
CALL_METRIC_VALUE = "metric_value"
CALL_BLS = "bls"

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

# Request parameters the protocol reserves; a model's request.parameters() never shows them.
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output", "binary_data_size"}
)


def encode(message: tuple[Any, ...]) -> bytes:
    data = marshal.dumps(message)
    return FRAME.pack(len(data)) + data


class BlockingChannel:
    """One end of the channel over a blocking socket, safe to use from several threads.

    `recv` returns the next message that is not a REPLY; `call` sends a CALL and waits for its REPLY. Whichever
    thread is reading dispatches what it reads, so a CALL made from a model's own thread while the main loop waits
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
        self._next_call = 0
        self._closed = False

    def send(self, message: tuple[Any, ...]) -> None:
        frame = encode(message)
        with self._send_lock:
            self._sock.sendall(frame)

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
                    message = self._read_frame()
                finally:
                    self._read_lock.release()
                if message is None:
                    with self._cond:
                        self._closed = True
                        self._cond.notify_all()
                    return None
                if message[0] == REPLY or message[0] == READY_STATE:
                    with self._cond:
                        self._replies[message[1]] = message
                        self._cond.notify_all()
                    continue
                return message

    def call(self, kind: str, payload: Any) -> Any:
        """Ask the server and wait for its answer; raises RuntimeError carrying the server's error."""
        with self._cond:
            self._next_call += 1
            call_id = self._next_call
        self.send((CALL, call_id, kind, payload))
        while True:
            with self._cond:
                reply = self._replies.pop(call_id, None)
                if reply is None and self._closed:
                    raise ConnectionError("the server closed the channel")
            if reply is not None:
                _, _, error, value = reply
                if error is not None:
                    raise CallError(error[0], error[1])
                return value
            if self._read_lock.acquire(blocking=False):
                try:
                    message = self._read_frame()
                finally:
                    self._read_lock.release()
                with self._cond:
                    if message is None:
                        self._closed = True
                    elif message[0] == REPLY or message[0] == READY_STATE:
                        self._replies[message[1]] = message
                    else:
                        self._inbox.append(message)
                    self._cond.notify_all()
            else:
                with self._cond:
                    if call_id not in self._replies and not self._closed:
                        self._cond.wait(0.05)

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
            chunk = self._sock.recv(1 << 16)
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
