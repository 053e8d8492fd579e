"""The request and response types that travel between frontends, the server, schedulers and backends."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nereid.core.errors import NereidError

__all__ = ["InputTensor", "RequestedOutput", "InferenceRequest", "OutputTensor", "InferenceResponse"]


@dataclass(slots=True)
class InputTensor:
    """One input: BYTES data is an object array of bytes, everything else a typed numpy array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its wire options (binary_data, classification, shm…)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferenceRequest:
    model_name: str
    model_version: str
    inputs: list[InputTensor]
    id: str = ""
    # None means "every output of the model"; an empty list is never produced by frontends.
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    # Filled by the server after validation: the batch size (1 for non-batching models).
    batch_size: int = 1
    # Set when the client went away (HTTP disconnect, gRPC cancel); queued requests are then dropped.
    cancelled: bool = False
    # Queue-policy deadline (monotonic ns, 0 = none); set by the dynamic batcher's queue.
    deadline_ns: int = 0
    # Where the scheduler or backend delivers this request's responses; set by the server.
    respond: Callable[[InferenceResponse], None] = field(default=lambda response: None, repr=False)
    # An ensemble step's request: the scheduler also reports its execution's compute times (input, infer,
    # output ns) here, since an ensemble's statistics sum its steps'.
    report_compute: Callable[[int, int, int], None] | None = field(default=None, repr=False)
    # The request's trace when it is sampled (a RequestTrace): an ensemble traces its steps as its children.
    trace: Any = field(default=None, repr=False)
    # Set by a backend when the model released the request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: the
    # sequence batcher of an iterative_sequence model runs it again instead of answering it.
    rescheduled: bool = False
    # The client's W3C traceparent header, read by the frontends only in the opentelemetry trace mode.
    trace_context: str = ""

    def input(self, name: str) -> InputTensor | None:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        return None


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    # The labels of the model that produced it, passed on by an ensemble (Triton's label provider): classification
    # uses them when the answering model has no label file of its own for this output.
    labels: list[str] | None = None


@dataclass(slots=True)
class InferenceResponse:
    """One response of a request; ordinary models produce exactly one, with final=True."""

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[OutputTensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    error: NereidError | None = None
    final: bool = True
    # A decoupled model's bare "complete" flag (sender.send(flags=FINAL) with no response): it carries
    # nothing and reaches a gRPC stream only when the client enabled empty final responses.
    complete_only: bool = False
    # From a decoupled model's stream (Server.infer_stream sets it): a gRPC stream marks each such response with
    # `triton_final_response`, as Triton does.
    decoupled: bool = False
