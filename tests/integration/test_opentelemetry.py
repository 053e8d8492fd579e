"""`--trace-config mode=opentelemetry`: traced requests exported over OTLP/HTTP to a receiver the test starts, with
Triton's span layout (InferRequest -> model -> compute; ensemble steps and BLS calls made with trace=request.trace()
under their caller's model span), its events and attributes, the resource attributes given with
`opentelemetry,resource=`, the client's `traceparent` context over HTTP and gRPC, and the context a Python model
reads with request.trace().get_context()."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid.core.otel_tracing import OtelConfig, SpanExporter, parse_traceparent
from nereid.serve_flags import parse_serve_args
from tests.conftest import EXAMPLES, without_llm
from tests.integration.protocol_models import PYTHON_ENSEMBLE
from tests.servers import RunningServer, start_nereid, start_real_triton

TRACEPARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
CLIENT_TRACE_ID, CLIENT_SPAN_ID = "0af7651916cd43dd8448eb211c12666c", "b7ad6b7169242424"
TRACED_BLS = Path(__file__).parent.parent / "models" / "traced_bls"
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class _Receiver:
    """An OTLP/HTTP trace receiver on loopback: keeps every span of every export, and the resources."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the handler API's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.content_types.add(self.headers["Content-Type"])
                for resource_spans in body["resourceSpans"]:
                    receiver.resources.append(resource_spans["resource"])
                    for scope in resource_spans["scopeSpans"]:
                        receiver.spans.extend(scope["spans"])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def trace(self, trace_id: str | None = None, spans: int = 3, since: int = 0, timeout: float = 20) -> list[dict[str, Any]]:
        """The spans of one trace (the newest unless named) that arrived after the first `since` spans, once
        `spans` of them have."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.spans) > since:
                wanted = trace_id or self.spans[-1]["traceId"]
                found = [s for s in self.spans[since:] if s["traceId"] == wanted]
                if len(found) >= spans:
                    return found
            time.sleep(0.05)
        raise AssertionError(f"{spans} spans of trace {trace_id} did not arrive: {self.spans[since:][-20:]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[_Receiver]:
    receiver = _Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def otel_server(receiver: _Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(
        [EXAMPLES, TRACED_BLS],
        *without_llm(TRACED_BLS),
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        f"--trace-config=opentelemetry,url={receiver.url}",
        "--trace-config=opentelemetry,resource=service.name=test_nereid",
        "--trace-config=opentelemetry,resource=test.key=test.value",
        "--trace-config=opentelemetry,bsp_schedule_delay=50",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield server
    assert server.stop() == 0, server.log()


def _simple_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _by_name(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    named: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    return named


def _events(span: dict[str, Any]) -> list[str]:
    return [event["name"] for event in span["events"]]


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def _check_model_and_compute(spans: list[dict[str, Any]], model: str, parent_span: str) -> dict[str, Any]:
    named = _by_name(spans)
    model_span = next(s for s in named[model] if s.get("parentSpanId") == parent_span)
    assert _events(model_span) == MODEL_EVENTS
    assert _attributes(model_span)["triton.model_name"] == model and _attributes(model_span)["triton.model_version"] == "1"
    compute = [s for s in named["compute"] if s.get("parentSpanId") == model_span["spanId"]]
    assert len(compute) == 1, (model, spans)
    assert _events(compute[0]) == COMPUTE_EVENTS
    times = [int(e["timeUnixNano"]) for e in model_span["events"]]
    compute_times = [int(e["timeUnixNano"]) for e in compute[0]["events"]]
    assert times == sorted(times) and compute_times == sorted(compute_times)
    assert times[1] <= compute_times[0] and compute_times[-1] <= times[-1], "compute outside the model span"
    # OpenTelemetry spans are on the wall clock, unlike Triton's trace file.
    assert abs(int(model_span["startTimeUnixNano"]) / 1e9 - time.time()) < 120
    return model_span


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_with_a_traceparent_is_exported_as_a_child_of_the_clients_span(
    otel_server: RunningServer, receiver: _Receiver, protocol: str
) -> None:
    module, url = (httpclient, otel_server.http_url) if protocol == "http" else (grpcclient, otel_server.grpc_url)
    before = len(receiver.spans)
    with module.InferenceServerClient(url) as client:
        client.infer("simple", _simple_inputs(module), request_id=f"otel-{protocol}", headers={"traceparent": TRACEPARENT})
    spans = receiver.trace(CLIENT_TRACE_ID, since=before)
    assert sorted(s["name"] for s in spans) == ["InferRequest", "compute", "simple"], spans
    root_span = _by_name(spans)["InferRequest"][0]
    assert root_span["parentSpanId"] == CLIENT_SPAN_ID
    assert "INFER_RESPONSE_COMPLETE" in _events(root_span)
    # The frontend's own events are on the root span, as Triton's are.
    frontend = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"] if protocol == "http" else [
        "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    assert set(frontend) <= set(_events(root_span)), _events(root_span)
    _check_model_and_compute(spans, "simple", root_span["spanId"])
    assert receiver.content_types == {"application/json"}
    resource = {a["key"]: a["value"]["stringValue"] for a in receiver.resources[-1]["attributes"]}
    assert resource["service.name"] == "test_nereid" and resource["test.key"] == "test.value"


def test_a_request_without_context_starts_a_trace_of_its_own(otel_server: RunningServer, receiver: _Receiver) -> None:
    before = len(receiver.spans)
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.infer("simple", _simple_inputs(httpclient), request_id="no-context")
    spans = receiver.trace(since=before)
    assert {s["name"] for s in spans} == {"InferRequest", "simple", "compute"}
    root = _by_name(spans)["InferRequest"][0]
    assert "parentSpanId" not in root and root["traceId"] != CLIENT_TRACE_ID
    model_span = _check_model_and_compute(spans, "simple", root["spanId"])
    assert _attributes(model_span)["triton.request_id"] == "no-context"


def test_an_ensembles_steps_are_spans_under_the_ensembles_span(otel_server: RunningServer, receiver: _Receiver) -> None:
    inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.infer("simple_ensemble", inputs, headers={"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})
    # InferRequest, the ensemble's span, and a model span plus a compute span for each of its five steps.
        receiver.trace("11111111111111111111111111111111", spans=12)
        # Spans leave in the order they end: once a later request's spans are in, so is all of the ensemble's.
        client.infer("simple", _simple_inputs(httpclient), headers={"traceparent": "00-" + "3" * 32 + "-" + "4" * 16 + "-01"})
        receiver.trace("3" * 32)
    spans = [s for s in receiver.spans if s["traceId"] == "11111111111111111111111111111111"]
    named = _by_name(spans)
    root = named["InferRequest"][0]
    assert root["parentSpanId"] == "2222222222222222"
    ensemble = named["simple_ensemble"][0]
    assert ensemble["parentSpanId"] == root["spanId"]
    assert _events(ensemble) == MODEL_EVENTS
    steps = sorted(s["name"] for s in spans if s.get("parentSpanId") == ensemble["spanId"])
    assert steps == ["ensemble_postprocess"] * 2 + ["ensemble_preprocess"] * 2 + ["simple"], steps
    for step in (s for s in spans if s.get("parentSpanId") == ensemble["spanId"]):
        _check_model_and_compute(spans, step["name"], ensemble["spanId"])
    assert len(spans) == 12, sorted(s["name"] for s in spans)


def _bls_inputs(mode: str) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("MODE", [1], "BYTES"), httpclient.InferInput("INPUT0", [4], "FP32"),
              httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.full(4, 2.0, dtype=np.float32))
    inputs[2].set_data_from_numpy(np.ones(4, dtype=np.float32))
    return inputs


def _call_bls_traced(server: RunningServer, mode: str, trace_id: str) -> tuple[list[float], str]:
    """bls_traced's OUTPUT0 and CONTEXT for a request in the trace `trace_id`."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("bls_traced", _bls_inputs(mode), request_id=f"bls-{mode}",
                              headers={"traceparent": f"00-{trace_id}-{'7' * 16}-01"})
    return result.as_numpy("OUTPUT0").tolist(), result.as_numpy("CONTEXT")[0].decode()


@pytest.mark.parametrize("mode, callee, expected", [("exec", "add_sub_python", [3.0] * 4),
                                                    ("async_exec", "add_sub_python", [3.0] * 4),
                                                    ("stream", "count_up", [1.0, 2.0, 3.0, 0.0])])
def test_a_bls_call_with_the_callers_trace_is_a_span_under_the_callers_model_span(
    otel_server: RunningServer, receiver: _Receiver, mode: str, callee: str, expected: list[float]
) -> None:
    trace_id = {"exec": "a1", "async_exec": "a2", "stream": "a3"}[mode] * 16
    before = len(receiver.spans)
    output, context = _call_bls_traced(otel_server, mode, trace_id)
    assert output == expected
    # InferRequest, bls_traced and its compute; the called model's span and its compute.
    spans = receiver.trace(trace_id, spans=5, since=before)
    root = _by_name(spans)["InferRequest"][0]
    caller = _check_model_and_compute(spans, "bls_traced", root["spanId"])
    called = _check_model_and_compute(spans, callee, caller["spanId"])
    assert _attributes(called)["triton.trace_parent_id"] == _attributes(caller)["triton.trace_id"]
    # The BLS request has no id of its own: Triton's span has no triton.request_id then.
    assert "triton.request_id" not in _attributes(called)
    caller_times = [int(e["timeUnixNano"]) for e in caller["events"]]
    called_times = [int(e["timeUnixNano"]) for e in called["events"]]
    assert caller_times[0] <= called_times[0] <= caller_times[-1]
    if mode != "stream":
        assert called_times[-1] <= caller_times[-1]
    # A decoupled callee's request ends when its execute() returns, which races the caller: the caller may read the
    # final flag, return and end its own span first (Triton releases such a request after execute() too).
    # What the model read with request.trace().get_context(): the traceparent of its own model span.
    assert json.loads(context) == {"traceparent": f"00-{trace_id}-{caller['spanId']}-01"}
    assert len(spans) == 5, sorted(s["name"] for s in spans)


def test_a_bls_call_from_a_bls_callee_is_a_span_under_the_callees_span(
    otel_server: RunningServer, receiver: _Receiver
) -> None:
    trace_id = "b4" * 16
    before = len(receiver.spans)
    assert _call_bls_traced(otel_server, "nested", trace_id)[0] == [3.0] * 4
    spans = receiver.trace(trace_id, spans=7, since=before)
    root = _by_name(spans)["InferRequest"][0]
    outer = _check_model_and_compute(spans, "bls_traced", root["spanId"])
    inner = _check_model_and_compute(spans, "bls_traced", outer["spanId"])
    _check_model_and_compute(spans, "add_sub_python", inner["spanId"])


def test_an_ensemble_steps_bls_call_is_a_span_under_the_steps_span(otel_server: RunningServer, receiver: _Receiver) -> None:
    trace_id = "e7" * 16
    before = len(receiver.spans)
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        result = client.infer("traced_pipeline", _bls_inputs("exec"), headers={"traceparent": f"00-{trace_id}-{'7' * 16}-01"})
    assert result.as_numpy("OUTPUT0").tolist() == [3.0] * 4
    # InferRequest, the ensemble's span, its step's span and compute, the step's BLS call's span and compute.
    spans = receiver.trace(trace_id, spans=6, since=before)
    named = _by_name(spans)
    ensemble = named["traced_pipeline"][0]
    assert ensemble["parentSpanId"] == named["InferRequest"][0]["spanId"]
    step = _check_model_and_compute(spans, "bls_traced", ensemble["spanId"])
    _check_model_and_compute(spans, "add_sub_python", step["spanId"])
    assert json.loads(result.as_numpy("CONTEXT")[0])["traceparent"] == f"00-{trace_id}-{step['spanId']}-01"


def test_a_bls_call_without_the_callers_trace_is_not_traced(otel_server: RunningServer, receiver: _Receiver) -> None:
    before = len(receiver.spans)
    assert _call_bls_traced(otel_server, "untraced", "c5" * 16)[0] == [3.0] * 4
    receiver.trace("c5" * 16, spans=3, since=before)
    # A later request's spans are in: so would the BLS call's be, which would have ended before its caller.
    with httpclient.InferenceServerClient(otel_server.http_url) as client:
        client.infer("simple", _simple_inputs(httpclient), headers={"traceparent": f"00-{'c6' * 16}-{'7' * 16}-01"})
    receiver.trace("c6" * 16, since=before)
    assert [s for s in receiver.spans[before:] if s["name"] == "add_sub_python"] == []
    assert sorted(s["name"] for s in receiver.spans[before:] if s["traceId"] == "c5" * 16) == [
        "InferRequest", "bls_traced", "compute"]


def test_an_invalid_traceparent_is_ignored() -> None:
    assert parse_traceparent(TRACEPARENT) == (CLIENT_TRACE_ID, CLIENT_SPAN_ID)
    for header in ("", "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424", "00-" + "0" * 32 + "-b7ad6b7169242424-01",
                   "00-0af7651916cd43dd8448eb211c12666c-" + "0" * 16 + "-01", "ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01",
                   "00-0AF7651916CD43DD8448EB211C12666Z-b7ad6b7169242424-01"):
        assert parse_traceparent(header) is None, header


def test_the_batch_span_processor_drops_past_its_queue_and_exports_the_rest_at_shutdown(receiver: _Receiver) -> None:
    before = len(receiver.spans)
    config = OtelConfig.from_items([("url", receiver.url), ("bsp_max_queue_size", "3"), ("bsp_max_export_batch_size", "3"),
                                    ("bsp_schedule_delay", "60000")], environ={})
    exporter = SpanExporter(config)
    exporter.add([{"traceId": "a" * 32, "spanId": f"{i:016x}", "name": f"s{i}"} for i in range(5)])
    assert exporter.dropped == 2
    exporter.shutdown()
    assert exporter.exported == 3
    assert [s["name"] for s in receiver.spans[before:]] == ["s0", "s1", "s2"]


@pytest.mark.parametrize(
    "item, message",
    [
        ("opentelemetry,colour=blue", "unknown opentelemetry setting 'colour'"),
        ("opentelemetry,bsp_max_queue_size=many", "expected an integer"),
        ("opentelemetry,resource=novalue", "resource=KEY=VALUE"),
        ("mode=zipkin", "not supported"),
    ],
)
def test_bad_opentelemetry_settings_are_refused_at_start(item: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_serve_args(["--model-repository=/tmp", "--trace-config=mode=opentelemetry", f"--trace-config={item}"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_opentelemetry_settings_have_tritons_defaults_and_read_the_environment(tmp_path: Path) -> None:
    config = OtelConfig.from_items([], environ={})
    assert (config.url, config.resource, config.bsp_max_queue_size, config.bsp_schedule_delay_ms,
            config.bsp_max_export_batch_size) == ("http://localhost:4318/v1/traces",
                                                  {"service.name": "triton-inference-server"}, 2048, 5000, 512)
    config = OtelConfig.from_items([("url", "collector:4318/v1/traces"), ("bsp_max_queue_size", "10")],
                                   environ={"OTEL_BSP_MAX_QUEUE_SIZE": "99", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "7",
                                            "OTEL_RESOURCE_ATTRIBUTES": "service.name=from_env,team=ml"})
    assert config.url == "http://collector:4318/v1/traces"
    assert (config.bsp_max_queue_size, config.bsp_max_export_batch_size) == (10, 7)
    assert config.resource == {"service.name": "from_env", "team": "ml"}


def _shape_of_trace(spans: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A trace without its ids and times: each span's name, its parent's name (or the client's), kind, events and
    attribute keys, sorted."""
    names = {s["spanId"]: s["name"] for s in spans}
    return sorted(
        (s["name"], names.get(s.get("parentSpanId", ""), "client" if s.get("parentSpanId") else ""), s["kind"],
         tuple(_events(s)), tuple(sorted(_attributes(s))))
        for s in spans
    )


def _python_inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return inputs


@pytest.mark.differential
def test_spans_have_the_shape_real_triton_exports(receiver: _Receiver, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(EXAMPLES / "add_sub_python", repository / "add_sub_python")
    for model in ("bls_traced", "count_up"):
        shutil.copytree(TRACED_BLS / model, repository / model)
    # One instance is enough without the nested call (tested above), and each instance is a process to start.
    config = repository / "bls_traced" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 2", "count: 1"))
    (repository / "python_ensemble" / "1").mkdir(parents=True)
    (repository / "python_ensemble" / "config.pbtxt").write_text(PYTHON_ENSEMBLE)
    flags = ["--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
             f"--trace-config=opentelemetry,url={receiver.url}", "--trace-config=opentelemetry,bsp_schedule_delay=50"]
    # (model, inputs, request id, the client's trace id or "", the spans of its trace)
    requests = [("add_sub_python", _python_inputs(), "add_sub_python", "5" * 32, 3),
                ("python_ensemble", _python_inputs(), "python_ensemble", "", 4),
                ("bls_traced", _bls_inputs("exec"), "", "d1" * 16, 5),  # no request id: no triton.request_id
                ("bls_traced", _bls_inputs("stream"), "stream", "d2" * 16, 5),
                ("bls_traced", _bls_inputs("untraced"), "untraced", "d4" * 16, 3)]
    shapes: dict[str, list[Any]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        server = start(repository, *flags)
        try:
            traces = []
            with httpclient.InferenceServerClient(server.http_url) as client:
                for model, inputs, request_id, trace_id, count in requests:
                    before = len(receiver.spans)
                    headers = {"traceparent": f"00-{trace_id}-{'6' * 16}-01"} if trace_id else None
                    client.infer(model, inputs, request_id=request_id, headers=headers)
                    traces.append(_shape_of_trace(receiver.trace(trace_id or None, spans=count, since=before)))
            shapes[name] = traces
        finally:
            server.stop()
    # The root span carries the frontend's events (HTTP_RECV_*, HTTP_SEND_*) on both servers; a BLS call's span is
    # under its caller's model span when it was made with trace=request.trace(), and absent when not.
    assert shapes["nereid"] == shapes["triton"]
