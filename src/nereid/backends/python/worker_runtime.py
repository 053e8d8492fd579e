"""What pb_utils talks to inside a worker: the channel to the server for logs, custom metrics and calls, and the
loaded model's worker for response senders and BLS (`pb_utils._bind` plugs it in once the worker has its channel).

Runs in the worker process: it must not import the server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nereid.backends.python import pb_utils
from nereid.backends.python.channel import BlockingChannel, CallError
from nereid.backends.python.protocol import CALL_CANCELLED, Log, MetricOp, Metrics

__all__ = ["ModelWorkerHooks", "Runtime"]


@dataclass(frozen=True, slots=True)
class ModelWorkerHooks:
    """What pb_utils reaches of the worker that serves a loaded model (handed down by the worker's entry point; none
    while auto_complete_config runs)."""

    instance_name: str
    # InferenceRequest.exec: the response (an iterator over the responses when decoupled), blocking.
    bls: Callable[[pb_utils.InferenceRequest, bool], Any]
    # InferenceRequest.async_exec: sends the request now; the future gives what exec() would have returned.
    bls_async: Callable[[pb_utils.InferenceRequest, bool], asyncio.Future[Any]]
    # InferenceResponseSender.send(response, flags).
    send_response: Callable[[pb_utils.InferenceRequest, Any, int], None]


class Runtime:
    """What pb_utils talks to: the channel to the server for logs, custom metrics and calls."""

    def __init__(self, channel: BlockingChannel, version_dir: str) -> None:
        self.channel = channel
        self.version_dir = version_dir
        self.in_execute = False
        self.ops: list[MetricOp] = []
        self.model: ModelWorkerHooks | None = None
        self._main = threading.get_ident()

    def attach(self, model: ModelWorkerHooks) -> None:
        """The model's worker exists: response senders, BLS and the repository API work from now on."""
        self.model = model

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        self.channel.send(Log(level, message, filename, lineno))

    def metric_op(self, op: MetricOp) -> None:
        self.ops.append(op)
        # Inside execute the operations ride on the batch's RESULT; anywhere else they go at once.
        if not self.in_execute or threading.get_ident() != self._main:
            self.flush_ops()

    def take_ops(self) -> tuple[MetricOp, ...]:
        ops = self.ops
        if not ops:
            return ()
        self.ops = []
        return tuple(ops)

    def flush_ops(self) -> None:
        ops = self.take_ops()
        if ops:
            self.channel.send(Metrics(ops))

    def call(self, kind: str, payload: Any) -> Any:
        self.flush_ops()
        return self.channel.call(kind, payload)

    def repository_call(self, kind: str, payload: Any, action: str) -> Any:
        """load_model, unload_model and is_model_ready: errors raise as Triton's stub words them."""
        if self.model is None:
            raise pb_utils.TritonModelException(f"cannot {action} a model while auto_complete_config runs")
        try:
            return self.call(kind, payload)
        except CallError as exc:
            raise pb_utils.TritonModelException(
                f"Failed to {action} model: Failed to process the request for model '{self.model.instance_name}', "
                f"message: {exc.message}"
            ) from None

    # -- BLS ----------------------------------------------------------------------------------------------
    def _loaded(self) -> ModelWorkerHooks:
        if self.model is None:
            raise pb_utils.TritonModelException("BLS requests are not available while auto_complete_config runs")
        return self.model

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        """InferenceRequest.exec: the response (an iterator over the responses when `decoupled`), blocking."""
        return self._loaded().bls(request, decoupled)

    def bls_async(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
        """InferenceRequest.async_exec: sends the request now; the future gives what exec() would have returned."""
        return self._loaded().bls_async(request, decoupled)

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        if self.model is None:
            raise pb_utils.TritonModelException("response senders work only for requests the model received")
        self.model.send_response(request, response, flags)

    def is_cancelled(self, request: pb_utils.InferenceRequest) -> bool:
        if not request._seq:
            return False  # a request the model built itself (BLS)
        return bool(self.call(CALL_CANCELLED, (request._seq, request._index)))
