"""`nereid analyze` end to end: searches on a small ONNX model with a server analyze starts itself and with a
running server in explicit mode, the time budget, real Triton with a Python model, bad input, and the HTML
report rendered in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from examples.build_models import mlp
from google.protobuf import text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2 as mc

from nereid.tools.analyze import CSV_COLUMNS, AnalyzeResult, AnalyzeSettings, main, run_analyze
from tests.servers import ROOT, RunningServer, free_port, start_nereid, start_real_triton

CHROMIUM = Path("/usr/bin/chromium")

MLP_CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# Short windows and two concurrency levels: each configuration takes about a second.
FAST: dict[str, Any] = {
    "concurrency": [1, 2],
    "measurement_interval_ms": 100,
    "max_trials": 4,
    "stability_percentage": 50.0,
    "warmup_s": 0.0,
}
FAST_FLAGS = ["--concurrency", "1,2", "--measurement-interval-ms", "100", "--max-trials", "4", "--stability-percentage", "50", "--warmup-s", "0"]


@pytest.fixture(scope="module")
def onnx_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("analyze_repository")
    mlp(repository / "mlp" / "1" / "model.onnx")
    (repository / "mlp" / "config.pbtxt").write_text(MLP_CONFIG)
    return repository


@pytest.fixture(scope="module")
def brute_run(onnx_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> AnalyzeResult:
    """One brute-force search with a server analyze starts itself; several tests read its outputs."""
    lines: list[str] = []
    settings = AnalyzeSettings(
        "mlp",
        model_repository=onnx_repo,
        output_dir=tmp_path_factory.mktemp("analyze_out"),
        mode="brute",
        max_batch_sizes=[4, 8],
        max_queue_delays_us=[0],
        instance_counts=[1],
        intra_op_threads=[1],
        max_p99_latency_ms=500.0,
        min_throughput=1.0,
        max_memory_mb=100_000.0,
        time_budget_s=60.0,
        **FAST,
    )
    result = run_analyze(settings, lines.append)
    result.notes.append("progress:\n" + "\n".join(lines))
    return result


def _config_of(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _assert_picks_are_measured_and_meet_constraints(result: AnalyzeResult) -> None:
    rows = _csv(result.files["csv"])
    qualifying = [r for r in rows if r["meets_constraints"] == "yes"]
    assert qualifying
    for objective in result.objectives:
        pick = result.best[objective]
        assert pick.config_path is not None and pick.config_path.parent.name == result.model
        assert pick.config_path.parent.parent.name == objective
        # The written config is the config of a measured variant, and its measurement meets the constraints.
        written = _config_of(pick.config_path)
        measured = [o for o in result.outcomes if o.measured and text_format.Parse(o.config_text, mc.ModelConfig()) == written]
        assert measured and pick.outcome in measured
        assert pick.measurement in pick.outcome.measurements and pick.measurement.meets_constraints
        for name, limit in result.constraints.items():
            value = {"max_p99_latency_ms": pick.measurement.p99_ms, "min_throughput": pick.measurement.throughput}.get(name)
            if name == "max_memory_mb":
                value = pick.measurement.server_memory_mb
            assert value is not None
            assert value <= limit if name.startswith("max") else value >= limit
    # The CSV keeps three decimals: the pick is the row whose value it writes as the best one.
    best_throughput = max(float(r["throughput_infer_per_s"]) for r in qualifying)
    assert float(f"{result.best['max_throughput'].measurement.throughput:.3f}") == best_throughput
    lowest_p99 = min(float(r["p99_latency_ms"]) for r in qualifying)
    assert float(f"{result.best['min_latency'].measurement.p99_ms:.3f}") == lowest_p99


def test_brute_force_on_onnx_model_measures_every_config_and_writes_the_report(brute_run: AnalyzeResult) -> None:
    result = brute_run
    names = {o.label for o in result.outcomes}
    expected = {"baseline", "mbs8_nodb_i1_t1", "mbs4_db_q0us_i1_t1", "mbs8_db_q0us_i1_t1"}
    assert names == expected, result.notes[-1]
    assert result.variants_in_space == 3 and result.stopped_early is None and result.fatal is None
    assert all(o.measured and o.error is None for o in result.outcomes)
    # Every measurement is a CSV row with the documented columns.
    rows = _csv(result.files["csv"])
    assert list(rows[0]) == CSV_COLUMNS
    assert len(rows) == len(result.measurements) == 2 * len(expected)
    assert {r["variant"] for r in rows} == expected
    assert {r["intra_op_thread_count"] for r in rows} == {"", "1"}
    for row in rows:
        assert float(row["throughput_infer_per_s"]) > 0 and float(row["p99_latency_ms"]) >= float(row["p50_latency_ms"]) > 0
        assert float(row["server_memory_mb"]) > 10 and float(row["server_cpu_percent"]) > 0  # psutil on the server it started
    # The variants really ran with their configs: the server log shows reloads, and a q0 variant has dynamic batching.
    config = next(o for o in result.outcomes if o.label == "mbs4_db_q0us_i1_t1").config_text
    assert "max_batch_size: 4" in config and "dynamic_batching" in config and "intra_op_thread_count" in config
    for name in ("throughput_vs_latency", "memory_vs_latency"):
        with Image.open(result.files[name]) as image:
            image.verify()
        with Image.open(result.files[name]) as image:
            assert image.format == "PNG" and image.size[0] > 500
    page = result.files["html"].read_text()
    for label in expected:
        assert label in page
    assert page.count("data:image/png;base64,") == 2
    _assert_picks_are_measured_and_meet_constraints(result)
    progress = result.notes[-1]
    assert "1. baseline" in progress and "concurrency 2:" in progress and "done: 4 configuration(s) measured" in progress


def test_output_repository_serves_as_it_is(brute_run: AnalyzeResult, tmp_path: Path) -> None:
    pick = brute_run.best["max_throughput"]
    assert pick.config_path is not None
    model_dir = pick.config_path.parent
    assert (model_dir / "1").is_symlink() and (model_dir / "1" / "model.onnx").is_file()
    server = start_nereid(model_dir.parent, "--log-info=false", log_dir=tmp_path)
    try:
        config = requests.get(f"{server.base}/v2/models/mlp/config", timeout=5).json()
        assert config["max_batch_size"] == pick.outcome.variant.max_batch_size
        assert ("dynamic_batching" in config) == pick.outcome.variant.dynamic_batching
    finally:
        server.stop()


def _chromium(*args: str, user_data: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={user_data}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make system-deps installs it)")
def test_html_report_renders_in_headless_chromium(brute_run: AnalyzeResult, tmp_path: Path) -> None:
    report = brute_run.files["html"].resolve()
    screenshot = tmp_path / "report.png"
    done = _chromium(f"--screenshot={screenshot}", "--window-size=1280,2000", report.as_uri(), user_data=tmp_path / "profile")
    assert screenshot.is_file(), done.stderr[-2000:]
    with Image.open(screenshot) as image:
        assert image.format == "PNG" and image.size == (1280, 2000)
        histogram = image.convert("L").histogram()
    # Not blank: many grey levels, and a good share of the page is not white (text, tables, charts).
    assert sum(1 for n in histogram if n) > 50
    assert sum(histogram[:200]) > 0.03 * 1280 * 2000
    dom = _chromium("--dump-dom", report.as_uri(), user_data=tmp_path / "profile2").stdout
    summary = dom[dom.index('<table id="summary">') : dom.index("</table>", dom.index('<table id="summary">'))]
    assert summary.count("<tr") == 1 + len(brute_run.outcomes)
    for outcome in brute_run.outcomes:
        assert outcome.label in summary
    assert dom.count("<img") == 2


@pytest.fixture
def explicit_server(onnx_repo: Path, tmp_path: Path) -> Iterator[RunningServer]:
    server = start_nereid(onnx_repo, "--model-control-mode=explicit", "--load-model=mlp", "--log-info=false", log_dir=tmp_path)
    yield server
    server.stop()


def test_quick_mode_against_a_running_server_climbs_and_restores_the_model(
    explicit_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    # No --model-repository: the model's config comes from the server.
    argv = [
        "-m", "mlp", "--url", explicit_server.http_url, "--metrics-url", f"127.0.0.1:{explicit_server.metrics_port}",
        "-o", str(out), "--mode", "quick", "--max-batch-sizes", "4,8", "--max-queue-delays-us", "100",
        "--instance-counts", "1,2", "--intra-op-threads", "1,2", "--time-budget-s", "60", "--objective", "max_throughput",
        *FAST_FLAGS,
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "max_throughput:" in captured.out and "report:" in captured.out and "Traceback" not in captured.err
    doc = json.loads((out / "results.json").read_text())
    assert doc["mode"] == "quick" and doc["objectives"] == ["max_throughput"]
    labels = [v["label"] for v in doc["variants"]]
    # (off + on x 2 sizes) x 2 instances x 2 threads: 12 configurations. The climb measures its start and the
    # start's three distinct neighbours at least, and stops by itself (a local optimum), not by the budget.
    assert doc["variants_in_space"] == 12
    assert labels[0] == "baseline" and labels[1] == "mbs8_nodb_i1_t1" and 5 <= len(labels) <= 13
    assert doc["stopped_early"] is None
    assert len(set(labels)) == len(labels)
    assert (out / "max_throughput" / "mlp" / "config.pbtxt").is_file() and not (out / "min_latency").exists()
    # No repository given: only the config is written (the server's version folders are not reachable from here).
    assert sorted(p.name for p in (out / "max_throughput" / "mlp").iterdir()) == ["config.pbtxt"]
    # The server is left as it was: the model loaded with its own config.
    config = requests.get(f"{explicit_server.base}/v2/models/mlp/config", timeout=5).json()
    assert config["max_batch_size"] == 8 and "dynamic_batching" not in config
    assert "intra_op_thread_count" not in config.get("parameters", {})


def test_time_budget_stops_early_and_reports_what_was_measured(onnx_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    budget = 6.0
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nereid", "analyze", "-m", "mlp", "--model-repository", str(onnx_repo), "-o", str(out),
         "--mode", "brute", "--time-budget-s", str(budget), *FAST_FLAGS],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert "time budget spent" in done.stderr and "Traceback" not in done.stderr
    # The search fits the budget; Python start-up, the server's stop and the report come on top (a few seconds).
    doc = json.loads((out / "results.json").read_text())
    assert doc["elapsed_s"] <= budget + 1.0, doc["elapsed_s"]
    assert elapsed < budget + 5
    assert "time budget" in doc["stopped_early"]
    measured = [v for v in doc["variants"] if v["measurements"]]
    assert 1 <= len(measured) < doc["variants_in_space"]
    rows = _csv(out / "measurements.csv")
    assert len(rows) == sum(len(v["measurements"]) for v in doc["variants"])
    assert "Stopped early" in (out / "report.html").read_text()


ADD_SUB_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
'''

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.mark.differential
def test_real_triton_in_explicit_mode_with_a_python_model(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    (repository / "add_sub" / "1").mkdir(parents=True)
    (repository / "add_sub" / "1" / "model.py").write_text(ADD_SUB_PY)
    (repository / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG)
    triton = start_real_triton(repository, "--model-control-mode=explicit", "--log-info=false", "--exit-timeout-secs=2")
    try:
        settings = AnalyzeSettings(
            "add_sub",
            model_repository=repository,
            url=triton.http_url,
            metrics_url=f"127.0.0.1:{triton.metrics_port}",
            output_dir=tmp_path / "out",
            mode="brute",
            max_batch_sizes=[8],
            max_queue_delays_us=[100],
            instance_counts=[1],
            intra_op_threads=[2],  # not ONNX: ignored with a note
            max_p99_latency_ms=1000.0,
            time_budget_s=60.0,
            **FAST,
        )
        result = run_analyze(settings)
        index = requests.post(f"{triton.base}/v2/repository/index", json={}, timeout=5).json()
    finally:
        triton.stop()
    assert {o.label for o in result.outcomes} == {"baseline", "mbs8_db_q100us_i1"}
    assert all(o.measured for o in result.outcomes), [o.error for o in result.outcomes]
    assert any("intra-op-threads is ignored" in n for n in result.notes)
    assert "pid" in result.resource_source  # tritonserver listens here: psutil found it
    assert all(m.server_memory_mb and m.server_memory_mb > 10 for m in result.measurements)
    _assert_picks_are_measured_and_meet_constraints(result)
    for pick in result.best.values():
        assert pick.config_path is not None
        assert "intra_op_thread_count" not in pick.config_path.read_text()
        assert (pick.config_path.parent / "1" / "model.py").is_file()
    # Triton started with no model loaded; analyze unloads it again at the end.
    assert [e.get("state") for e in index if e["name"] == "add_sub"] == ["UNAVAILABLE"]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nereid analyze: error: ") and "Traceback" not in err, err
    return err


def test_bad_input_gets_one_clear_line(
    onnx_repo: Path, explicit_server: RunningServer, example_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["-o", str(tmp_path / "out"), "-q"]
    err = _one_line_error(["-m", "nope", "--model-repository", str(onnx_repo), *out], capsys)
    assert "unknown model 'nope'" in err
    err = _one_line_error(["-m", "nope", "--url", explicit_server.http_url, *out], capsys)
    assert "unknown model 'nope'" in err and "it has mlp" in err
    err = _one_line_error(["-m", "mlp", "--url", f"127.0.0.1:{free_port()}", *out], capsys)
    assert "cannot reach the server" in err
    err = _one_line_error(["-m", "simple", "--url", example_server.http_url, *out], capsys)
    assert "--model-control-mode=explicit" in err
    err = _one_line_error(["-m", "simple_ensemble", "--model-repository", str(ROOT / "examples" / "model_repository"), *out], capsys)
    assert "is an ensemble" in err
    broken = tmp_path / "broken"
    shutil.copytree(onnx_repo, broken)
    (broken / "mlp" / "config.pbtxt").write_text("name: 'mlp' max_batch_size: [\n")
    err = _one_line_error(["-m", "mlp", "--model-repository", str(broken), *out], capsys)
    assert "cannot parse" in err and "config.pbtxt" in err
