"""The metrics port and --openai-port hold the same HTTP limits as the inference port (they run on the same
transport): bodies over --http-max-input-size, oversized headers, slow headers and --http-max-connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.servers import RunningServer, free_port, start_nereid


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("empty_repository")
    openai_port = free_port()
    running = start_nereid(
        [repository],
        f"--openai-port={openai_port}",
        "--openai-address=127.0.0.1",
        "--http-max-input-size=4096",
        "--http-max-header-size=2048",
        "--http-header-timeout-secs=1",
        "--http-max-connections=4",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    running.extra["openai_port"] = str(openai_port)
    yield running
    assert running.stop() == 0, running.log()


def _ports(server: RunningServer) -> dict[str, int]:
    return {"metrics": server.metrics_port, "openai": int(server.extra["openai_port"])}


def _exchange(port: int, request: bytes, timeout: float = 20) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("port_name", ["metrics", "openai"])
def test_a_body_over_the_input_limit_is_refused_before_it_is_read(server: RunningServer, port_name: str) -> None:
    port = _ports(server)[port_name]
    answer = _exchange(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"--http-max-input-size" in answer


@pytest.mark.parametrize("port_name", ["metrics", "openai"])
def test_oversized_headers_are_refused(server: RunningServer, port_name: str) -> None:
    port = _ports(server)[port_name]
    answer = _exchange(port, b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("port_name", ["metrics", "openai"])
def test_slow_headers_time_out(server: RunningServer, port_name: str) -> None:
    port = _ports(server)[port_name]
    started = time.monotonic()
    answer = _exchange(port, b"GET /metrics HTTP/1.1\r\nhost: x\r\n")  # the blank line never comes
    assert answer.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 15


def test_the_metrics_port_bounds_its_connections_and_keeps_serving(server: RunningServer) -> None:
    port = server.metrics_port
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]  # twice the limit
    try:
        # The idle ones were closed for the newer ones; a scrape still gets through.
        answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=20)
        assert answer.status_code == 200 and "nv_" in answer.text
        closed = 0
        for sock in held:
            sock.settimeout(10)
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, OSError):
                pass
        assert closed >= 4
    finally:
        for sock in held:
            sock.close()
    assert requests.get(f"http://127.0.0.1:{_ports(server)['openai']}/v1/models", timeout=20).status_code == 200
