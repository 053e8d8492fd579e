"""Triton's `opentelemetry` trace mode: sampled requests' traces as OpenTelemetry spans, exported over OTLP/HTTP.

Spans have Triton's shape: a root span `InferRequest` (the frontend's events and INFER_RESPONSE_COMPLETE), under
it one span named after the model (REQUEST_START, QUEUE_START, REQUEST_END; the triton.* attributes) with a
`compute` child (the four COMPUTE_* events); the model span of an ensemble step, or of a BLS request made with
`trace=request.trace()`, is a child of its caller's model span. A client's W3C `traceparent` header makes the root
span its child. Spans are batched as OpenTelemetry's batch span processor does
(`bsp_max_queue_size`, `bsp_schedule_delay`, `bsp_max_export_batch_size`) and sent from a thread of their own as
OTLP/HTTP with JSON encoding (what Triton 2.51 sends), so exporting never blocks a request and this module needs
nothing but the standard library. With the mode off, nothing here runs: no thread, no per-request work.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OtelConfig", "OtelTracer", "SpanExporter", "TraceIds", "parse_traceparent"]

log = logging.getLogger("nereid.trace")

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ROOT_EVENTS = ("INFER_RESPONSE_COMPLETE",)
_MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
_SPAN_KIND_SERVER = 2  # Triton marks every span of a trace as a server span


def parse_traceparent(header: str) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid W3C traceparent header, else None (an invalid one is ignored)."""
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id = match.group(1), match.group(2), match.group(3)
    if version == "ff" or (version == "00" and match.group(5)) or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


@dataclass(slots=True)
class OtelConfig:
    """`--trace-config opentelemetry,KEY=VALUE` settings, with Triton's defaults."""

    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "triton-inference-server"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512

    @classmethod
    def from_items(cls, items: list[tuple[str, str]], environ: dict[str, str] | None = None) -> OtelConfig:
        """The config of `(key, value)` items; OTEL_BSP_* and OTEL_RESOURCE_ATTRIBUTES apply where no flag does.
        Raises ValueError naming the bad setting."""
        env = os.environ if environ is None else environ
        config = cls()
        for pair in filter(None, env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")):
            key, _, value = pair.partition("=")
            config.resource[key.strip()] = value.strip()
        numbers = {"bsp_max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE", "bsp_schedule_delay": "OTEL_BSP_SCHEDULE_DELAY",
                   "bsp_max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"}
        given = dict(items)
        for key, variable in numbers.items():
            if key not in given and variable in env:
                items = [*items, (key, env[variable])]
        for key, value in items:
            if key == "url":
                config.url = value if "://" in value else f"http://{value}"
            elif key == "resource":
                name, eq, attribute = value.partition("=")
                if not eq or not name:
                    raise ValueError(f"opentelemetry,resource={value}: expected resource=KEY=VALUE")
                config.resource[name] = attribute
            elif key in numbers:
                try:
                    number = int(value)
                except ValueError:
                    raise ValueError(f"opentelemetry,{key}={value}: expected an integer") from None
                if number < (0 if key == "bsp_schedule_delay" else 1):
                    raise ValueError(f"opentelemetry,{key}={value}: expected a positive integer")
                setattr(config, "bsp_schedule_delay_ms" if key == "bsp_schedule_delay" else key, number)
            else:
                raise ValueError(
                    f"unknown opentelemetry setting {key!r}; expected one of ['bsp_max_export_batch_size', "
                    f"'bsp_max_queue_size', 'bsp_schedule_delay', 'resource', 'url']"
                )
        if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
            raise ValueError("opentelemetry,bsp_max_export_batch_size must not exceed bsp_max_queue_size")
        return config


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # OTLP/JSON writes 64-bit integers as strings
    return {"stringValue": str(value)}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in values.items()]


class SpanExporter:
    """A batch span processor and OTLP/HTTP JSON exporter on a daemon thread. `add` never blocks: past
    bsp_max_queue_size spans are dropped (and counted), as OpenTelemetry's processor drops them."""

    def __init__(self, config: OtelConfig) -> None:
        self.config = config
        self.dropped = 0
        self.exported = 0
        self.failed_exports = 0
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._wake = threading.Condition()
        self._closing = False
        self._resource = {"attributes": _attributes(config.resource)}
        self._thread = threading.Thread(target=self._run, name="nereid-otlp-exporter", daemon=True)
        self._thread.start()

    def add(self, spans: list[dict[str, Any]]) -> None:
        with self._wake:
            room = self.config.bsp_max_queue_size - len(self._queue)
            if room < len(spans):
                self.dropped += len(spans) - max(room, 0)
                spans = spans[: max(room, 0)]
            self._queue.extend(spans)
            if len(self._queue) >= self.config.bsp_max_export_batch_size:
                self._wake.notify()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Export what is queued (within `timeout`) and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        delay = self.config.bsp_schedule_delay_ms / 1000
        size = self.config.bsp_max_export_batch_size
        while True:
            with self._wake:
                if not self._closing and len(self._queue) < size:
                    self._wake.wait(delay)
                closing = self._closing
                batch = [self._queue.popleft() for _ in range(min(size, len(self._queue)))]
            if batch:
                self._export(batch)
            if closing and not self._queue:
                return

    def _export(self, spans: list[dict[str, Any]]) -> None:
        body = {
            "resourceSpans": [
                {"resource": self._resource, "scopeSpans": [{"scope": {"name": "triton-server"}, "spans": spans}]}
            ]
        }
        request = urllib.request.Request(
            self.config.url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()
            self.exported += len(spans)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failed_exports += 1
            log.warning("failed to export %d spans to %s: %s", len(spans), self.config.url, exc)


@dataclass(slots=True)
class TraceIds:
    """The OpenTelemetry ids of one traced request, fixed when its trace starts (a child's own children need its
    model span's id while it runs): its model span and that span's parent, and for a client's request the root
    span and the client's span (from its traceparent) above it."""

    trace_id: str
    model_span_id: str
    model_parent_id: str
    root_span_id: str = ""  # only a client's request has the InferRequest span
    client_span_id: str = ""


def _in_time_order(names: tuple[str, ...], stamps: dict[str, int]) -> tuple[str, ...]:
    """Event names in the order they happened (Triton's root span: INFER_RESPONSE_COMPLETE before HTTP_SEND_*)."""
    return tuple(sorted(names, key=lambda name: stamps.get(name, 0)))


def _new_span_id() -> str:
    return os.urandom(8).hex()


class OtelTracer:
    """Turns finished request traces (core/tracing.py's RequestTrace) into spans for the exporter. Each trace carries
    its TraceIds from its start, so nothing here keeps state per request."""

    def __init__(self, config: OtelConfig, exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.exporter = exporter or SpanExporter(config)

    @staticmethod
    def begin(traceparent: str | None) -> TraceIds:
        """The ids of a client's request; its `traceparent` (if valid) names the trace and the root span's parent."""
        context = parse_traceparent(traceparent) if traceparent else None
        trace_id, client_span = context if context is not None else (os.urandom(16).hex(), "")
        root = _new_span_id()
        return TraceIds(trace_id, _new_span_id(), root, root, client_span)

    @staticmethod
    def begin_child(parent: TraceIds | None) -> TraceIds:
        """The ids of an ensemble step or a BLS request: in its parent's trace, under the parent's model span."""
        if parent is None:  # a parent without ids (not started by this tracer): a trace of its own
            return TraceIds(os.urandom(16).hex(), _new_span_id(), "")
        return TraceIds(parent.trace_id, _new_span_id(), parent.model_span_id)

    @staticmethod
    def context(ids: TraceIds) -> str:
        """The trace context that Triton gives a Python model (`request.trace().get_context()`): a W3C traceparent
        naming the request's model span, as JSON."""
        return json.dumps({"traceparent": f"00-{ids.trace_id}-{ids.model_span_id}-01"}, separators=(",", ":"))

    def finish(self, trace: Any, version: str) -> None:
        """Export a finished trace (REQUEST_END stamped): its model span and compute span, and for a client's request
        (no parent_id) the root span."""
        to_unix = time.time_ns() - time.monotonic_ns()
        stamps: dict[str, int] = {}
        for name, ns in trace.stamps:
            stamps.setdefault(name, ns + to_unix)
        ids: TraceIds | None = trace.otel
        if ids is None:
            ids = self.begin_child(None) if trace.parent_id else self.begin(None)
        # Triton 2.51's attributes, on the model span only; a request without an id has no triton.request_id.
        attributes = {"triton.model_name": trace.model, "triton.model_version": int(version) if version.isdigit() else -1,
                      "triton.trace_id": trace.id, "triton.trace_parent_id": trace.parent_id}
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        start = stamps.get("REQUEST_START", min(stamps.values(), default=to_unix))
        end = stamps.get("REQUEST_END", max(stamps.values(), default=start))
        spans = [self._span(trace.model, ids.trace_id, ids.model_span_id, ids.model_parent_id, start, end, stamps,
                            _MODEL_EVENTS, attributes)]
        if "COMPUTE_START" in stamps:
            spans.append(self._span("compute", ids.trace_id, _new_span_id(), ids.model_span_id, stamps["COMPUTE_START"],
                                    stamps.get("COMPUTE_END", end), stamps, _COMPUTE_EVENTS, {}))
        if ids.root_span_id:
            frontend = [name for name in stamps if name.startswith(("HTTP_", "GRPC_"))]
            root_start = min([start] + [stamps[n] for n in frontend])
            root_end = max([end] + [stamps[n] for n in frontend])
            spans.append(self._span("InferRequest", ids.trace_id, ids.root_span_id, ids.client_span_id, root_start,
                                    root_end, stamps, _in_time_order((*frontend, *_ROOT_EVENTS), stamps), {}))
        self.exporter.add(spans)

    @staticmethod
    def _span(
        name: str, trace_id: str, span_id: str, parent: str, start: int, end: int, stamps: dict[str, int],
        events: tuple[str, ...], attributes: dict[str, Any],
    ) -> dict[str, Any]:
        span: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": name,
            "kind": _SPAN_KIND_SERVER,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(max(end, start)),
            "events": [{"name": e, "timeUnixNano": str(stamps[e])} for e in events if e in stamps],
        }
        if parent:  # a root span has none, and OTLP/JSON leaves out empty fields
            span["parentSpanId"] = parent
        if attributes:
            span["attributes"] = _attributes(attributes)
        return span

    def close(self) -> None:
        self.exporter.shutdown()
