"""The dashboard's JSON against a real `nereid serve` with model orchestration on: an evicted model shows as
EVICTED with its reason, the memory figures see the cold starts and the eviction, the live counters follow
requests, the API only reads, and --allow-dashboard=false leaves Triton's 404."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.servers import ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"


def _grouped_copies(repo: Path) -> None:
    """Two copies of add_sub_python in group 'demo', which --model-group-limit=demo:1 lets one hold at a time."""
    source = EXAMPLES / "add_sub_python"
    for name in ("tenant_a", "tenant_b"):
        shutil.copytree(source, repo / name)
        config = (source / "config.pbtxt").read_text().replace('name: "add_sub_python"', f'name: "{name}"')
        config += '\nparameters { key: "nereid.group" value { string_value: "demo" } }\n'
        (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("grouped")
    _grouped_copies(repo)
    server = start_nereid(
        repo, "--model-control-mode=explicit", "--model-load-on-demand=true", "--model-group-limit=demo:1",
        log_dir=tmp_path_factory.mktemp("logs"),
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log()


def _get(server: RunningServer, path: str) -> Any:
    reply = requests.get(f"{server.base}{path}", timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _infer(server: RunningServer, model: str) -> None:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]}
    reply = requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text


def test_eviction_shows_as_evicted_with_the_cold_starts_and_the_eviction(server: RunningServer) -> None:
    _get(server, "/dashboard/api/live")  # the first snapshot sets the baseline the events are found against
    _infer(server, "tenant_a")
    _infer(server, "tenant_b")  # loads on demand, evicting tenant_a (group limit 1)
    rows = {row["name"]: row for row in _get(server, "/dashboard/api/models")["models"]}
    assert rows["tenant_a"]["state"] == "EVICTED" and rows["tenant_a"]["reason"] == "evicted: group"
    assert rows["tenant_b"]["state"] == "READY" and rows["tenant_b"]["backend"] == "python"
    assert rows["tenant_b"]["instances"] == "1×CPU" and rows["tenant_b"]["batching"] == "max 64"
    assert rows["tenant_b"]["footprint_bytes"] > 0
    memory = _get(server, "/dashboard/api/live")["memory"]
    events = [(e["kind"], e["model"], e["cause"]) for e in memory["events"]]
    assert ("cold start", "tenant_a", "on_demand") in events and ("cold start", "tenant_b", "on_demand") in events
    assert ("eviction", "tenant_a", "group") in events
    assert memory["orchestrated"] and memory["evictions_total"] >= 1 and memory["cold_starts_total"] >= 2
    assert [r["model"] for r in memory["resident"]] == ["tenant_b"]


def test_live_counters_follow_requests_of_the_chosen_model(server: RunningServer) -> None:
    _infer(server, "tenant_b")
    before = _get(server, "/dashboard/api/live?model=tenant_b")
    for _ in range(3):
        _infer(server, "tenant_b")
    after = _get(server, "/dashboard/api/live?model=tenant_b")
    assert after["time"] > before["time"]
    assert after["model"]["success"] - before["model"]["success"] == 3
    assert after["server"]["success"] - before["server"]["success"] == 3
    assert after["model"]["infer_ns"] > before["model"]["infer_ns"]
    assert after["model"]["batches"]["1"] >= 4
    assert after["model"]["quantiles_us"] is None  # no --metrics-config summary_latencies=true
    assert after["model"]["llm"] is None
    assert after["process"]["workers"] == 1 and after["process"]["workers_rss_bytes"] > 0
    assert _get(server, "/dashboard/api/live?model=nothing_like_it")["model"] is None


def test_dashboard_api_only_reads_and_names_what_it_lacks(server: RunningServer) -> None:
    assert requests.post(f"{server.base}/dashboard/api/models", timeout=10).status_code == 405
    missing = requests.get(f"{server.base}/dashboard/api/model?name=tenant_a", timeout=10)
    assert missing.status_code in (400, 404, 503) and "tenant_a" in missing.json()["error"]
    assert requests.get(f"{server.base}/dashboard/api/nothing", timeout=10).status_code == 404
    reports = _get(server, "/dashboard/api/reports")
    assert reports == {"folder": False, "reports": []}
    page = requests.get(f"{server.base}/dashboard", timeout=10)
    assert page.headers["content-type"].startswith("text/html") and "default-src 'self'" in page.headers["content-security-policy"]
    script = requests.get(f"{server.base}/dashboard/assets/dashboard.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")


def test_dashboard_can_be_turned_off(tmp_path: Path) -> None:
    server = start_nereid(EXAMPLES, "--model-control-mode=explicit", "--allow-dashboard=false", log_dir=tmp_path)
    try:
        page = requests.get(f"{server.base}/dashboard", timeout=10)
        # What tritonserver 2.51 answers for the path (asked once by hand): 404, text/plain, {"error":"Not Found"}.
        assert page.status_code == 404 and page.text == '{"error":"Not Found"}'
        assert page.headers["content-type"] == "text/plain"
        assert requests.get(f"{server.base}/dashboard/api/live", timeout=10).status_code == 404
    finally:
        assert server.stop() == 0, server.log()
