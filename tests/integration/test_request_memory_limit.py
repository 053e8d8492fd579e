"""--request-memory-limit on a real server (issue 38): eight clients at once declare a 1 GiB gRPC message or HTTP body
and send 256 MiB of it. With the limit at 512 MiB each is refused before its bytes are buffered (RESOURCE_EXHAUSTED
/ 503 naming the limit), the server's process tree never grows past the limit plus a small margin, and normal
inference through the official clients keeps succeeding throughout."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections.abc import Iterator

import pytest
import requests

from tests.request_memory_probes import MiB, RssWatcher, Traffic, grpc_probe, http_probe, run_probes
from tests.servers import ROOT, RunningServer, start_nereid

LIMIT = 512 * MiB
MARGIN = 64 * MiB  # allocator slack, the read buffers of 16 connections, the normal requests' own memory
PROBES, DECLARED, SENT = 8, 1024 * MiB, 256 * MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("request_memory")
    shutil.copytree(ROOT / "tests" / "models" / "python" / "add_sub", repository / "add_sub")
    # A body limit above the probes' 1 GiB, so that the request memory limit is what refuses them.
    running = start_nereid(repository, "--request-memory-limit=512MiB", "--http-max-input-size=2147483648",
                           log_dir=tmp_path_factory.mktemp("logs"))  # fmt: skip
    yield running
    assert running.stop() == 0, running.log()


def _warm(traffic_url: str, protocol: str) -> None:
    """A few requests first, so that the clients' and the model's first-call allocations are in the baseline."""
    with Traffic(traffic_url, protocol) as warm:
        while len(warm.latencies) < 20 and not warm.errors:
            time.sleep(0.01)
    assert not warm.errors, warm.errors


def test_grpc_messages_past_the_request_memory_limit_are_refused_and_the_server_stays_within_it(
    server: RunningServer,
) -> None:
    _warm(server.grpc_url, "grpc")
    with RssWatcher(server.process.pid) as rss, Traffic(server.grpc_url, "grpc") as traffic:
        results, seconds = run_probes(grpc_probe, server.grpc_port, PROBES, DECLARED, SENT)
        done_during_probes = len(traffic.latencies)
    for result in results:
        assert not result.errors, result.errors
        assert result.status == "8", (result, server.log()[-3000:])  # RESOURCE_EXHAUSTED
        assert result.message.startswith("request memory limit of 512 MiB reached: this request needs 2.0 GiB")
    assert rss.growth < LIMIT + MARGIN, f"grew {rss.growth / MiB:.0f} MiB"
    assert not traffic.errors, traffic.errors[:3]
    assert done_during_probes >= 3, f"{done_during_probes} normal requests in {seconds:.1f} s of probing"
    print(f"\ngRPC probes: {seconds:.1f} s, RSS growth {rss.growth / MiB:.1f} MiB, {len(traffic.latencies)} normal "
          f"requests, p99 {traffic.p99_ms():.1f} ms")  # fmt: skip


def test_http_bodies_past_the_request_memory_limit_are_refused_and_the_server_stays_within_it(
    server: RunningServer,
) -> None:
    _warm(server.http_url, "http")
    with RssWatcher(server.process.pid) as rss, Traffic(server.http_url, "http") as traffic:
        results, seconds = run_probes(http_probe, server.http_port, PROBES, DECLARED, SENT)
        done_during_probes = len(traffic.latencies)
    for result in results:
        assert not result.errors, result.errors
        assert result.status == "503", (result, server.log()[-3000:])
        error = json.loads(result.message)["error"]
        assert error.startswith("request memory limit of 512 MiB reached: this request needs 3 GiB")
    assert rss.growth < LIMIT + MARGIN, f"grew {rss.growth / MiB:.0f} MiB"
    assert not traffic.errors, traffic.errors[:3]
    assert done_during_probes >= 3, f"{done_during_probes} normal requests in {seconds:.1f} s of probing"
    print(f"\nHTTP probes: {seconds:.1f} s, RSS growth {rss.growth / MiB:.1f} MiB, {len(traffic.latencies)} normal "
          f"requests, p99 {traffic.p99_ms():.1f} ms")  # fmt: skip


def test_a_compressed_body_counts_what_it_inflates_into(server: RunningServer) -> None:
    url = f"{server.base}/v2/models/add_sub/infer"
    bomb = gzip.compress(bytes(200 * MiB), compresslevel=1)  # 200 MiB of JSON-to-be in a few hundred KiB
    answer = requests.post(url, data=bomb, headers={"Content-Encoding": "gzip"}, timeout=60)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"].startswith("request memory limit of 512 MiB reached: this request needs 600 MiB")
    body = json.dumps({"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                                  for name in ("INPUT0", "INPUT1")]}).encode()  # fmt: skip
    answer = requests.post(url, data=gzip.compress(body), headers={"Content-Encoding": "gzip"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.parametrize(("protocol", "admitted"), [("grpc", 2), ("http", 1)])
def test_admitted_requests_hold_their_bytes_within_the_limit_and_give_them_back_when_their_clients_leave(
    server: RunningServer, protocol: str, admitted: int
) -> None:
    # Eight clients declare 100 MiB each and send 96 MiB of it, never finishing. A gRPC message reserves twice its
    # size (200 MiB) and a JSON body three times (300 MiB): of the 448 MiB that large requests may hold, two messages
    # or one body fit. Those hold their bytes; the rest are refused. A second round admits as many again: the first
    # round's bytes were given back when its clients closed their connections.
    probe, port = (grpc_probe, server.grpc_port) if protocol == "grpc" else (http_probe, server.http_port)
    refused = "8" if protocol == "grpc" else "503"
    _warm(server.grpc_url if protocol == "grpc" else server.http_url, protocol)
    with RssWatcher(server.process.pid) as rss:
        for _ in range(2):
            results, _ = run_probes(probe, port, PROBES, 100 * MiB, 96 * MiB, answer_timeout=2)
            assert all(not result.errors for result in results), [result.errors for result in results]
            statuses = sorted(result.status for result in results)
            assert statuses == [""] * admitted + [refused] * (PROBES - admitted), (statuses, server.log()[-3000:])
            held = "requests in progress hold " + ("400.0 MiB" if protocol == "grpc" else "300 MiB")
            assert all(held in result.message for result in results if result.status)
    assert rss.growth < LIMIT + MARGIN, f"grew {rss.growth / MiB:.0f} MiB"
    print(f"\n{protocol}: {admitted} admitted per round, RSS growth {rss.growth / MiB:.1f} MiB")
