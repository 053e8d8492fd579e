"""The client's grpc-timeout on the server's side, against real Triton: when it passes, a unary call and a whole
ModelStreamInfer stream end with DEADLINE_EXCEEDED "Deadline Exceeded" (even from a client that does not enforce
its own deadline), and in Nereid the request that was still queued never runs."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests import reference_triton
from tests.gate_model import gate_repository
from tests.servers import RunningServer, start_nereid, start_real_triton


def _message() -> bytes:
    request = pb.ModelInferRequest(model_name="gate", id="r1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    request.raw_input_contents.append(np.array([1, 2], dtype=np.float32).tobytes())
    payload = request.SerializeToString()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _raw_call(port: int, method: str, timeout: str, half_close: bool) -> tuple[dict[str, str], float]:
    """A call that carries grpc-timeout but never enforces or cancels it: the server's answer, and when."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    connection.initiate_connection()
    headers = [
        (":method", "POST"), (":scheme", "http"), (":path", f"/inference.GRPCInferenceService/{method}"),
        (":authority", "127.0.0.1"), ("content-type", "application/grpc"), ("te", "trailers"),
        ("grpc-timeout", timeout),
    ]
    connection.send_headers(1, headers)
    connection.send_data(1, _message(), end_stream=half_close)
    sock.sendall(connection.data_to_send())
    started = time.monotonic()
    answer: dict[str, str] = {}
    buffer = b""
    try:
        while time.monotonic() - started < 30 and "grpc-status" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            buffer += data
            # Fed a frame at a time: tritonserver resets the stream right after its trailers, and h2 refuses
            # (and loses the events of) a read that has frames for a stream it saw closed.
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                size = 9 + int.from_bytes(buffer[:3], "big")
                one, buffer = buffer[:size], buffer[size:]
                try:
                    events = connection.receive_data(one)
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                    continue
                for event in events:
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        answer.update(dict(event.headers))
            sock.sendall(connection.data_to_send())
    finally:
        sock.close()
    return answer, time.monotonic() - started


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    running: dict[str, RunningServer] = {}
    gates = []
    try:
        for kind in ("nereid",) if reference_triton.opted_out() else ("nereid", "triton"):
            root = tmp_path_factory.mktemp(f"deadline_{kind}")
            repo, gate, _ = gate_repository(root)
            gates.append(gate)
            running[kind] = start_nereid(repo, log_dir=root) if kind == "nereid" else start_real_triton(repo)
        yield running
    finally:
        for gate in gates:
            gate.touch()
        for kind, server in running.items():
            code = server.stop()
            assert kind != "nereid" or code == 0, server.log()


@pytest.mark.parametrize("kind", ["nereid", pytest.param("triton", marks=pytest.mark.differential)])
@pytest.mark.parametrize(
    "method, half_close", [("ModelInfer", True), ("ModelStreamInfer", False), ("ModelStreamInfer", True)]
)
def test_a_passed_grpc_timeout_ends_the_call_with_deadline_exceeded(
    servers: dict[str, RunningServer], kind: str, method: str, half_close: bool
) -> None:
    if kind not in servers:
        pytest.skip("real Triton is not here")
    answer, elapsed = _raw_call(servers[kind].grpc_port, method, "400m", half_close)
    assert (answer.get("grpc-status"), answer.get("grpc-message")) == ("4", "Deadline Exceeded"), answer
    assert 0.35 < elapsed < 20


def test_a_malformed_grpc_timeout_is_no_deadline(servers: dict[str, RunningServer]) -> None:
    for value in ("400", "x1S", "123456789S", "1s"):
        answer, _ = _raw_call(servers["nereid"].grpc_port, "ServerLive", value, True)
        assert answer.get("grpc-status") == "0", (value, answer)


def test_a_queued_request_whose_client_timeout_passes_never_runs(tmp_path: Path) -> None:
    repo, gate, started = gate_repository(tmp_path)
    server = start_nereid(repo, log_dir=tmp_path)
    try:
        tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
        blocker = grpcclient.InferenceServerClient(server.grpc_url)
        results: list[object] = []
        blocker.async_infer("gate", [tensor], lambda result, error: results.append(result or error), client_timeout=60)
        deadline = time.monotonic() + 30
        while not started.exists():  # the one instance is busy with the blocker
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            with pytest.raises(InferenceServerException) as raised:
                client.infer("gate", [tensor], client_timeout=0.5)  # queued behind the blocker
            assert "DEADLINE_EXCEEDED" in str(raised.value.status())
            answer, _ = _raw_call(server.grpc_port, "ModelInfer", "300m", True)  # a client that never cancels
            assert answer.get("grpc-status") == "4"
        gate.touch()
        while not results:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not isinstance(results[0], Exception), results[0]
        stats = requests.get(f"{server.base}/v2/models/gate/stats", timeout=10).json()["model_stats"][0]
        # The instance had taken the blocker and, pipelined behind it, the first of the two timed-out requests;
        # the second was still queued and never ran (without cancelling it, three would have run).
        assert stats["inference_stats"]["success"]["count"] == 2
        assert stats["execution_count"] == 2
        blocker.close()
    finally:
        gate.touch()
        assert server.stop() == 0, server.log()
