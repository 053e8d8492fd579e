"""`run_perf` end to end against a scripted v2 server in this process: sequence models get unique ids with
START first and END last, failing requests stop the run with the server's message, and the tool never
imports the server's internals."""

from __future__ import annotations

import ast
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from nereid.tools.perf import PerfConfig, PerfError, run_perf

PERF_PACKAGE = Path(__file__).resolve().parents[4] / "src" / "nereid" / "tools" / "perf"


@dataclass
class _Script:
    sequence: bool = False
    fail_after: int | None = None  # answer 400 from this request on
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: _Script

    def setup(self) -> None:
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go out separately

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        script = self.script
        if self.path == "/v2/health/live":
            self._reply(200, {})
        elif self.path == "/v2/models/acc":
            tensors = [{"name": "INPUT", "datatype": "INT32", "shape": [-1, 1]}]
            self._reply(200, {"name": "acc", "versions": ["1"], "platform": "python", "inputs": tensors, "outputs": tensors})
        elif self.path == "/v2/models/acc/config":
            config: dict[str, Any] = {"name": "acc", "max_batch_size": 4}
            if script.sequence:
                config["sequence_batching"] = {}
            self._reply(200, config)
        elif self.path == "/v2/models/acc/stats":
            with script.lock:
                count = len(script.requests)
            success = {"count": count, "ns": count * 1000}
            stats = {"success": success, "queue": success, "compute_infer": success}
            self._reply(200, {"model_stats": [{"name": "acc", "version": "1", "inference_count": count, "execution_count": count, "inference_stats": stats}]})
        else:
            self._reply(404, {"error": f"Request for unknown model: '{self.path}' is not found"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        header_length = int(self.headers.get("Inference-Header-Content-Length", len(body)))
        doc = json.loads(body[:header_length])
        script = self.script
        with script.lock:
            index = len(script.requests)
            failing = script.fail_after is not None and index >= script.fail_after
            if not failing:
                script.requests.append(doc)
        if failing:
            self._reply(400, {"error": "[model 'acc' version 1] input 'INPUT': expected INT32, got something else"})
        else:
            self._reply(200, {"model_name": "acc", "outputs": []})


@pytest.fixture
def fake_server() -> Iterator[tuple[str, _Script]]:
    script = _Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", script
    server.shutdown()
    server.server_close()


def _config(url: str, **kwargs: Any) -> PerfConfig:
    base: dict[str, Any] = {"url": url, "measurement_interval_ms": 150, "max_trials": 3, "stability_percentage": 500.0}
    base.update(kwargs)
    return PerfConfig("acc", **base)


def _sequences(requests: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by_id: dict[int, list[dict[str, Any]]] = {}
    for doc in requests:
        by_id.setdefault(doc["parameters"]["sequence_id"], []).append(doc["parameters"])
    return by_id


def test_sequence_model_gets_start_first_end_last_and_unique_ids(fake_server: tuple[str, _Script]) -> None:
    url, script = fake_server
    script.sequence = True
    (result,) = run_perf(_config(url, concurrency_range=(3, 3, 1), sequence_length=4, sequence_length_variation=0, workers=2))
    assert result.workers == 2 and result.completed_total == len(script.requests)
    sequences = _sequences(script.requests)
    finished = [steps for steps in sequences.values() if steps[-1].get("sequence_end")]
    assert len(finished) >= 3 and min(sequences) == 1
    for steps in finished:
        assert len(steps) == 4
        assert steps[0].get("sequence_start") is True and not any(s.get("sequence_start") for s in steps[1:])
        assert not any(s.get("sequence_end") for s in steps[:-1])
    # every sequence started once: at most 3 are open when the run stops
    assert sum(1 for steps in sequences.values() if not steps[-1].get("sequence_end")) <= 3


def test_sequence_lengths_come_from_the_data_streams(fake_server: tuple[str, _Script], tmp_path: Path) -> None:
    url, script = fake_server
    script.sequence = True
    data = tmp_path / "streams.json"
    data.write_text(json.dumps({"data": [[{"INPUT": [1]}, {"INPUT": [2]}], [{"INPUT": [7]}, {"INPUT": [8]}, {"INPUT": [9]}]]}))
    run_perf(_config(url, input_data=[str(data)], input_tensor_format="json"))
    sequences = _sequences(script.requests)
    values: dict[int, list[int]] = {}
    for doc in script.requests:
        values.setdefault(doc["parameters"]["sequence_id"], []).append(doc["inputs"][0]["data"][0])
    complete = [values[sid] for sid, steps in sequences.items() if steps[-1].get("sequence_end")]
    assert [1, 2] in complete and [7, 8, 9] in complete


def test_request_rate_sequences_interleave_live_sequences(fake_server: tuple[str, _Script]) -> None:
    url, script = fake_server
    script.sequence = True
    run_perf(_config(url, request_rate_range=(200.0, 200.0, 1.0), num_of_sequences=3, sequence_length=5, sequence_length_variation=0))
    sequences = _sequences(script.requests)
    ids_in_order = [doc["parameters"]["sequence_id"] for doc in script.requests[:9]]
    assert len(set(ids_in_order)) >= 3  # round-robin over (at least) three live sequences
    # one request at a time per sequence, so even over several connections START arrives first
    assert all(steps[0].get("sequence_start") for steps in sequences.values())
    assert all(len(steps) == 5 for steps in sequences.values() if steps[-1].get("sequence_end"))


def test_failing_requests_stop_the_run_with_the_servers_message(fake_server: tuple[str, _Script]) -> None:
    url, script = fake_server
    script.fail_after = 20
    with pytest.raises(PerfError, match=r"request\(s\) failed at concurrency 1: HTTP 400: \[model 'acc' version 1\] input 'INPUT'"):
        run_perf(_config(url))


def test_perf_never_imports_the_server_internals() -> None:
    forbidden = ("nereid.core", "nereid.scheduling", "nereid.backends", "nereid.frontends", "nereid.config", "nereid.repository")
    for path in PERF_PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
