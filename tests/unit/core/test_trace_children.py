"""Child traces without a server: an ensemble step's or a BLS call's trace is in its caller's trace, under its
caller's model span, with ids fixed when it starts (so a grandchild finds them, and a child ending after its caller
still has them); the context a Python model reads names the model span; pb_utils' InferenceTrace."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nereid.backends.python.pb_requests import InferenceRequest, InferenceTrace
from nereid.core.otel_tracing import OtelConfig, OtelTracer
from nereid.core.trace_settings import TraceSettings
from nereid.core.tracing import RequestTrace, Tracer

CLIENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


class _Collected:
    """A span exporter that keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []

    def add(self, spans: list[dict[str, Any]]) -> None:
        self.spans += spans

    def shutdown(self) -> None:
        pass


def _otel_tracer() -> tuple[Tracer, _Collected]:
    tracer = Tracer(TraceSettings({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "unused"}))
    collected = _Collected()
    tracer.otel = OtelTracer(OtelConfig(), collected)  # type: ignore[arg-type]
    return tracer, collected


def _finish(tracer: Tracer, trace: RequestTrace) -> None:
    trace.stamp("REQUEST_START")
    trace.report_compute(1, 1, 1)
    tracer.finish(trace, "1")


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def test_a_grandchild_ending_after_its_callers_is_still_under_its_parents_model_span() -> None:
    tracer, collected = _otel_tracer()
    root = tracer.start("caller", "req-1", CLIENT)
    assert root is not None
    child = tracer.start_child(root, "callee", "")  # a BLS request without an id of its own
    grandchild = tracer.start_child(child, "leaf")
    for trace in (root, child, grandchild):  # the caller first: ids were fixed at the start
        _finish(tracer, trace)
    spans = {(s["name"], s.get("parentSpanId")): s for s in collected.spans}
    models = {s["name"]: s for s in collected.spans if s["name"] not in ("compute", "InferRequest")}
    assert {s["traceId"] for s in collected.spans} == {"ab" * 16}
    assert models["caller"]["parentSpanId"] == next(s for s in collected.spans if s["name"] == "InferRequest")["spanId"]
    assert models["callee"]["parentSpanId"] == models["caller"]["spanId"]
    assert models["leaf"]["parentSpanId"] == models["callee"]["spanId"]
    for model in models.values():
        assert ("compute", model["spanId"]) in spans
    # Only a client's request has the root span; a request without an id has no triton.request_id.
    assert [s["name"] for s in collected.spans].count("InferRequest") == 1
    assert _attributes(models["caller"])["triton.request_id"] == "req-1"
    assert "triton.request_id" not in _attributes(models["callee"])
    assert "triton.request_id" not in _attributes(models["leaf"])  # a step's id is its caller's: none here
    assert _attributes(models["leaf"])["triton.trace_parent_id"] == str(child.id)  # OTLP/JSON int64s are strings


def test_the_context_a_model_reads_names_its_model_span_and_only_in_the_opentelemetry_mode() -> None:
    tracer, collected = _otel_tracer()
    root = tracer.start("caller", "", CLIENT)
    assert root is not None
    context = tracer.context(root)
    _finish(tracer, root)
    model_span = next(s for s in collected.spans if s["name"] == "caller")
    assert context is not None and json.loads(context) == {"traceparent": f"00-{'ab' * 16}-{model_span['spanId']}-01"}
    assert tracer.context(None) is None
    triton_mode = Tracer(TraceSettings({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "unused"}))
    traced = triton_mode.start("caller", "")
    assert traced is not None and triton_mode.context(traced) is None


def test_a_bls_childs_record_has_its_callers_id_and_its_own_request_id() -> None:
    tracer = Tracer(TraceSettings({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_file": "unused"}))
    caller = tracer.start("caller", "req-1")
    assert caller is not None
    step, call = tracer.start_child(caller, "step"), tracer.start_child(caller, "callee", "")
    assert (step.request_id, call.request_id) == ("req-1", "")  # an ensemble step has its ensemble's
    assert call.parent_id == caller.id and call.id > caller.id and (call.timestamps, call.tensors) == (True, True)
    assert call.records(1)[0] == {"id": call.id, "model_name": "callee", "model_version": 1, "parent_id": caller.id}


def test_pb_utils_trace_of_a_built_request_is_the_one_it_was_given() -> None:
    given = InferenceTrace((3, 0))
    assert InferenceRequest("m", [], [], trace=given).trace() is given
    assert InferenceRequest("m", [], []).trace().get_context() is None  # no request behind it: no call
    with pytest.raises(TypeError, match="takes what request.trace"):
        InferenceRequest("m", [], [], trace="00-abc")
