"""tritonserver's gRPC flags on Nereid's HTTP/2 transport: restricted protocols, header forwarding, response
compression, SO_REUSEPORT, keepalive PINGs and their watchdog, ping policing and the maximum connection age.

What a client can see (status codes, messages, parameters, compressed bytes) is compared with real Triton 2.51
when it is here. The timed behaviours run against Nereid alone with short times, through a raw HTTP/2 client
that records every frame; they poll for what they expect and allow seconds where milliseconds would do."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hpack import Decoder, Encoder
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from nereid.core.admission import InflightLimit
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import ServerSettings
from nereid.frontends.grpc.transport import GrpcServer
from tests import reference_triton
from tests.integration.params_model import write_params_model
from tests.servers import RunningServer, free_port, start_nereid, start_real_triton

_DATA, _HEADERS, _RST, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_CATEGORIES = ["health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
               "trace", "logging"]  # fmt: skip
_SERVICE = "/inference.GRPCInferenceService/"


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + payload


class RawClient:
    """An HTTP/2 client that records every frame the server sends (headers decoded) and may leave PINGs
    unanswered."""

    def __init__(self, port: int, answer_pings: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.answer_pings = answer_pings
        self.frames: list[tuple[int, int, int, Any]] = []
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.next_stream = 1
        self.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(_SETTINGS, 0, 0))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data: bytes) -> None:
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed.set()
                return
            buffer += chunk
            while len(buffer) >= 9:
                high, low, kind, flags, stream_id = struct.unpack_from(">HBBBI", buffer)
                end = 9 + ((high << 8) | low)
                if len(buffer) < end:
                    break
                payload, buffer = buffer[9:end], buffer[end:]
                self._on_frame(kind, flags, stream_id, payload)

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        body: Any = payload
        if kind == _HEADERS:
            body = dict(self.decoder.decode(payload))
        elif kind == _SETTINGS and not flags & 1:
            self.send(_frame(_SETTINGS, 1, 0))
        elif kind == _PING and not flags & 1 and self.answer_pings:
            self.send(_frame(_PING, 1, 0, payload))
        self.frames.append((kind, flags, stream_id, body))

    def call(self, method: str, message: bytes | None = b"", metadata: list[tuple[str, str]] | None = None,
             accept: str = "identity,deflate,gzip") -> int:  # fmt: skip
        """Start a call; message None leaves the request stream open (a ModelStreamInfer that idles)."""
        stream_id, self.next_stream = self.next_stream, self.next_stream + 2
        headers = [(":method", "POST"), (":scheme", "http"), (":path", _SERVICE + method), (":authority", "test"),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-accept-encoding", accept)]  # fmt: skip
        out = _frame(_HEADERS, 0x4, stream_id, self.encoder.encode(headers + (metadata or [])))
        if message is not None:
            out += _frame(_DATA, 0x1, stream_id, b"\0" + len(message).to_bytes(4, "big") + message)
        self.send(out)
        return stream_id

    def ping(self, data: bytes) -> None:
        self.send(_frame(_PING, 0, 0, data))

    def of_kind(self, kind: int, flags: int | None = None) -> list[tuple[int, int, int, Any]]:
        return [f for f in list(self.frames) if f[0] == kind and (flags is None or f[1] == flags)]

    def on_stream(self, stream_id: int) -> list[tuple[int, int, int, Any]]:
        return [f for f in list(self.frames) if f[2] == stream_id]

    def goaways(self) -> list[tuple[int, int, bytes]]:
        return [(*struct.unpack_from(">II", p), p[8:]) for _, _, _, p in self.of_kind(_GOAWAY)]

    def status(self, stream_id: int) -> dict[str, str]:
        """The headers that ended the stream (trailers, or a trailers-only response)."""
        ends = [f[3] for f in self.on_stream(stream_id) if f[0] == _HEADERS and f[1] & 0x1]
        return ends[-1] if ends else {}


def _wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _params_repository(root: Path) -> Path:
    return write_params_model(root)


def _infer_request(size: int = 4, parameters: dict[str, str] | None = None) -> Any:
    request = pb.ModelInferRequest(model_name="params")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[size])
    request.raw_input_contents.append(np.zeros(size, dtype=np.float32).tobytes())
    for key, value in (parameters or {}).items():
        request.parameters[key].string_param = value
    return request


# -- restricted protocols, header forwarding, compression (compared with Triton when it is here) ---------------
_FLAGS = [f"--grpc-restricted-protocol={api}:k-{api}=v" for api in _CATEGORIES] + [
    "--grpc-header-forward-pattern=fwd",
    "--grpc-infer-response-compression-level=low",
]
_ALLOWED = [(f"triton-grpc-protocol-k-{api}", "v") for api in _CATEGORIES]


def _servers(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> Iterator[dict[str, RunningServer]]:
    repository = _params_repository(tmp_path_factory.mktemp("flags_repository"))
    running: dict[str, RunningServer] = {}
    try:
        running["nereid"] = start_nereid(repository, *flags, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
        if not reference_triton.opted_out():
            running["triton"] = start_real_triton(repository, *flags)
        yield running
    finally:
        for server in running.values():
            server.stop()


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    yield from _servers(tmp_path_factory, *_FLAGS)


def _each(servers: dict[str, RunningServer], ask: Callable[[RunningServer], Any]) -> Any:
    """Nereid's answer; also Triton's when it is here, which must be the same."""
    answers = {name: ask(server) for name, server in servers.items()}
    if "triton" in answers:
        assert answers["nereid"] == answers["triton"]
    return answers["nereid"]


def _rpc(server: RunningServer, method: str, request: Any, metadata: list[tuple[str, str]] | None = None) -> Any:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            if method == "ModelStreamInfer":
                list(stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=30))
            else:
                getattr(stub, method)(request, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            return error.code(), error.details()
        return grpc.StatusCode.OK, None


def _call_with(method: str, request: Any, server: RunningServer) -> Any:
    return _rpc(server, method, request)


def test_each_method_of_a_restricted_category_needs_its_header(flagged: dict[str, RunningServer]) -> None:
    expected = {"ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "ServerMetadata": "metadata",
                "ModelMetadata": "metadata", "ModelInfer": "inference", "ModelStreamInfer": "inference",
                "ModelConfig": "model-config", "ModelStatistics": "statistics", "TraceSetting": "trace",
                "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
                "RepositoryModelUnload": "model-repository", "LogSettings": "logging"}  # fmt: skip
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        category = expected.get(method.name, "shared-memory" if "SharedMemory" in method.name else "?")
        request = getattr(pb, method.input_type.name)()
        code, details = _each(flagged, functools.partial(_call_with, method.name, request))
        assert code == grpc.StatusCode.UNAVAILABLE, method.name
        assert details == f"This protocol is restricted, expecting header 'triton-grpc-protocol-k-{category}'"


def test_the_right_header_value_lets_a_call_through_and_a_wrong_one_does_not(flagged: dict[str, RunningServer]) -> None:
    live = pb.ServerLiveRequest()
    assert (
        _each(flagged, lambda s: _rpc(s, "ServerLive", live, [("triton-grpc-protocol-k-health", "v")]))[0]
        == grpc.StatusCode.OK
    )
    wrong = _each(flagged, lambda s: _rpc(s, "ServerLive", live, [("triton-grpc-protocol-k-health", "w")]))
    assert wrong[0] == grpc.StatusCode.UNAVAILABLE
    # The bare key is not the header: tritonserver prefixes it.
    assert _each(flagged, lambda s: _rpc(s, "ServerLive", live, [("k-health", "v")]))[0] == grpc.StatusCode.UNAVAILABLE


def test_the_grpc_health_service_is_in_the_health_category(flagged: dict[str, RunningServer]) -> None:
    def check(server: RunningServer, metadata: list[tuple[str, str]]) -> Any:
        with grpc.insecure_channel(server.grpc_url) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), metadata=metadata)
            except grpc.RpcError as error:
                return error.code(), error.details()
            return reply.status

    refused = _each(flagged, lambda s: check(s, []))
    assert refused == (
        grpc.StatusCode.UNAVAILABLE,
        "This protocol is restricted, expecting header 'triton-grpc-protocol-k-health'",
    )
    assert (
        _each(flagged, lambda s: check(s, [("triton-grpc-protocol-k-health", "v")]))
        == health_pb2.HealthCheckResponse.SERVING
    )


def _parameters_seen(
    server: RunningServer, metadata: list[tuple[str, Any]], parameters: dict[str, str] | None = None
) -> dict[str, str]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            _infer_request(parameters=parameters), metadata=_ALLOWED + metadata, timeout=60
        )
    return dict(json.loads(reply.raw_output_contents[0][4:]))


def test_metadata_whose_key_contains_a_match_becomes_a_string_parameter(flagged: dict[str, RunningServer]) -> None:
    metadata = [
        ("fwd-a", "1"),
        ("x-fwd-b", "2"),
        ("other", "3"),
        ("fwd-bin", b"xx\x01"),
        ("fwd-dup", "a"),
        ("fwd-dup", "b"),
    ]
    seen = _each(flagged, lambda server: _parameters_seen(server, metadata))
    # Matched anywhere in the key; binary values decoded; of a repeated key, the last (Triton passes both).
    assert seen == {"fwd-a": "1", "x-fwd-b": "2", "fwd-bin": "xx\x01", "fwd-dup": "b"}


def test_a_forwarded_header_wins_over_a_message_parameter_of_the_same_name(flagged: dict[str, RunningServer]) -> None:
    # Triton keeps both under one name, the message's first; read as JSON, the header's value is what remains.
    seen = _each(
        flagged, lambda server: _parameters_seen(server, [("fwd-a", "header")], {"fwd-a": "message", "m": "x"})
    )
    assert seen == {"fwd-a": "header", "m": "x"}


def test_stream_infer_requests_get_the_forwarded_headers(flagged: dict[str, RunningServer]) -> None:
    def streamed(server: RunningServer) -> list[dict[str, str]]:
        with grpc.insecure_channel(server.grpc_url) as channel:
            replies = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
                iter([_infer_request(), _infer_request()]), metadata=_ALLOWED + [("fwd-s", "9")], timeout=60
            )
            return [json.loads(reply.infer_response.raw_output_contents[0][4:]) for reply in replies]

    assert _each(flagged, streamed) == [{"fwd-s": "9"}, {"fwd-s": "9"}]


def _raw_infer(
    server: RunningServer, accept: str, size: int, method: str = "ModelInfer"
) -> tuple[dict[str, str], bytes]:
    client = RawClient(server.grpc_port)
    try:
        message = (_infer_request(size) if method == "ModelInfer" else pb.ServerLiveRequest()).SerializeToString()
        stream = client.call(method, message, _ALLOWED, accept=accept)
        _wait_for(lambda: client.status(stream), what="the call's trailers")
        headers = next(f[3] for f in client.on_stream(stream) if f[0] == _HEADERS)
        body = b"".join(f[3] for f in client.on_stream(stream) if f[0] == _DATA)
        return {k: v for k, v in headers.items() if k == "grpc-encoding"}, body
    finally:
        client.close()


@pytest.mark.parametrize(
    ("accept", "size", "encoding", "flag"),
    [
        ("identity,deflate,gzip", 1000, "gzip", 1),  # low prefers gzip
        ("identity,deflate", 1000, "deflate", 1),
        ("identity", 1000, None, 0),  # nothing the client can read: not compressed
        ("identity,deflate,gzip", 1, "gzip", 0),  # compressing would not make it smaller: flag 0
    ],
)
def test_infer_responses_are_compressed_as_the_client_accepts(
    flagged: dict[str, RunningServer], accept: str, size: int, encoding: str | None, flag: int
) -> None:
    headers, body = _each(flagged, lambda server: _raw_infer(server, accept, size))
    assert headers.get("grpc-encoding") == encoding
    assert body[0] == flag and len(body) == 5 + int.from_bytes(body[1:5], "big")
    if flag:
        message = zlib.decompress(body[5:], 31 if encoding == "gzip" else 15)
        reply = pb.ModelInferResponse.FromString(message)
        assert np.frombuffer(reply.raw_output_contents[1], np.float32).tolist() == [0.0] * size


def test_other_methods_are_not_compressed(flagged: dict[str, RunningServer]) -> None:
    headers, body = _each(flagged, lambda server: _raw_infer(server, "identity,deflate,gzip", 0, "ServerLive"))
    assert headers == {} and body[0] == 0


def test_the_official_client_reads_compressed_responses(flagged: dict[str, RunningServer]) -> None:
    client = grpcclient.InferenceServerClient(flagged["nereid"].grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1000], "FP32")
    tensor.set_data_from_numpy(np.arange(1000, dtype=np.float32))
    result = client.infer("params", [tensor], headers=dict(_ALLOWED))
    assert np.array_equal(result.as_numpy("OUTPUT1"), np.arange(1000, dtype=np.float32))
    client.close()


@pytest.mark.parametrize("level", ["medium", "high"])
def test_medium_and_high_prefer_deflate(tmp_path_factory: pytest.TempPathFactory, level: str) -> None:
    for servers in _servers(tmp_path_factory, f"--grpc-infer-response-compression-level={level}"):
        assert _each(servers, lambda s: _raw_infer(s, "identity,deflate,gzip", 1000)[0]) == {"grpc-encoding": "deflate"}
        assert _each(servers, lambda s: _raw_infer(s, "identity,gzip", 1000)[0]) == {"grpc-encoding": "gzip"}


# -- SO_REUSEPORT ------------------------------------------------------------------------------------------------
def _listen_twice(reuse: bool) -> None:
    async def body() -> None:
        fake = SimpleNamespace(settings=ServerSettings(reuse_grpc_port=reuse), tracer=SimpleNamespace(enabled=False),
                               inflight=InflightLimit(1), request_memory=RequestMemoryBudget(0))  # fmt: skip
        first, second = GrpcServer(fake), GrpcServer(fake)  # type: ignore[arg-type]
        port = free_port()
        await first.start("127.0.0.1", port)
        try:
            await second.start("127.0.0.1", port)
            await second.stop(0)
        finally:
            await first.stop(0)

    asyncio.run(body())


def test_reuse_grpc_port_lets_two_servers_listen_on_one_port() -> None:
    _listen_twice(reuse=True)
    with pytest.raises(OSError):
        _listen_twice(reuse=False)


# -- keepalive and ping policing (Nereid only, short times) -------------------------------------------------------
@pytest.fixture(scope="module")
def keepalive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = _params_repository(tmp_path_factory.mktemp("keepalive_repository"))
    flags = [
        "--grpc-keepalive-time=300",
        "--grpc-keepalive-timeout=600",
        "--grpc-http2-min-recv-ping-interval-without-data=5000",
    ]
    running = start_nereid(repository, *flags, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def test_keepalive_pings_a_connection_with_calls_and_keeps_it_while_answered(keepalive: RunningServer) -> None:
    client = RawClient(keepalive.grpc_port)
    try:
        client.call("ModelStreamInfer", None)  # an open call, idle
        _wait_for(lambda: len(client.of_kind(_PING, 0)) >= 3, what="three keepalive PINGs")
        assert not client.closed.is_set() and not client.goaways()
    finally:
        client.close()


def test_keepalive_does_not_ping_a_connection_without_calls(keepalive: RunningServer) -> None:
    client = RawClient(keepalive.grpc_port)
    try:
        time.sleep(1.5)  # five keepalive times
        assert client.of_kind(_PING, 0) == [] and not client.closed.is_set()
    finally:
        client.close()


def test_an_unanswered_keepalive_ping_fails_the_calls_and_closes_the_connection(keepalive: RunningServer) -> None:
    client = RawClient(keepalive.grpc_port, answer_pings=False)
    try:
        stream = client.call("ModelStreamInfer", None)
        _wait_for(client.closed.is_set, what="the connection to close")
        assert client.of_kind(_PING, 0)
        assert client.status(stream) == {":status": "200", "content-type": "application/grpc", "grpc-status": "14",
                                         "grpc-message": "keepalive watchdog timeout"}  # fmt: skip
    finally:
        client.close()


def test_a_client_pinging_too_often_gets_goaway_enhance_your_calm(keepalive: RunningServer) -> None:
    client = RawClient(keepalive.grpc_port)
    try:
        for n in range(6):  # the 4th is over the 2 strikes allowed
            if client.closed.is_set():
                break
            client.ping(bytes([n]) * 8)
            time.sleep(0.05)
        _wait_for(client.closed.is_set, what="the connection to close")
        assert client.goaways() == [(0, 11, b"too_many_pings")]
        assert len(client.of_kind(_PING, 1)) == 4
    finally:
        client.close()


def test_pings_with_calls_in_between_are_not_strikes(keepalive: RunningServer) -> None:
    client = RawClient(keepalive.grpc_port)
    try:
        for n in range(6):
            stream = client.call("ServerLive", pb.ServerLiveRequest().SerializeToString())
            _wait_for(functools.partial(client.status, stream), what="the call to end")
            client.ping(bytes([n]) * 8)
        _wait_for(lambda: len(client.of_kind(_PING, 1)) == 6, what="six PING ACKs")
        assert not client.goaways() and not client.closed.is_set()
    finally:
        client.close()


# -- maximum connection age -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = _params_repository(tmp_path_factory.mktemp("age_repository"))
    flags = ["--grpc-max-connection-age=300", "--grpc-max-connection-age-grace=1500"]
    running = start_nereid(repository, *flags, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def test_an_idle_connection_past_its_age_gets_goaway_and_closes(aging: RunningServer) -> None:
    client = RawClient(aging.grpc_port)
    try:
        _wait_for(client.closed.is_set, what="the connection to close")
        # First a GOAWAY that still admits streams on their way, with a PING; after its ACK, the final one.
        assert client.goaways() == [(2**31 - 1, 0, b""), (0, 0, b"")]
    finally:
        client.close()


def test_calls_running_at_the_age_may_finish_until_the_grace_period_ends(aging: RunningServer) -> None:
    client = RawClient(aging.grpc_port)
    try:
        stream = client.call("ModelStreamInfer", None)
        _wait_for(lambda: len(client.goaways()) == 2, what="the final GOAWAY")
        assert client.goaways()[-1] == (stream, 0, b"")
        assert not client.closed.is_set()  # the call still runs
        _wait_for(client.closed.is_set, what="the grace period to end")
        assert client.status(stream)["grpc-status"] == "14"
    finally:
        client.close()


def test_a_grpc_client_keeps_working_across_connection_ages(aging: RunningServer) -> None:
    with grpc.insecure_channel(aging.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        deadline = time.monotonic() + 2.0  # several ages: the channel reconnects each time
        calls = 0
        while time.monotonic() < deadline:
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30, wait_for_ready=True).live
            calls += 1
            time.sleep(0.02)
        assert calls > 10
