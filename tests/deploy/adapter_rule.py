"""The prometheus-adapter rule of the Helm chart, taken from the rendered chart and evaluated on real scrapes of a
server under a bounded load (Nereid's or real Triton's): what the HPA would see, next to the statistics endpoint."""

from __future__ import annotations

import re
import subprocess
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests
import tritonclient.http as httpclient
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ROOT, RunningServer

__all__ = ["CHART", "RuleMeasurement", "adapter_rule", "measure_under_load", "write_slow_model"]

CHART = ROOT / "deploy" / "helm" / "nereid"
Series = dict[str, dict[tuple[tuple[str, str], ...], float]]

_RULE = re.compile(
    r"avg\(delta\((?P<queue>\w+)\{<<\.LabelMatchers>>\}\[(?P<window>\w+)\]\)"
    r"/\(1\+delta\((?P<success>\w+)\{<<\.LabelMatchers>>\}\[(?P=window)\]\)\)\) by \(<<\.GroupBy>>\)"
)
SLEEP_SECS = 0.02
_SLOW_MODEL = textwrap.dedent(
    f"""
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            time.sleep({SLEEP_SECS})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                    for r in requests]
    """
)


def write_slow_model(repository: Path) -> None:
    """One model that takes 20 ms a request on one instance, so concurrent requests queue."""
    model = repository / "slow"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_SLOW_MODEL)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "IN", data_type: TYPE_FP32, dims: [1] }]\n'
        'output [{ name: "OUT", data_type: TYPE_FP32, dims: [1] }]\n'
        "instance_group [{ count: 1, kind: KIND_CPU }]\n"
    )


def adapter_rule(helm: str) -> tuple[dict[str, Any], re.Match[str]]:
    """The rule from the ConfigMap that the chart renders with its autoscaling values file, and its parsed query."""
    command = [helm, "template", "demo", str(CHART), "-f", str(CHART / "ci" / "s3-autoscaling-values.yaml")]
    rendered = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    [config_map] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"]
    rule = yaml.safe_load(config_map["data"]["config.yaml"])["rules"][0]
    match = _RULE.fullmatch(rule["metricsQuery"])
    assert match is not None, rule["metricsQuery"]
    return rule, match


def _scrape(server: RunningServer, names: tuple[str, str]) -> Series:
    """Each named counter's samples by label set, from one scrape of /metrics."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    deadline = time.monotonic() + 10
    while True:
        try:
            text = requests.get(url, timeout=10).text
            break
        except requests.ConnectionError:
            # Refused once in a full suite, just after the server answered ready (cause not found: in three
            # starts alone, real Triton's metrics port answered 2 ms after its ready check).
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    found: Series = {name: {} for name in names}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            if base in found:
                found[base][tuple(sorted(sample.labels.items()))] = sample.value
    return found


def evaluate(rule: re.Match[str], first: Series, second: Series) -> float:
    """The rule's metricsQuery for one pod over two scrapes: delta(queue) / (1 + delta(success)) per series, averaged
    over the pod's series (the two scrapes being the window's first and last samples)."""
    queue, success = rule["queue"], rule["success"]
    per_series = [
        (second[queue][labels] - first[queue].get(labels, 0.0)) / (1 + second[success][labels] - first[success].get(labels, 0.0))
        for labels in second[queue]
    ]
    assert per_series, f"no {queue} series in the scrape"
    return sum(per_series) / len(per_series)


def _queue_stats(server: RunningServer) -> tuple[int, int]:
    stats = requests.get(server.base + "/v2/models/slow/stats", timeout=10).json()["model_stats"][0]["inference_stats"]
    return int(stats["queue"]["ns"]), int(stats["success"]["count"])


@dataclass
class RuleMeasurement:
    idle_value: float  # the rule over two scrapes with no traffic
    value: float  # the rule over two scrapes under load
    served: int  # successful requests between the two loaded scrapes (statistics endpoint)
    stats_queue_us_per_request: float  # the statistics endpoint's queue time per request over the same window


def measure_under_load(server: RunningServer, rule: re.Match[str], clients: int = 4, per_client: int = 40) -> RuleMeasurement:
    """Scrape twice idle, then twice under `clients` concurrent clients (bounded: per_client requests each, 60 s)."""
    names = (rule["queue"], rule["success"])
    idle = evaluate(rule, _scrape(server, names), _scrape(server, names))
    stop = threading.Event()
    done = [0] * clients

    def load(index: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        try:
            while done[index] < per_client and not stop.is_set():
                client.infer("slow", [tensor])
                done[index] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=load, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while sum(done) < clients * 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        first, stats_first = _scrape(server, names), _queue_stats(server)
        while sum(done) < clients * 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        second, stats_second = _scrape(server, names), _queue_stats(server)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    served = stats_second[1] - stats_first[1]
    per_request = (stats_second[0] - stats_first[0]) / 1000 / max(served, 1)
    return RuleMeasurement(idle, evaluate(rule, first, second), served, per_request)
