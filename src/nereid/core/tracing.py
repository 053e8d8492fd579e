"""Request tracing in Triton's `triton` trace mode: sampled requests' timestamps written to a JSON trace file.

Which requests: the trace settings in effect for the model (level TIMESTAMPS or TENSORS, one request in every
`trace_rate`, at most `trace_count` traces, -1 for no limit); an ensemble's steps, and BLS calls made with
`trace=request.trace()`, as children of their caller's trace (`parent_id`), other BLS calls never. What:
Triton's records, one JSON array per file, `{"id", "model_name", "model_version", "request_id"}` then `{"id",
"timestamps": [{"name", "ns"}]}` per stamp, on the monotonic clock as Triton's steady clock; the TENSORS level adds
`{"id", "activity": "TENSOR_QUEUE_INPUT" or "TENSOR_BACKEND_OUTPUT", "tensor": {"name", "data", "shape", "dtype"}}`
per input and output. Frontends add their own stamps (HTTP_RECV_*, HTTP_SEND_*, GRPC_WAITREAD_*, GRPC_SEND_*)
through a FrontendTrace, and a trace they hold is written once they release it. Where: `trace_file` at shutdown,
or with `log_frequency` N, `trace_file.0`, `trace_file.1`, ... every N traces. A server with tracing off pays one
attribute check per request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from nereid.core.otel_tracing import OtelConfig, OtelTracer, TraceIds
from nereid.core.trace_settings import TraceSettings

__all__ = ["RequestTrace", "Tracer", "FrontendTrace", "TraceParent", "NOT_TRACED", "tensor_record_data"]

log = logging.getLogger("nereid.trace")


def tensor_record_data(datatype: str, array: np.ndarray) -> str:
    """A tensor's elements as Triton's trace writes them: comma-separated, floats as C++ streams print them
    (six significant digits: 0.1, 1e-07, 1.23457e+08, nan, -inf), BOOL as 1/0, BYTES each in double quotes,
    FP16 and BF16 left empty as Triton leaves them. Integers are written as numbers, including INT8/UINT8
    (Triton streams those as raw characters, which makes its file invalid UTF-8)."""
    if datatype in ("FP16", "BF16"):
        return ""
    values = array.reshape(-1).tolist()
    if datatype in ("FP32", "FP64"):
        return ",".join([format(v, "g") for v in values])
    if datatype == "BOOL":
        return ",".join(["1" if v else "0" for v in values])
    if datatype == "BYTES":
        return ",".join(
            ['"' + (v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)) + '"' for v in values]
        )
    return ",".join([str(v) for v in values])


class FrontendTrace:
    """A frontend's part of one request's trace: the stamps it took before the server knew the model (they join
    the trace if the request is sampled), then `trace`, set by the server when it is. The frontend adds its send
    stamps to that trace and releases it to the Tracer."""

    __slots__ = ("stamps", "trace")

    def __init__(self, stamps: Iterable[tuple[str, int]] = ()) -> None:
        self.stamps = list(stamps)
        self.trace: RequestTrace | None = None


class TraceParent:
    """What a BLS request's `trace` starts as: the trace of the request that made it, to trace it under (None: it is
    not traced). A BLS request is traced only as a child of its caller, never sampled on its own, as in Triton."""

    __slots__ = ("parent",)

    def __init__(self, parent: RequestTrace | None) -> None:
        self.parent = parent


NOT_TRACED = TraceParent(None)


class RequestTrace:
    __slots__ = (
        "id", "model", "request_id", "parent_id", "stamps", "computed", "on_computed", "timestamps", "tensors",
        "tensor_records", "waiting", "version", "otel",
    )  # fmt: skip

    def __init__(
        self, trace_id: int, model: str, request_id: str, parent_id: int = 0, levels: Iterable[str] = ("TIMESTAMPS",)
    ) -> None:
        self.id = trace_id
        self.model = model
        self.request_id = request_id
        self.parent_id = parent_id  # an ensemble step's or a BLS request's trace names its caller's
        self.stamps: list[tuple[str, int]] = []
        self.computed = False
        # A decoupled model's last response may come before its execution ends: the trace then ends with it.
        self.on_computed: Callable[[], None] | None = None
        self.timestamps = "TIMESTAMPS" in levels
        self.tensors = "TENSORS" in levels
        self.tensor_records: list[dict[str, Any]] = []
        # Who still has to let go before the trace is written: the server, and a frontend that holds it.
        self.waiting = 1
        self.version = ""
        self.otel: TraceIds | None = None  # its span ids, in the opentelemetry trace mode

    def tensor(self, activity: str, name: str, datatype: str, shape: tuple[int, ...], data: np.ndarray) -> None:
        """A TENSORS-level record; Triton writes none for a tensor without elements."""
        if data.size == 0:
            return
        self.tensor_records.append(
            {
                "id": self.id,
                "activity": activity,
                "tensor": {
                    "name": name,
                    "data": tensor_record_data(datatype, data),
                    "shape": ",".join(str(d) for d in shape),
                    "dtype": datatype,
                },
            }
        )

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def report_compute(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """The scheduler's report right after an execution: its three phases, ending now."""
        end = time.monotonic_ns()
        start = end - input_ns - infer_ns - output_ns
        self.stamps += [
            ("COMPUTE_START", start),
            ("COMPUTE_INPUT_END", start + input_ns),
            ("COMPUTE_OUTPUT_START", start + input_ns + infer_ns),
            ("COMPUTE_END", end),
        ]
        self.computed = True
        if self.on_computed is not None:
            on_computed, self.on_computed = self.on_computed, None
            on_computed()

    def records(self, version: int) -> list[dict[str, Any]]:
        """Triton's records of this trace; with the TENSORS level alone Triton writes only the tensor records."""
        if not self.timestamps:
            return self.tensor_records
        head: dict[str, Any] = {"id": self.id, "model_name": self.model, "model_version": version}
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        stamps = [{"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self.stamps]
        return [head, *stamps, *self.tensor_records]


class Tracer:
    def __init__(self, settings: TraceSettings) -> None:
        self.settings = settings
        self.enabled = False
        self._seen: dict[str, int] = {}  # requests of each model since its last sampled one
        self._traced: dict[str, int] = {}  # traces taken under the model's current trace_count
        self._next_id = 1
        self._pending: list[dict[str, Any]] = []
        self._pending_traces = 0
        self._file_index = 0
        # The opentelemetry trace mode exports spans instead of writing the trace file.
        self.otel: OtelTracer | None = None
        if settings.get()["trace_mode"] == "opentelemetry":
            self.otel = OtelTracer(OtelConfig.from_items(settings.opentelemetry))
        settings.on_change = self._refresh
        self._refresh()

    def _refresh(self) -> None:
        """Settings changed: recompute whether any model can be traced, and restart rate and count."""
        self.enabled = self.settings.any_tracing()
        self._seen.clear()
        self._traced.clear()

    def start(self, model: str, request_id: str, context: str = "") -> RequestTrace | None:
        """A trace for this request, when the model's settings sample it. In the opentelemetry mode a request
        with a client's trace `context` (its traceparent header) is traced whatever the rate and count."""
        settings = self.settings.get(model)
        if settings["trace_level"] == ["OFF"] or not (settings["trace_file"] or self.otel is not None):
            return None
        if context and self.otel is not None:
            return self._opened(RequestTrace(self._take_id(), model, request_id, levels=settings["trace_level"]), context)
        count = int(settings["trace_count"])
        if count >= 0 and self._traced.get(model, 0) >= count:
            return None
        seen = self._seen.get(model, 0) + 1
        rate = int(settings["trace_rate"])
        if rate == 0 or seen < rate:
            self._seen[model] = seen
            return None
        self._seen[model] = 0
        self._traced[model] = self._traced.get(model, 0) + 1
        return self._opened(RequestTrace(self._take_id(), model, request_id, levels=settings["trace_level"]), context)

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _opened(self, trace: RequestTrace, context: str) -> RequestTrace:
        if self.otel is not None:
            trace.otel = self.otel.begin(context)
        return trace

    def start_child(self, parent: RequestTrace, model: str, request_id: str | None = None) -> RequestTrace:
        """The trace of an ensemble step (with its ensemble's request id) or of a BLS request (with its own): taken
        whenever its caller's request is traced, at the caller's level, as Triton does."""
        trace = RequestTrace(self._take_id(), model, parent.request_id if request_id is None else request_id, parent.id)
        trace.timestamps, trace.tensors = parent.timestamps, parent.tensors
        if self.otel is not None:
            trace.otel = self.otel.begin_child(parent.otel)
        return trace

    def context(self, trace: Any) -> str | None:
        """A request's trace context as Triton hands it to a Python model: in the opentelemetry mode a JSON object
        with the traceparent of its model span; None in the triton mode and for a request not traced."""
        if self.otel is None or type(trace) is not RequestTrace or trace.otel is None:
            return None
        return self.otel.context(trace.otel)

    def finish(self, trace: RequestTrace, version: str) -> None:
        """The server is done with the trace; it is written now, or when the frontend holding it releases it."""
        trace.stamp("REQUEST_END")
        trace.version = version
        self.release(trace)

    def release(self, trace: RequestTrace) -> None:
        trace.waiting -= 1
        if trace.waiting > 0:
            return
        version = trace.version
        if self.otel is not None:
            self.otel.finish(trace, version)
            return
        self._pending += trace.records(int(version) if version.isdigit() else -1)
        self._pending_traces += 1
        frequency = int(self.settings.get(trace.model)["log_frequency"])
        if frequency and self._pending_traces >= frequency:
            self._write(f"{self.settings.get()['trace_file']}.{self._file_index}")
            self._file_index += 1

    def close(self) -> None:
        """Write what is left: to the trace file itself, or to the next numbered file with a log frequency
        (in the opentelemetry mode: export the spans still queued)."""
        if self.otel is not None:
            self.otel.close()
        if not self._pending:
            return
        path = self.settings.get()["trace_file"]
        if int(self.settings.get()["log_frequency"]):
            path = f"{path}.{self._file_index}"
            self._file_index += 1
        self._write(path)

    def _write(self, path: str) -> None:
        records, self._pending, self._pending_traces = self._pending, [], 0
        try:
            with open(path, "w") as handle:
                json.dump(records, handle, separators=(",", ":"))
        except OSError as exc:
            log.error("failed to write trace file '%s': %s", path, exc)
