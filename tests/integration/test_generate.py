"""Triton's generate extension over HTTP (generate and generate_stream) on ordinary models."""

from __future__ import annotations

import orjson
import requests

from tests.servers import RunningServer


def test_generate_maps_json_keys_to_inputs_and_outputs_to_keys(example_server: RunningServer) -> None:
    reply = requests.post(
        f"{example_server.base}/v2/models/simple_string/generate", json={"INPUT0": ["hello", "world"], "id": "g1"}, timeout=10
    )
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"id": "g1", "model_name": "simple_string", "model_version": "1", "OUTPUT0": ["hello", "world"]}


def test_generate_stream_sends_server_sent_events(example_server: RunningServer) -> None:
    body = {"INPUT0": list(range(16)), "INPUT1": [1] * 16}
    with requests.post(f"{example_server.base}/v2/models/simple/generate_stream", json=body, stream=True, timeout=10) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert len(events) == 1 and events[0].startswith(b"data: ")
    payload = orjson.loads(events[0][len(b"data: ") :])
    assert payload["OUTPUT0"] == [i + 1 for i in range(16)]
    assert payload["OUTPUT1"] == [i - 1 for i in range(16)]


def test_generate_rejects_missing_inputs_and_unknown_models_with_triton_statuses(example_server: RunningServer) -> None:
    # A key that names no input is a request parameter (as in Triton); the inputs are then missing.
    reply = requests.post(f"{example_server.base}/v2/models/simple/generate", json={"BAD": 1}, timeout=10)
    assert reply.status_code == 400
    assert "expected 2 inputs but got 0 inputs for model 'simple'" in reply.json()["error"]
    reply = requests.post(f"{example_server.base}/v2/models/nope/generate_stream", json={"x": 1}, timeout=10)
    assert reply.status_code == 404
    assert reply.json()["error"] == "Request for unknown model: 'nope' is not found"
