"""What pb_utils talks to inside a worker: the channel to the server for logs, custom metrics, calls, response
senders and BLS (`pb_utils._bind` plugs it in once the worker has its channel).

Runs in the worker process: it must not import the server.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from nereid.backends.python import pb_utils
from nereid.backends.python.bls_client import exec_async, exec_blocking
from nereid.backends.python.channel import BlockingChannel, CallError
from nereid.backends.python.protocol import CALL_CANCELLED, Log, MetricOp, Metrics

if TYPE_CHECKING:
    from nereid.backends.python.model_worker import ModelWorker

__all__ = ["Runtime"]


class Runtime:
    """What pb_utils talks to: the channel to the server for logs, custom metrics and calls."""

    def __init__(self, channel: BlockingChannel, version_dir: str) -> None:
        self.channel = channel
        self.version_dir = version_dir
        self.in_execute = False
        self.ops: list[MetricOp] = []
        self.worker: ModelWorker | None = None
        self._main = threading.get_ident()

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
        if self.worker is None:
            raise pb_utils.TritonModelException(f"cannot {action} a model while auto_complete_config runs")
        try:
            return self.call(kind, payload)
        except CallError as exc:
            raise pb_utils.TritonModelException(
                f"Failed to {action} model: Failed to process the request for model '{self.worker.instance_name}', "
                f"message: {exc.message}"
            ) from None

    # -- BLS ----------------------------------------------------------------------------------------------
    def _bls_worker(self) -> ModelWorker:
        if self.worker is None:
            raise pb_utils.TritonModelException("BLS requests are not available while auto_complete_config runs")
        return self.worker

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        """InferenceRequest.exec: the response (an iterator over the responses when `decoupled`), blocking."""
        return exec_blocking(self._bls_worker(), request, decoupled)

    def bls_async(self, request: pb_utils.InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
        """InferenceRequest.async_exec: sends the request now; the future gives what exec() would have returned."""
        return exec_async(self._bls_worker(), request, decoupled)

    def send_response(self, request: pb_utils.InferenceRequest, response: Any, flags: int) -> None:
        if self.worker is None:
            raise pb_utils.TritonModelException("response senders work only for requests the model received")
        self.worker.send_response(request, response, flags)

    def is_cancelled(self, request: pb_utils.InferenceRequest) -> bool:
        if not request._seq:
            return False  # a request the model built itself (BLS)
        return bool(self.call(CALL_CANCELLED, (request._seq, request._index)))
