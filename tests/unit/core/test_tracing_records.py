"""Trace records without a server: Triton's tensor formatting, the TENSORS-only layout, a frontend holding a trace
until it has sent the response, and HTTP receive times taken only while tracing is on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereid.core.admission import InflightLimit
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import TransportLimits
from nereid.core.trace_settings import TraceSettings
from nereid.core.tracing import FrontendTrace, RequestTrace, Tracer, tensor_record_data
from nereid.frontends.http import server as http_server


@pytest.mark.parametrize(
    "datatype, values, expected",
    [
        ("FP32", np.array([0.1, 1e-7, 123456789, -0.0], np.float32), "0.1,1e-07,1.23457e+08,-0"),
        ("FP64", np.array([1 / 3, 1e300], np.float64), "0.333333,1e+300"),
        ("BOOL", np.array([[True], [False]]), "1,0"),
        ("INT8", np.array([-128, 127], np.int8), "-128,127"),  # Triton writes raw characters here
        ("UINT8", np.array([0, 255], np.uint8), "0,255"),
        ("UINT64", np.array([2**64 - 1], np.uint64), "18446744073709551615"),
        ("BF16", np.array([1, 2], np.uint16), ""),
        ("FP16", np.array([1.5], np.float16), ""),
        ("BYTES", np.array([b"a\"b", b"\xff"], np.object_), '"a"b","\\xff"'),
    ],
)
def test_tensor_data_is_formatted_as_triton_streams_it(datatype: str, values: np.ndarray, expected: str) -> None:
    assert tensor_record_data(datatype, values) == expected


def test_tensors_level_alone_writes_only_the_tensor_records() -> None:
    trace = RequestTrace(7, "m", "r", levels=["TENSORS"])
    trace.stamp("REQUEST_START")
    trace.tensor("TENSOR_QUEUE_INPUT", "IN", "INT32", (1, 2), np.array([[1, 2]], np.int32))
    trace.tensor("TENSOR_QUEUE_INPUT", "EMPTY", "INT32", (0,), np.array([], np.int32))
    assert trace.records(1) == [
        {"id": 7, "activity": "TENSOR_QUEUE_INPUT", "tensor": {"name": "IN", "data": "1,2", "shape": "1,2", "dtype": "INT32"}}
    ]
    both = RequestTrace(8, "m", "", levels=["TIMESTAMPS", "TENSORS"])
    both.tensor("TENSOR_BACKEND_OUTPUT", "OUT", "FP32", (1,), np.array([2.5], np.float32))
    assert [sorted(r) for r in both.records(1)] == [["id", "model_name", "model_version"], ["activity", "id", "tensor"]]


def test_a_held_trace_is_written_when_the_frontend_releases_it(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    settings = TraceSettings(
        {"trace_file": str(trace_file), "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
    )
    tracer = Tracer(settings)
    held = FrontendTrace([("HTTP_RECV_START", 1), ("HTTP_RECV_END", 2)])
    trace = tracer.start("m", "r")
    assert trace is not None
    trace.stamps += held.stamps
    trace.waiting += 1  # what the server does for a request a frontend holds
    tracer.finish(trace, "1")
    assert not Path(f"{trace_file}.0").exists()  # the frontend has not sent the response yet
    trace.stamp("HTTP_SEND_START")
    tracer.release(trace)
    records = json.loads(Path(f"{trace_file}.0").read_text())
    names = [r["timestamps"][0]["name"] for r in records if "timestamps" in r]
    assert names == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_END", "HTTP_SEND_START"]


class _Switch:
    enabled = False


class _FakeServer:
    def __init__(self, tracing: Any) -> None:
        self.tracing = tracing
        self.connections: set[Any] = set()
        self.should_exit = False
        self.limits = TransportLimits()
        self.max_input_size = 64 * 1024 * 1024
        self.inflight = InflightLimit(8)
        self.request_memory = RequestMemoryBudget(self.limits.request_memory_limit)
        self.direct_infer = None


def _received(enabled: bool) -> tuple[int, int] | None:
    """Feed one request to an HTTP connection and return the receive times it handed to the app."""
    switch = _Switch()
    switch.enabled = enabled
    started: list[Any] = []

    async def run() -> None:
        class Recording(http_server._Connection):
            def _start(self, request: Any) -> None:
                started.append(request)

        connection = Recording(None, _FakeServer(switch))  # type: ignore[arg-type]
        connection.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")

    asyncio.run(run())
    (request,) = started
    return request.received


def test_http_receive_times_are_taken_only_while_tracing_is_on() -> None:
    assert _received(False) is None
    received = _received(True)
    assert received is not None and 0 < received[0] <= received[1]
