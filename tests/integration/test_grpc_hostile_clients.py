"""The gRPC port's HTTP/2 transport against a hostile client (the `h2` library, and raw frames where h2 itself
would refuse to misbehave): concurrent-stream and header-list limits, CONTINUATION floods, flow-control
overflow, rapid reset, SETTINGS/PING floods, and gRPC's message size limits. The server serves on after each."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
import tritonclient.grpc as grpcclient
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame

from nereid.core.admission import InflightLimit
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import ServerSettings, TransportLimits
from nereid.frontends.grpc.transport import GrpcServer
from tests.servers import RunningServer, free_port, start_nereid

ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, REFUSED_STREAM = 11, 3, 7
_LIVE = "/inference.GRPCInferenceService/ServerLive"
_METADATA = "/inference.GRPCInferenceService/ServerMetadata"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("empty_repository")
    running = start_nereid(
        [repository],
        "--grpc-max-concurrent-streams=8",
        "--grpc-max-header-list-size=16384",
        "--grpc-max-receive-message-size=1048576",
        "--grpc-max-send-message-size=100",
        "--grpc-max-reset-streams=50",
        "--grpc-max-control-frames=200",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield running
    assert running.stop() == 0, running.log()


class _Client:
    """An h2 client connection on a raw socket; `raw` writes frames h2 would refuse to send."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        try:
            self.sock.sendall(self.h2.data_to_send())
        except OSError:
            pass  # closed by the server: what it said is read next

    def raw(self, *frames: Any) -> None:
        try:
            self.sock.sendall(b"".join(f.serialize() for f in frames))
        except OSError:
            pass  # the server may already have closed the connection: what it said is read next

    def headers(self, stream_id: int, path: str) -> list[tuple[bytes, bytes]]:
        return [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]

    def events(self, until: type, timeout: float = 20) -> list[Any]:
        """Read until an event of type `until` (or the connection closes); all the events seen."""
        seen: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            try:
                new = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                break
            seen += new
            self.flush()
            if any(isinstance(event, until) for event in new):
                return seen
        return seen

    def close(self) -> None:
        self.sock.close()


def _goaway(events: list[Any]) -> h2.events.ConnectionTerminated:
    (goaway,) = [event for event in events if isinstance(event, h2.events.ConnectionTerminated)]
    return goaway


def _still_serving(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live()


def test_the_limits_are_advertised_in_settings(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    events = client.events(h2.events.RemoteSettingsChanged)
    (changed,) = [event for event in events if isinstance(event, h2.events.RemoteSettingsChanged)]
    settings = {key: value.new_value for key, value in changed.changed_settings.items()}
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 8
    assert settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == 16384
    client.close()


def test_streams_over_max_concurrent_streams_are_refused(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    # Sent before h2 has read the server's SETTINGS, so h2 does not hold the ninth back itself.
    for n in range(9):
        client.h2.send_headers(2 * n + 1, client.headers(2 * n + 1, _LIVE))  # never half-closed: they stay open
    client.flush()
    events = client.events(h2.events.StreamReset)
    (reset,) = [event for event in events if isinstance(event, h2.events.StreamReset)]
    assert (reset.stream_id, reset.error_code) == (17, REFUSED_STREAM)
    client.close()
    _still_serving(server)


def test_a_continuation_flood_is_cut_off_at_the_header_list_size(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    client.raw(HeadersFrame(1, data=b"\x00\x01a\x01b"))  # no END_HEADERS
    sent = 0
    for _ in range(256):  # up to 4 MiB of CONTINUATION, never END_HEADERS
        client.raw(ContinuationFrame(1, data=b"\x00\x01a" + b"\x7f" * 16381))
        sent += 16384
    goaway = _goaway(client.events(h2.events.ConnectionTerminated))
    assert goaway.error_code == ENHANCE_YOUR_CALM and b"MAX_HEADER_LIST_SIZE" in (goaway.additional_data or b"")
    client.close()
    _still_serving(server)


def test_a_window_update_past_2_31_is_a_flow_control_error(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    client.raw(WindowUpdateFrame(0, window_increment=2**31 - 1))
    assert _goaway(client.events(h2.events.ConnectionTerminated)).error_code == FLOW_CONTROL_ERROR
    client.close()
    # On a stream: that stream is reset, the connection lives.
    client = _Client(server.grpc_port)
    client.h2.send_headers(1, client.headers(1, _LIVE))
    client.flush()
    client.raw(WindowUpdateFrame(1, window_increment=2**31 - 1))
    events = client.events(h2.events.StreamReset)
    (reset,) = [event for event in events if isinstance(event, h2.events.StreamReset)]
    assert reset.error_code == FLOW_CONTROL_ERROR
    client.h2.send_headers(3, client.headers(3, _LIVE))
    client.h2.send_data(3, b"\x00\x00\x00\x00\x00", end_stream=True)
    client.flush()
    events = client.events(h2.events.StreamEnded)
    trailers = [dict(e.headers) for e in events if isinstance(e, (h2.events.TrailersReceived, h2.events.ResponseReceived))]
    assert {b"grpc-status": b"0"}.items() <= trailers[-1].items()
    client.close()


def test_rapid_reset_gets_goaway(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    for n in range(200):
        stream_id = 2 * n + 1
        try:
            client.h2.send_headers(stream_id, client.headers(stream_id, _LIVE))
            client.h2.reset_stream(stream_id)
        except h2.exceptions.ProtocolError:
            break  # h2 saw the GOAWAY
        client.flush()
    goaway = _goaway(client.events(h2.events.ConnectionTerminated))
    assert goaway.error_code == ENHANCE_YOUR_CALM and b"rapid reset" in (goaway.additional_data or b"")
    client.close()
    _still_serving(server)


def test_settings_and_ping_floods_get_goaway(server: RunningServer) -> None:
    for flood in (SettingsFrame(0, settings={h2.settings.SettingCodes.ENABLE_PUSH: 0}), PingFrame(0, opaque_data=b"12345678")):
        client = _Client(server.grpc_port)
        client.raw(*([flood] * 2000))
        assert _goaway(client.events(h2.events.ConnectionTerminated)).error_code == ENHANCE_YOUR_CALM
        client.close()
    _still_serving(server)


@pytest.mark.parametrize("path", [_LIVE, "/inference.GRPCInferenceService/ModelStreamInfer"])
def test_a_declared_message_over_the_receive_limit_is_resource_exhausted_before_it_is_buffered(
    server: RunningServer, path: str
) -> None:
    client = _Client(server.grpc_port)
    client.h2.send_headers(1, client.headers(1, path))
    # A 2 GiB message declared, 60 kB of it sent: the answer comes without waiting for the rest.
    message = b"\x00" + (2**31).to_bytes(4, "big") + b"\x00" * 60000
    for start in range(0, len(message), 16384):
        client.h2.send_data(1, message[start : start + 16384])
    client.flush()
    events = client.events(h2.events.StreamEnded)
    blocks = [dict(e.headers) for e in events if isinstance(e, (h2.events.TrailersReceived, h2.events.ResponseReceived))]
    assert blocks and blocks[-1][b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
    assert b"Received message larger than max (2147483648 vs. 1048576)" in blocks[-1][b"grpc-message"]
    client.close()
    _still_serving(server)


def test_a_response_over_the_send_limit_is_resource_exhausted(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(Exception) as excinfo:
            client.get_server_metadata()  # more than the 100 bytes allowed
        assert "RESOURCE_EXHAUSTED" in str(excinfo.value) and "Sent message larger than max" in str(excinfo.value)
        assert client.is_server_live()


def test_empty_data_frames_flood_gets_goaway(server: RunningServer) -> None:
    client = _Client(server.grpc_port)
    client.h2.send_headers(1, client.headers(1, _LIVE))
    client.flush()
    client.raw(*([DataFrame(1, data=b"")] * 2000))
    assert _goaway(client.events(h2.events.ConnectionTerminated)).error_code == ENHANCE_YOUR_CALM
    client.close()
    _still_serving(server)


def test_connections_past_the_limit_are_closed_unread() -> None:
    async def body() -> None:
        limits = TransportLimits(grpc_max_connections=2)
        fake = SimpleNamespace(
            settings=ServerSettings(limits=limits), inflight=InflightLimit(1), live=True, tracer=SimpleNamespace(enabled=False),
            request_memory=RequestMemoryBudget(0),
        )
        grpc_server = GrpcServer(fake)  # type: ignore[arg-type]
        port = free_port()
        await grpc_server.start("127.0.0.1", port)
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            for reader, _ in held:
                assert await asyncio.wait_for(reader.read(9), 10)  # our SETTINGS: served
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_h2_preface())
            assert await asyncio.wait_for(reader.read(), 10) == b""  # the third: closed, nothing read or sent
            assert grpc_server.connections_refused == 1 and len(grpc_server.connections) == 2
            writer.close()
            held[0][1].close()
            deadline = time.monotonic() + 10
            while len(grpc_server.connections) > 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # room again
            assert await asyncio.wait_for(reader.read(9), 10)
            writer.close()
            held[1][1].close()
        finally:
            await grpc_server.stop(0)

    asyncio.run(body())


def _h2_preface() -> bytes:
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    return connection.data_to_send()
