"""Decoding a repeated request header once: clients send the same header (model, inputs' names, types and shapes,
requested outputs) with every request of one shape, and only the tensor bytes change. perf_analyzer and tritonclient
with binary data or raw contents do. A header that decoded cleanly is kept, by its bytes, with what it decoded to;
the next request with the same header bytes only turns its buffers into arrays. The HTTP and gRPC codecs each keep
a table of them, and decide which requests qualify (every input's data in a buffer of its own bytes).

A request id changes with every request where a client sets one (perf_analyzer's async mode, tritonclient's
request_id), so the codecs cut an id out of the header where they can find it cheaply, key the plan by the rest
(ID_CUT in front, so that such a key never equals a whole header) and hand the id to the plan with the buffers.

Bounded twice: headers up to PLAN_HEADER_BYTES, and a table is emptied when it holds PLAN_COUNT of them (a client
whose headers differ every time by more than an id never hits, and pays a dict insert per request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nereid.core.request_parameters import RESERVED_PARAMETERS
from nereid.core.types import InferenceRequest, InputTensor, RequestedOutput

__all__ = ["ID_CUT", "PLAN_HEADER_BYTES", "DecodePlan", "PlanTable"]

PLAN_HEADER_BYTES = 2048
PLAN_COUNT = 512
# The first byte of a key whose header had its request id cut out: neither a JSON nor a protobuf header starts so.
ID_CUT = b"\x00"
# The reserved request parameters that set the request's sequence, priority and timeout, which a plan does not
# carry. binary_data_output (tritonclient's HTTP default) is only checked, and stays among the parameters, as
# perf_analyzer's triton_enable_empty_final_response does: a plan copies those.
_SETTING_PARAMETERS = RESERVED_PARAMETERS - {"binary_data_output"}


class DecodePlan:
    """What one header decodes to: the request's id and parameters, per input (name, datatype, shape, parameters,
    dtype, bytes), and the requested outputs."""

    __slots__ = ("request_id", "parameters", "inputs", "outputs", "sizes", "offsets", "total")

    def __init__(self, request: InferenceRequest) -> None:
        self.request_id = request.id
        self.parameters = dict(request.parameters)
        self.inputs = [(t.name, t.datatype, t.shape, dict(t.parameters), t.data.dtype) for t in request.inputs]
        self.outputs = [(o.name, dict(o.parameters)) for o in request.outputs] if request.outputs is not None else None
        self.sizes = [t.data.nbytes for t in request.inputs]
        # Where each input's bytes start when they are laid end to end (the HTTP body's binary part).
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.total = sum(self.sizes)

    def request_in(
        self, body: bytes, start: int, model: str, version: str, request_id: str | None = None
    ) -> InferenceRequest | None:
        """The request of this header with its inputs' bytes laid end to end in `body` from `start` (each array a
        view of `body`, made in one call); None when that part of `body` is not their size. `request_id`: the id
        cut out of the header (see ID_CUT); None takes the planned one."""
        if len(body) - start != self.total:
            return None
        inputs = [
            InputTensor(name, datatype, shape, np.ndarray(shape, dtype, body, start + offset), dict(params))
            for (name, datatype, shape, params, dtype), offset in zip(self.inputs, self.offsets)
        ]
        return self._request(inputs, model, version, request_id)

    def request(
        self, buffers: Sequence[Any], model: str, version: str, request_id: str | None = None
    ) -> InferenceRequest:
        """The request of this header with these buffers (one per input, of the planned sizes: the caller checks)."""
        inputs = [
            InputTensor(name, datatype, shape, np.ndarray(shape, dtype, buffer), dict(params))
            for (name, datatype, shape, params, dtype), buffer in zip(self.inputs, buffers)
        ]
        return self._request(inputs, model, version, request_id)

    def _request(
        self, inputs: list[InputTensor], model: str, version: str, request_id: str | None
    ) -> InferenceRequest:
        request_id = self.request_id if request_id is None else request_id
        request = InferenceRequest(model, version, inputs, id=request_id, parameters=dict(self.parameters))
        if self.outputs is not None:
            request.outputs = [RequestedOutput(name, dict(params)) for name, params in self.outputs]
        return request


class PlanTable:
    __slots__ = ("_plans",)

    def __init__(self) -> None:
        self._plans: dict[bytes, DecodePlan] = {}

    def get(self, header: bytes) -> DecodePlan | None:
        return self._plans.get(header)

    def keep(self, header: bytes, request: InferenceRequest) -> None:
        """Keep `request`'s decoding under its header when nothing else in the request could decode differently
        next time: no parameter that sets the request's sequence, priority or timeout (_SETTING_PARAMETERS), and no
        BYTES input (its elements are read from the data). The caller has checked that every input came from a
        buffer."""
        if request.parameters.keys() & _SETTING_PARAMETERS or len(header) > PLAN_HEADER_BYTES:
            return
        if any(t.datatype == "BYTES" for t in request.inputs):
            return
        if len(self._plans) >= PLAN_COUNT:
            self._plans.clear()
        self._plans[header] = DecodePlan(request)

    def __contains__(self, header: bytes) -> bool:
        return header in self._plans
