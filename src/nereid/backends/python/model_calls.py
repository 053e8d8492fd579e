"""The server's answers to a worker's Call messages: custom metric families and values, whether a request was
cancelled, a request's trace context, and pb_utils' model-repository API (load_model, unload_model, is_model_ready).

Every call gets exactly one CallReply, an error included. BLS requests are not calls (see `bls_bridge`).
"""

from __future__ import annotations

import logging
from typing import Any

from nereid.backends.python.custom_metrics import CustomMetrics
from nereid.backends.python.error_codes import error_to_wire
from nereid.backends.python.protocol import (
    CALL_CANCEL_BLS,
    CALL_CANCELLED,
    CALL_FAMILY,
    CALL_LOAD,
    CALL_METRIC_VALUE,
    CALL_MODEL_READY,
    CALL_TRACE_CONTEXT,
    CALL_UNLOAD,
    INTERNAL_CODE,
    Call,
    CallReply,
)
from nereid.backends.python.worker_process import PythonWorkerProcess
from nereid.core.errors import NereidError
from nereid.core.server_handle import ServerHandle

__all__ = ["ModelCalls"]

log = logging.getLogger("nereid.python")

_REPOSITORY_CALLS = (CALL_LOAD, CALL_UNLOAD, CALL_MODEL_READY)


class ModelCalls:
    """Answers the calls of an instance's workers (the server, the metrics owner and the label are the instance's; the
    custom-metric registry is its Server's)."""

    __slots__ = ("server", "metrics", "metrics_owner", "label")

    def __init__(self, server: ServerHandle | None, metrics: CustomMetrics, metrics_owner: str, label: str) -> None:
        self.server = server
        self.metrics = metrics
        self.metrics_owner = metrics_owner  # custom metric families live while their owner is loaded
        self.label = label

    def on_call(self, worker: PythonWorkerProcess, message: Call) -> None:
        call_id, kind, payload = message
        value: Any = None
        reply: CallReply
        try:
            if kind == CALL_FAMILY:
                name, description, metric_kind = payload
                self.metrics.create_family(self.metrics_owner, name, description, metric_kind)
            elif kind == CALL_METRIC_VALUE:
                value = self.metrics.value(*payload)
            elif kind == CALL_CANCELLED:
                request = worker.request_of(*payload)
                value = bool(request is not None and request.cancelled)
            elif kind == CALL_CANCEL_BLS:
                request = worker.bls_calls.get(payload[0])
                if request is not None:  # else it has ended already: nothing to cancel, as Triton
                    request.cancelled = True
            elif kind == CALL_TRACE_CONTEXT:
                request = worker.request_of(*payload)
                server = self.server
                value = server.tracer.context(request.trace) if request is not None and server is not None else None
            elif kind in _REPOSITORY_CALLS:
                worker.start_task(self._repository_call(worker, call_id, kind, payload))
                return
            else:
                raise NereidError.unsupported(f"unknown call '{kind}'")
            reply = CallReply(call_id, None, value)
        except NereidError as exc:
            reply = CallReply(call_id, error_to_wire(exc), None)
        worker.send(reply)

    async def _repository_call(
        self, worker: PythonWorkerProcess, call_id: int, kind: str, payload: tuple[Any, ...]
    ) -> None:
        """pb_utils.load_model, unload_model and is_model_ready, through the server's repository API."""
        server = self.server
        value: Any = None
        reply: CallReply
        try:
            if server is None:
                raise NereidError.unavailable("the model-repository API needs the in-process server")
            if kind == CALL_LOAD:
                name, config, files = payload
                parameters: dict[str, Any] = dict(files)
                if config:
                    parameters["config"] = config
                await server.load_model(name, parameters)
            elif kind == CALL_UNLOAD:
                name, unload_dependents = payload
                await server.unload_model(name, {"unload_dependents": unload_dependents})
            else:
                name, version = payload
                try:
                    value = bool(server.model_ready(name, version))
                except NereidError:
                    value = False
            reply = CallReply(call_id, None, value)
        except NereidError as exc:
            reply = CallReply(call_id, error_to_wire(exc), None)
        except Exception as exc:
            log.exception("%s: a model-repository call failed", self.label)
            reply = CallReply(call_id, (INTERNAL_CODE, f"{type(exc).__name__}: {exc}"), None)
        worker.send(reply)
