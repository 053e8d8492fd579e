"""The Prometheus endpoint: Triton's metric names and labels, values that agree with the statistics
endpoint, summary latencies on request, and the flags that switch metrics off."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.conftest import EXAMPLES, WITHOUT_LLM
from tests.servers import RunningServer, start_nereid


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(
        EXAMPLES, "--metrics-config=summary_latencies=true", log_dir=tmp_path_factory.mktemp("logs")
    )
    yield running
    running.stop()


def _metrics(server: RunningServer) -> str:
    return requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text


def _value(text: str, name: str, model: str, extra: str = "") -> float:
    match = re.search(rf'^{name}{{{extra}model="{model}",version="1"}} (\S+)$', text, re.M)
    if match is None:
        match = re.search(rf'^{name}{{model="{model}",{extra}version="1"}} (\S+)$', text, re.M)
    assert match is not None, f"{name} for {model} missing"
    return float(match.group(1))


def _infer_simple(server: RunningServer, count: int) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(count):
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        client.infer("simple", inputs)
    client.close()


def test_request_counters_and_durations_agree_with_statistics(server: RunningServer) -> None:
    _infer_simple(server, 5)
    stats = requests.get(f"{server.base}/v2/models/simple/stats", timeout=5).json()["model_stats"][0]
    text = _metrics(server)
    inference = stats["inference_stats"]
    assert _value(text, "nv_inference_request_success", "simple") == inference["success"]["count"] == 5
    assert _value(text, "nv_inference_count", "simple") == stats["inference_count"]
    assert _value(text, "nv_inference_exec_count", "simple") == stats["execution_count"]
    assert _value(text, "nv_inference_request_duration_us", "simple") == inference["success"]["ns"] // 1000
    assert _value(text, "nv_inference_queue_duration_us", "simple") == inference["queue"]["ns"] // 1000
    assert _value(text, "nv_inference_compute_infer_duration_us", "simple") == inference["compute_infer"]["ns"] // 1000
    assert _value(text, "nv_inference_pending_request_count", "simple") == 0
    assert _value(text, "nv_inference_request_failure", "simple", 'reason="BACKEND",') == 0
    assert "# TYPE nv_inference_request_success counter" in text
    assert _value(text, "nv_model_load_duration_secs", "simple") > 0


def test_success_counter_moves_with_each_request(server: RunningServer) -> None:
    before = _value(_metrics(server), "nv_inference_request_success", "simple")
    _infer_simple(server, 1)
    assert _value(_metrics(server), "nv_inference_request_success", "simple") == before + 1


def test_summary_latencies_report_quantiles_count_and_sum(server: RunningServer) -> None:
    _infer_simple(server, 3)
    text = _metrics(server)
    assert "# TYPE nv_inference_request_summary_us summary" in text
    for quantile in ("0.5", "0.9", "0.95", "0.99"):
        assert re.search(rf'nv_inference_request_summary_us{{model="simple",quantile="{quantile}",version="1"}} [\d.e+]+', text)
    count = float(re.search(r'nv_inference_request_summary_us_count{model="simple",version="1"} (\S+)', text).group(1))  # type: ignore[union-attr]
    success = _value(text, "nv_inference_request_success", "simple")
    assert count == success


def test_cpu_metrics_are_reported_and_can_be_switched_off(server: RunningServer, tmp_path: Path) -> None:
    text = _metrics(server)
    assert re.search(r"^nv_cpu_memory_total_bytes \d", text, re.M)
    assert re.search(r"^nv_cpu_utilization [\d.]", text, re.M)
    quiet = start_nereid(EXAMPLES, *WITHOUT_LLM, "--allow-cpu-metrics=false", log_dir=tmp_path)
    try:
        assert "nv_cpu_utilization" not in _metrics(quiet)
    finally:
        quiet.stop()


def test_allow_metrics_false_serves_no_metrics_port(tmp_path: Path) -> None:
    running = start_nereid(EXAMPLES, *WITHOUT_LLM, "--allow-metrics=false", log_dir=tmp_path)
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=2)
    finally:
        running.stop()


# Later Triton's per-model histogram buckets: one too small for any first response, one larger than any.
_MODEL_METRICS = """
model_metrics {
  metric_control [
    { metric_identifier { family: "nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 0.0001, 60000 ] } }
  ]
}
"""


def _first_response_buckets(text: str, model: str) -> dict[str, float]:
    pattern = rf'^nv_inference_first_response_histogram_ms_bucket{{le="([^"]+)",model="{model}",version="1"}} (\S+)$'
    return {le: float(value) for le, value in re.findall(pattern, text, re.M)}


def test_first_response_histogram_counts_decoupled_requests_in_default_and_model_metrics_buckets(tmp_path: Path) -> None:
    """As in Triton, the time-to-first-response histogram exists only for decoupled models; as in later Triton, a
    model's config.pbtxt (or a load request's config JSON) may set its buckets through model_metrics."""
    import queue
    import shutil

    import tritonclient.grpc as grpcclient

    repository = tmp_path / "repository"
    models = Path(__file__).parent.parent / "models" / "python"
    for name in ("repeat", "add_sub"):
        shutil.copytree(models / name, repository / name)
    shutil.copytree(models / "repeat", repository / "repeat_buckets")
    config = repository / "repeat_buckets" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "repeat"', 'name: "repeat_buckets"') + _MODEL_METRICS)
    running = start_nereid(
        repository, "--metrics-config=histogram_latencies=true", "--model-control-mode=explicit", "--load-model=*",
        log_dir=tmp_path,
    )
    try:
        responses: queue.Queue[object] = queue.Queue()
        client = grpcclient.InferenceServerClient(running.grpc_url)
        client.start_stream(callback=lambda result, error: responses.put(error or result))
        for model in ("repeat", "repeat_buckets"):
            for _ in range(4):
                tensor = grpcclient.InferInput("IN", [2], "INT32")
                tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
                client.async_stream_infer(model, [tensor])
        for _ in range(16):
            response = responses.get(timeout=30)
            assert not isinstance(response, Exception), response
        client.stop_stream()
        text = _metrics(running)
        shown = requests.get(f"{running.base}/v2/models/repeat_buckets/config", timeout=5).json()
        # A load request's config JSON carries model_metrics too; an empty bucket list is refused as Triton does.
        add_sub = requests.get(f"{running.base}/v2/models/add_sub/config", timeout=5).json()
        add_sub["model_metrics"] = shown["model_metrics"]
        control = add_sub["model_metrics"]["metric_control"][0]
        bad = {**add_sub, "model_metrics": {"metric_control": [{**control, "histogram_options": {"buckets": []}}]}}
        refused = requests.post(
            f"{running.base}/v2/repository/models/add_sub/load", json={"parameters": {"config": json.dumps(bad)}}, timeout=30
        )
        loaded = requests.post(
            f"{running.base}/v2/repository/models/add_sub/load", json={"parameters": {"config": json.dumps(add_sub)}}, timeout=60
        )
        reloaded = requests.get(f"{running.base}/v2/models/add_sub/config", timeout=5).json()
    finally:
        running.stop()
    assert "# TYPE nv_inference_first_response_histogram_ms histogram" in text
    count = re.search(r'nv_inference_first_response_histogram_ms_count{model="repeat",version="1"} (\S+)', text)
    assert count is not None and float(count.group(1)) == 4
    assert _first_response_buckets(text, "repeat") == {"100": 4, "500": 4, "2000": 4, "5000": 4, "+Inf": 4}
    assert _first_response_buckets(text, "repeat_buckets") == {"0.0001": 0, "60000": 4, "+Inf": 4}
    assert 'nv_inference_first_response_histogram_ms_count{model="add_sub"' not in text
    assert shown["model_metrics"] == {
        "metric_control": [
            {
                "metric_identifier": {"family": "nv_inference_first_response_histogram_ms"},
                "histogram_options": {"buckets": [0.0001, 60000]},
            }
        ]
    }
    assert refused.status_code == 400
    assert "model 'add_sub': histogram options must specify non-empty 'buckets'" in refused.json()["error"]
    assert loaded.status_code == 200, loaded.text
    assert reloaded["model_metrics"] == shown["model_metrics"]
