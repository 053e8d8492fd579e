"""Nereid's own HTTP/2 gRPC transport against real gRPC clients (grpc-core under tritonclient and grpcio):
large messages under flow control, many calls multiplexed on one connection, unknown methods, bad
connections, TLS. Draining on SIGTERM is in test_cli_and_lifecycle."""

from __future__ import annotations

import asyncio
import queue
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, without_llm
from tests.integration.protocol_models import build_protocol_repository, echo_model
from tests.servers import RunningServer, start_nereid


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = build_protocol_repository(tmp_path_factory.mktemp("transport_repository"))
    running = start_nereid([EXAMPLES, repository], *without_llm(repository), log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def _echo(client: grpcclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(echo_model("FP32"), [tensor])
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


def test_large_tensors_cross_both_ways_intact(server: RunningServer) -> None:
    # 24 MiB each way: many DATA frames, and more than the client's and our initial flow-control windows.
    data = np.random.default_rng(0).standard_normal((1, 6 * 1024 * 1024)).astype(np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        np.testing.assert_array_equal(_echo(client, data), data)


def test_a_client_with_a_small_receive_window_gets_the_whole_response(server: RunningServer) -> None:
    """The server must wait for WINDOW_UPDATE instead of overrunning a 16 KiB stream window."""
    options = [("grpc.http2.lookahead_bytes", 16384), ("grpc.http2.bdp_probe", 0)]
    data = np.arange(256 * 1024, dtype=np.float32).reshape(1, -1)  # 1 MiB response
    request = pb.ModelInferRequest(model_name=echo_model("FP32"))
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=list(data.shape))
    del tensor  # the data travels in raw_input_contents
    request.raw_input_contents.append(data.tobytes())
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(3):
            reply = stub.ModelInfer(request, timeout=30)
            np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], dtype=np.float32), data.ravel())


def test_many_concurrent_calls_on_one_connection_each_get_their_own_answer(server: RunningServer) -> None:
    async def run() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:

            async def one(i: int) -> None:
                data = np.full((1, 8 + i % 5), float(i), dtype=np.float32)
                tensor = grpcaio.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                result = await client.infer(echo_model("FP32"), [tensor], request_id=str(i))
                assert result.get_response().id == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)

            await asyncio.gather(*(one(i) for i in range(300)))

    asyncio.run(run())


def test_an_unknown_method_is_unimplemented(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as excinfo:
            call(b"", timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_malformed_request_message_is_an_error_not_a_crash(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as excinfo:
            call(b"\xff\xff\xff\xff", timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.INTERNAL
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live()


def test_a_connection_that_is_not_http2_is_dropped_and_others_are_served(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # Our SETTINGS may arrive first; then the server closes the connection (a timeout here fails the test).
        while sock.recv(4096):
            pass
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready()


# -- TLS (--grpc-use-ssl, --grpc-use-ssl-mutual) ---------------------------------------------------------
def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed_certificate(directory: Path, name: str, ca: Path, ca_key: Path) -> tuple[Path, Path]:
    key, request, cert, extensions = (directory / f"{name}{suffix}" for suffix in (".key", ".csr", ".pem", ".ext"))
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(extensions))  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=nereid-test-ca")
    server_cert, server_key = _signed_certificate(directory, "server", ca, ca_key)
    client_cert, client_key = _signed_certificate(directory, "client", ca, ca_key)
    return {"ca": ca, "server_cert": server_cert, "server_key": server_key, "client_cert": client_cert, "client_key": client_key}


def _tls_server(certificates: dict[str, Path], log_dir: Path, *flags: str) -> RunningServer:
    return start_nereid(
        [EXAMPLES],
        f"--grpc-server-cert={certificates['server_cert']}",
        f"--grpc-server-key={certificates['server_key']}",
        *flags,
        log_dir=log_dir,
    )


def _simple_infer(client: grpcclient.InferenceServerClient) -> np.ndarray:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    out = client.infer("simple", inputs).as_numpy("OUTPUT0")
    assert out is not None
    return out


def test_grpc_over_tls_serves_clients_that_trust_the_certificate(
    certificates: dict[str, Path], tmp_path: Path
) -> None:
    running = _tls_server(certificates, tmp_path, "--grpc-use-ssl=true")
    try:
        with grpcclient.InferenceServerClient(running.grpc_url, ssl=True, root_certificates=str(certificates["ca"])) as client:
            np.testing.assert_array_equal(_simple_infer(client), 2 * np.arange(16).reshape(1, 16))
        with grpcclient.InferenceServerClient(running.grpc_url) as plain:
            with pytest.raises(InferenceServerException):
                plain.is_server_live(client_timeout=5)
    finally:
        assert running.stop() == 0, running.log()


def test_mutual_tls_refuses_a_client_without_a_certificate(certificates: dict[str, Path], tmp_path: Path) -> None:
    running = _tls_server(certificates, tmp_path, "--grpc-use-ssl-mutual=true", f"--grpc-root-cert={certificates['ca']}")
    try:
        with grpcclient.InferenceServerClient(
            running.grpc_url,
            ssl=True,
            root_certificates=str(certificates["ca"]),
            private_key=str(certificates["client_key"]),
            certificate_chain=str(certificates["client_cert"]),
        ) as client:
            assert client.is_server_live()
            np.testing.assert_array_equal(_simple_infer(client), 2 * np.arange(16).reshape(1, 16))
        with grpcclient.InferenceServerClient(running.grpc_url, ssl=True, root_certificates=str(certificates["ca"])) as anonymous:
            with pytest.raises(InferenceServerException):
                anonymous.is_server_live(client_timeout=5)
    finally:
        assert running.stop() == 0, running.log()


def test_large_messages_on_a_stream_arrive_whole_and_in_order(server: RunningServer) -> None:
    """ModelStreamInfer requests of 4 MiB each span many DATA frames; each is answered intact, by its id."""
    answers: queue.Queue[object] = queue.Queue()
    sent = {str(i): np.full((1, 1024 * 1024), float(i), dtype=np.float32) for i in range(3)}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for request_id, data in sent.items():
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            client.async_stream_infer(echo_model("FP32"), [tensor], request_id=request_id)
        received = {}
        for _ in sent:
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            received[result.get_response().id] = result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
        client.stop_stream()
    assert received.keys() == sent.keys()
    for request_id, data in sent.items():
        np.testing.assert_array_equal(received[request_id], data)
