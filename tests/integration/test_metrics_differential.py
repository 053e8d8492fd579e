"""The /metrics scrape next to real Triton 2.51's: metric names, types, label names and HELP text, with custom
summary quantiles (`--metrics-config summary_quantiles`), without latency counters (`counter_latencies=false`),
the pinned-memory pool gauges and the pending-request gauge; `nv_model_load_duration_secs` as Triton
releases after 2.51 write it; and config.pbtxt's model_metrics, which 2.51 refuses and later releases take."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from nereid.config.model_config import normalize, read_config_file, validate
from nereid.config.model_metrics import histogram_buckets
from nereid.metrics import parse_summary_quantiles
from tests.servers import RunningServer, start_nereid, start_real_triton

MODELS = Path(__file__).parent.parent / "models" / "python"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    help: str = ""
    type: str = ""
    # sample name -> the label-name sets its samples carry
    labels: dict[str, set[frozenset[str]]] = field(default_factory=dict)
    samples: list[tuple[str, dict[str, str], str]] = field(default_factory=list)


def parse_scrape(text: str) -> dict[str, Family]:
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, documentation = line[7:].partition(" ")
            current = families.setdefault(name, Family())
            current.help = documentation
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            current = families.setdefault(name, Family())
            current.type = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match is not None and current is not None, line
            labels = dict(_LABEL.findall(match.group(2) or ""))
            current.labels.setdefault(match.group(1), set()).add(frozenset(labels))
            current.samples.append((match.group(1), labels, match.group(3)))
    return families


def _repository(tmp_path: Path) -> Path:
    repository = tmp_path / "repository"
    for name in ("add_sub", "repeat"):
        shutil.copytree(MODELS / name, repository / name)
    return repository


def _scrape_after_one_request(server: RunningServer) -> dict[str, Family]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        client.infer("add_sub", inputs)
    # Triton fills its polled gauges (pinned memory, CPU) every --metrics-interval-ms: wait for the first poll.
    deadline = time.monotonic() + 20
    while True:
        scrape = parse_scrape(requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text)
        pinned = scrape.get("nv_pinned_memory_pool_total_bytes")
        if pinned is None or pinned.samples[0][2] != "0" or time.monotonic() > deadline:
            return scrape
        time.sleep(0.2)


def _both(tmp_path: Path, *flags: str) -> tuple[dict[str, Family], dict[str, Family]]:
    repository = _repository(tmp_path)
    scrapes = []
    for start in (start_real_triton, start_nereid):
        server = start(repository, *flags) if start is start_real_triton else start(repository, *flags, log_dir=tmp_path)
        try:
            scrapes.append(_scrape_after_one_request(server))
        finally:
            server.stop()
    return scrapes[0], scrapes[1]


def _assert_same_shape(triton: dict[str, Family], nereid: dict[str, Family]) -> None:
    """Every family real Triton writes, Nereid writes with the same HELP, TYPE, sample names and label names
    (nv_model_load_duration_secs is the one nv_ family Nereid adds: Triton 2.51 does not have it; Nereid's own
    families, such as the orchestration's, are named nereid_)."""
    assert set(triton) <= set(nereid), sorted(set(triton) - set(nereid))
    for name, family in triton.items():
        ours = nereid[name]
        assert (ours.help, ours.type) == (family.help, family.type), name
        assert ours.labels == family.labels, name
    assert {name for name in set(nereid) - set(triton) if not name.startswith("nereid_")} == {
        "nv_model_load_duration_secs"
    }


@pytest.mark.differential
def test_custom_summary_quantiles_and_pinned_memory_match_real_triton(tmp_path: Path) -> None:
    triton, nereid = _both(
        tmp_path,
        "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=0.1:0.01,0.5:0.05,0.75:0.01",
        "--pinned-memory-pool-byte-size=4096",
    )
    _assert_same_shape(triton, nereid)
    for scrape in (triton, nereid):
        quantiles = {labels["quantile"] for sample, labels, _ in scrape["nv_inference_request_summary_us"].samples if "quantile" in labels}
        assert quantiles == {"0.1", "0.5", "0.75"}
        assert scrape["nv_pinned_memory_pool_total_bytes"].samples == [("nv_pinned_memory_pool_total_bytes", {}, "4096")]
        assert scrape["nv_pinned_memory_pool_used_bytes"].samples == [("nv_pinned_memory_pool_used_bytes", {}, "0")]
        pending = {labels["model"]: value for _, labels, value in scrape["nv_inference_pending_request_count"].samples}
        assert pending == {"add_sub": "0", "repeat": "0"}
    count = {labels["model"]: v for s, labels, v in nereid["nv_inference_request_summary_us"].samples if s.endswith("_count")}
    assert count == {"add_sub": "1", "repeat": "0"}


@pytest.mark.differential
def test_counter_latencies_false_drops_the_latency_counters_like_real_triton(tmp_path: Path) -> None:
    triton, nereid = _both(tmp_path, "--metrics-config=counter_latencies=false", "--allow-cpu-metrics=false")
    _assert_same_shape(triton, nereid)
    for scrape in (triton, nereid):
        assert "nv_inference_request_duration_us" not in scrape
        assert "nv_inference_compute_infer_duration_us" not in scrape
        assert "nv_cpu_utilization" not in scrape
        assert "nv_pinned_memory_pool_total_bytes" in scrape  # not a CPU metric: still there, default 256 MB
    assert nereid["nv_pinned_memory_pool_total_bytes"].samples[0][2] == "268435456"
    assert triton["nv_pinned_memory_pool_total_bytes"].samples[0][2] == "268435456"


def test_pending_requests_and_model_load_duration(tmp_path: Path) -> None:
    """nv_inference_pending_request_count counts queued requests; nv_model_load_duration_secs is a gauge with the
    model and version labels and Triton's HELP text."""
    server = start_nereid(_repository(tmp_path), log_dir=tmp_path)
    try:
        scrape = _scrape_after_one_request(server)
    finally:
        server.stop()
    load = scrape["nv_model_load_duration_secs"]
    assert (load.help, load.type) == ("Model load time in seconds", "gauge")
    assert load.labels == {"nv_model_load_duration_secs": {frozenset({"model", "version"})}}
    assert all(float(value) > 0 for _, _, value in load.samples)
    pending = scrape["nv_inference_pending_request_count"]
    assert pending.help == "Instantaneous number of pending requests awaiting execution per-model."
    assert {labels["model"] for _, labels, _ in pending.samples} == {"add_sub", "repeat"}


def test_summary_quantiles_are_parsed_as_triton_parses_them(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_summary_quantiles('"0.5:0.05,0.9:0.01"') == (0.5, 0.9)
    assert parse_summary_quantiles("0.5:0.05,oops,0.99:x,0.25:0.1") == (0.5, 0.25)
    assert "No ':' delimiter found. Expected format is <quantile>:<error>" in caplog.text
    assert parse_summary_quantiles("nonsense") == (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton's defaults


_MODEL_METRICS = """
model_metrics {
  metric_control: [
    { metric_identifier: { family: "nv_inference_first_response_histogram_ms" } histogram_options: { buckets: [ 1, 2, 4 ] } }
  ]
}
"""


@pytest.mark.differential
def test_histogram_buckets_in_model_metrics_are_refused_by_triton_2_51_and_taken_by_nereid(tmp_path: Path) -> None:
    """Custom histogram buckets came after Triton 2.51 (config.pbtxt's model_metrics): 2.51 cannot parse such a
    config and fails to start; Nereid takes it as later Triton releases do (the served buckets are checked in
    test_metrics.py against a running Nereid)."""
    repository = tmp_path / "repository"
    shutil.copytree(MODELS / "repeat", repository / "repeat")
    with open(repository / "repeat" / "config.pbtxt", "a") as config:
        config.write(_MODEL_METRICS)
    with pytest.raises(RuntimeError) as failure:
        start_real_triton(repository, "--metrics-config=histogram_latencies=true", timeout=60)
    assert 'Message type "inference.ModelConfig" has no field named "model_metrics"' in str(failure.value)
    config = read_config_file(repository / "repeat" / "config.pbtxt")
    normalize(config, "repeat")
    validate(config, "repeat")
    assert histogram_buckets(config, "nv_inference_first_response_histogram_ms") == (1.0, 2.0, 4.0)


_SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
_SLOW_MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return responses
'''


def _most_pending_while_four_wait(server: RunningServer) -> int:
    """Four requests at once to a one-instance model that takes 1 s each: the highest pending count seen."""
    import threading

    def one() -> None:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1000], np.int32))
            client.infer("slow", [tensor])

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    most = 0
    deadline = time.monotonic() + 30
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        match = re.search(r'^nv_inference_pending_request_count\{model="slow",version="1"\} (\S+)$', text, re.M)
        assert match is not None
        most = max(most, int(float(match.group(1))))
        if most == 3:
            break
        time.sleep(0.1)
    for thread in threads:
        thread.join(60)
    return most


@pytest.mark.differential
def test_pending_requests_count_every_request_not_yet_executing_like_real_triton(tmp_path: Path) -> None:
    """One request executes, three wait: three pending, although Nereid has already handed the next one to the
    model's worker process."""
    repository = tmp_path / "repository"
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(_SLOW_CONFIG)
    (repository / "slow" / "1" / "model.py").write_text(_SLOW_MODEL)
    for start in (start_real_triton, start_nereid):
        server = start(repository) if start is start_real_triton else start(repository, log_dir=tmp_path)
        try:
            assert _most_pending_while_four_wait(server) == 3, start.__name__
        finally:
            server.stop()
