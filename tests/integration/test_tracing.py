"""Request tracing (`--trace-config`, Triton's `triton` trace mode): sampled requests' timestamps in Triton's
JSON trace-file records, by rate and count, to numbered files with a log frequency, switched on per model at
run time through the trace-settings API, and the same record layout and timestamp names as real Triton, ensemble
steps and BLS calls made with trace=request.trace() included as child traces."""

from __future__ import annotations

import json
import queue
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid.serve_flags import parse_serve_args
from tests.conftest import EXAMPLES, WITHOUT_LLM
from tests.integration.tracing_models import TWICE_ENSEMBLE
from tests.servers import start_nereid, start_real_triton

TRACED_BLS = Path(__file__).parent.parent / "models" / "traced_bls"

CORE_STAMPS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
# A request from a client also has the time its response was complete; an ensemble step's (a child trace) not.
CLIENT_STAMPS = CORE_STAMPS[:-1] + ["INFER_RESPONSE_COMPLETE", "REQUEST_END"]
HTTP_STAMPS = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_STAMPS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]


def _python_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return inputs


def _simple_inputs() -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _traces(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Trace id -> its head record plus {'stamps': [(name, ns), ...]} in file order."""
    traces: dict[int, dict[str, Any]] = {}
    for record in records:
        trace = traces.setdefault(record["id"], {"stamps": []})
        if "timestamps" in record:
            trace["stamps"] += [(stamp["name"], stamp["ns"]) for stamp in record["timestamps"]]
        else:
            trace.update(record)
    return traces


def test_sampled_requests_are_written_with_tritons_records_at_shutdown(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_nereid(
        [EXAMPLES], *WITHOUT_LLM, f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
        log_dir=tmp_path,
    )  # fmt: skip
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.infer("simple", _simple_inputs(), request_id="req-7")
            client.infer("add_sub_python", _python_inputs(httpclient))
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            client.infer("add_sub_python", _python_inputs(grpcclient))
        assert not trace_file.exists()  # log frequency 0: written when the server stops
    finally:
        assert server.stop() == 0, server.log()
    traces = _traces(json.loads(trace_file.read_text()))
    assert [(t["model_name"], t["model_version"], t.get("request_id")) for t in traces.values()] == [
        ("simple", 1, "req-7"), ("add_sub_python", 1, None), ("add_sub_python", 1, None)
    ]  # fmt: skip
    # The frontends' stamps bracket the server's: received before the request starts, sent after it ends.
    for trace, protocol in zip(traces.values(), (HTTP_STAMPS, HTTP_STAMPS, GRPC_STAMPS), strict=True):
        expected = protocol[:2] + CLIENT_STAMPS + protocol[2:]
        names = [name for name, _ in trace["stamps"]]
        assert sorted(names) == sorted(expected), names
        times = dict(trace["stamps"])
        ordered = [times[name] for name in expected]
        assert ordered == sorted(ordered), (trace["model_name"], trace["stamps"])


def test_rate_count_and_log_frequency_choose_what_is_written_where(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_nereid(
        [EXAMPLES], *WITHOUT_LLM, f"--trace-file={trace_file}", "--trace-level=TIMESTAMPS", "--trace-rate=2", "--trace-count=2",
        "--trace-log-frequency=1", log_dir=tmp_path,
    )  # fmt: skip
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            for i in range(6):
                client.infer("simple", _simple_inputs(), request_id=f"r{i}")
            # Each trace is written as soon as it is complete, one file per trace.
            written = sorted(p.name for p in tmp_path.glob("trace.json.*"))
            assert written == ["trace.json.0", "trace.json.1"]
    finally:
        assert server.stop() == 0, server.log()
    ids = [_traces(json.loads((tmp_path / name).read_text())) for name in written]
    # Every second request, and no more than two of them.
    assert [t["request_id"] for traces in ids for t in traces.values()] == ["r1", "r3"]


def test_tracing_is_switched_on_per_model_through_the_trace_settings_api(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_nereid([EXAMPLES], *WITHOUT_LLM, f"--trace-config=triton,file={trace_file}", log_dir=tmp_path)
    try:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.infer("simple", _simple_inputs(), request_id="before")
            client.update_trace_settings(
                model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
            )
            client.infer("simple", _simple_inputs(), request_id="on")
            client.infer("add_sub_python", _python_inputs(httpclient), request_id="other model")
            client.update_trace_settings(model_name="simple", settings={"trace_level": ["OFF"]})
            client.infer("simple", _simple_inputs(), request_id="off again")
    finally:
        assert server.stop() == 0, server.log()
    traces = _traces(json.loads(trace_file.read_text()))
    assert [t["request_id"] for t in traces.values()] == ["on"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--trace-config=level=TIMESTAMPS"], "needs a trace file"),
        (["--trace-config=mode=zipkin"], "not supported"),
        (["--trace-config=triton,colour=blue"], "unknown setting"),
    ],
)
def test_bad_trace_config_is_refused_at_start(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_serve_args(["--model-repository=/tmp", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.differential
def test_trace_records_have_the_layout_and_names_real_triton_writes(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(EXAMPLES / "add_sub_python", repository / "add_sub_python")
    written: dict[str, dict[int, dict[str, Any]]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        trace_file = tmp_path / f"{name}.json"
        flags = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                 "--trace-config=triton,log-frequency=1"]  # fmt: skip
        server = start(repository, *flags) if name == "triton" else start(repository, *flags, log_dir=tmp_path)
        try:
            with httpclient.InferenceServerClient(server.http_url) as client:
                client.infer("add_sub_python", _python_inputs(httpclient), request_id="req-1")
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                client.infer("add_sub_python", _python_inputs(grpcclient), request_id="req-2")
        finally:
            server.stop()
        records = [r for f in sorted(tmp_path.glob(f"{name}.json.*")) for r in json.loads(f.read_text())]
        written[name] = {t["request_id"]: t for t in _traces(records).values()}
    triton, nereid = (written[name]["req-1"] for name in ("triton", "nereid"))
    head_keys = {"id", "model_name", "model_version", "request_id"}
    assert head_keys <= triton.keys() and head_keys <= nereid.keys()
    assert (nereid["model_name"], nereid["model_version"], nereid["request_id"]) == (
        triton["model_name"], triton["model_version"], triton["request_id"]
    )  # fmt: skip
    triton_names = sorted(name for name, _ in triton["stamps"])
    assert triton_names == sorted(CLIENT_STAMPS + HTTP_STAMPS)
    # The same stamps, each once, the frontend's (HTTP_RECV_START and the like) included.
    assert sorted(name for name, _ in nereid["stamps"]) == triton_names
    # A unary gRPC call: the GRPC_WAITREAD and GRPC_SEND pairs, each once, as Triton writes them.
    grpc_names = {name: sorted(stamp for stamp, _ in written[name]["req-2"]["stamps"]) for name in written}
    assert grpc_names["nereid"] == grpc_names["triton"] == sorted(CLIENT_STAMPS + GRPC_STAMPS)


def _bls_inputs(mode: str) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("MODE", [1], "BYTES"), httpclient.InferInput("INPUT0", [4], "FP32"),
              httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    for tensor in inputs[1:]:
        tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
    return inputs


@pytest.mark.differential
def test_ensemble_steps_and_bls_calls_are_traced_as_children_of_their_callers_trace_like_triton(tmp_path: Path) -> None:
    """An ensemble's steps, and the BLS calls a Python model makes with trace=request.trace(), are child traces
    (`parent_id`); a BLS call without it is not traced at all."""
    repository = tmp_path / "repository"
    shutil.copytree(EXAMPLES / "add_sub_python", repository / "add_sub_python")
    for model in ("bls_traced", "count_up"):
        shutil.copytree(TRACED_BLS / model, repository / model)
    config = repository / "bls_traced" / "config.pbtxt"  # one instance: no nested call here, one process less
    config.write_text(config.read_text().replace("count: 2", "count: 1"))
    (repository / "add_sub_twice" / "1").mkdir(parents=True)
    (repository / "add_sub_twice" / "config.pbtxt").write_text(TWICE_ENSEMBLE)
    shapes: dict[str, list[tuple[str, str, str, list[str]]]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        trace_file = tmp_path / f"{name}.json"
        flags = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"]
        server = start(repository, *flags) if name == "triton" else start(repository, *flags, log_dir=tmp_path)
        try:
            with httpclient.InferenceServerClient(server.http_url) as client:
                inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("A", "B")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(np.full((1, 4), 2.0, dtype=np.float32))
                result = client.infer("add_sub_twice", inputs, request_id="pipeline-1")
                assert result.as_numpy("SUM_OF_BOTH").tolist() == [[4.0] * 4]
                for mode in ("exec", "async_exec", "stream", "untraced"):
                    client.infer("bls_traced", _bls_inputs(mode), request_id=mode)
        finally:
            server.stop()
        traces = _traces(json.loads(trace_file.read_text()))
        ensemble = next(t for t in traces.values() if t["model_name"] == "add_sub_twice")
        steps = [t for t in traces.values() if t.get("parent_id") == ensemble["id"]]
        # The ensemble and its two steps; four bls_traced requests and the calls of three of them.
        assert len(traces) == 3 + 4 + 3 and len(steps) == 2, traces
        # A child starts while its caller runs (a decoupled callee may end after it: Triton ends its request when
        # execute() returns, which can be after the caller has its last response).
        for child in (t for t in traces.values() if t.get("parent_id")):
            parent = dict(traces[child["parent_id"]]["stamps"])
            assert parent["REQUEST_START"] <= dict(child["stamps"])["REQUEST_START"] <= parent["REQUEST_END"], (name, child)
        shapes[name] = sorted(
            (t["model_name"], t.get("request_id", ""), traces[t["parent_id"]]["model_name"] if t.get("parent_id") else "",
             sorted(n for n, _ in t["stamps"]))
            for t in traces.values()
        )  # fmt: skip
    assert shapes["nereid"] == shapes["triton"]
    called = [(model, parent) for model, _, parent, _ in shapes["nereid"] if parent == "bls_traced"]
    assert called == [("add_sub_python", "bls_traced")] * 2 + [("count_up", "bls_traced")]


def _put_result(responses: queue.Queue[Any], result: Any, error: Any) -> None:
    responses.put(error or result)


@pytest.mark.differential
def test_a_decoupled_request_is_traced_with_the_timestamps_triton_writes(tmp_path: Path) -> None:
    """The `repeat` model sends its responses from inside execute(), so its compute times arrive after its last
    response: the trace still has them, as Triton's does."""
    repository = tmp_path / "repository"
    shutil.copytree(Path(__file__).parent.parent / "models" / "python" / "repeat", repository / "repeat")
    names: dict[str, list[str]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        trace_file = tmp_path / f"{name}.json"
        flags = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"]
        server = start(repository, *flags) if name == "triton" else start(repository, *flags, log_dir=tmp_path)
        try:
            responses: queue.Queue[Any] = queue.Queue()
            client = grpcclient.InferenceServerClient(server.grpc_url)
            client.start_stream(callback=partial(_put_result, responses))
            tensor = grpcclient.InferInput("IN", [3], "INT32")
            tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
            client.async_stream_infer("repeat", [tensor], request_id="stream-1")
            got = [responses.get(timeout=30) for _ in range(3)]
            client.stop_stream()
            assert [r.as_numpy("OUT").tolist() for r in got] == [[1], [2], [3]]
        finally:
            server.stop()
        (trace,) = _traces(json.loads(trace_file.read_text())).values()
        assert (trace["model_name"], trace["request_id"]) == ("repeat", "stream-1")
        names[name] = sorted(n for n, _ in trace["stamps"])
    # One GRPC_SEND_START/END pair per response sent, as Triton writes them.
    sends = ["GRPC_SEND_START", "GRPC_SEND_END"] * 3
    assert names["nereid"] == names["triton"] == sorted(CLIENT_STAMPS + GRPC_STAMPS[:2] + sends)
