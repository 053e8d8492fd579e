"""Triton's generate extension over HTTP (generate and generate_stream) on ordinary models."""

from __future__ import annotations

from pathlib import Path

import orjson
import requests

from tests.servers import RunningServer, start_nereid


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


_FAILING_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def test_generate_stream_whose_first_response_is_an_error_sends_it_as_an_event_under_400(tmp_path: Path) -> None:
    """As Triton 2.51 answers (asked, with L0_http's mock_llm failing at once): a 400 whose body is the SSE event."""
    model = tmp_path / "models" / "fails"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_FAILING_MODEL)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )
    server = start_nereid(model.parent, log_dir=tmp_path)
    try:
        reply = requests.post(f"{server.base}/v2/models/fails/generate_stream", json={"PROMPT": "hello"}, timeout=30)
        assert reply.status_code == 400
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert reply.text == 'data: {"error":"An Error Occurred"}\n\n'
    finally:
        server.stop()
