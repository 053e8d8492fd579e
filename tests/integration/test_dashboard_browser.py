"""The dashboard in a real browser (Playwright driving Debian's chromium) against a real `nereid serve`: the models
table against the repository index, unload and load from the page, charts under load from `nereid perf`, the
try-it form and the chat box, reports, and the restricted-API header. One server serves them all; its dashboard
and repository APIs are restricted, so every page here sends the header, as an operator's proxy would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

sync_api = pytest.importorskip("playwright.sync_api")

from tests.servers import ROOT, RunningServer, start_nereid  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system-deps)")

EXAMPLES = ROOT / "examples" / "model_repository"
HEADER = {"x-operator": "on-call"}
RESTRICTION = "--http-restricted-api=dashboard,model-repository:x-operator=on-call"
MANY = 1000  # models in the repository that the table must handle


def _many_models(repo: Path) -> None:
    """MANY Python models that are never loaded (the index lists them), and one whose load fails."""
    for index in range(MANY):
        folder = repo / f"bulk_{index:04d}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "bulk_{index:04d}"\nbackend: "python"\n')
    kinds = repo / "tensor_kinds"
    (kinds / "1").mkdir(parents=True)
    (kinds / "config.pbtxt").write_text(_KINDS_CONFIG)
    (kinds / "1" / "model.py").write_text(_KINDS_MODEL)
    broken = repo / "broken_model"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken_model"\nbackend: "python"\nmax_batch_size: 0\n')  # no model.py


# A model whose outputs the try-it form shows as text (BYTES) and as an image (16x16 RGB).
_KINDS_CONFIG = """name: "tensor_kinds"
backend: "python"
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "SHOUTED" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PICTURE" data_type: TYPE_UINT8 dims: [ 16, 16, 3 ] }
]
"""
_KINDS_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            shouted = np.array([t.decode().upper().encode() for t in text.reshape(-1)], dtype=object)
            picture = np.zeros((16, 16, 3), dtype=np.uint8)
            picture[:, :, 0] = 255
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SHOUTED", shouted), pb_utils.Tensor("PICTURE", picture)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    bulk = tmp_path_factory.mktemp("bulk_repo")
    _many_models(bulk)
    llm_repo = tmp_path_factory.mktemp("llm_repo")
    have_llm = False
    try:
        from nereid.backends.llm.tiny_model import write_vllm_model

        write_vllm_model(llm_repo, "chat_llm", {"max_model_len": 256, "max_num_seqs": 4, "cpu_threads": 1}, cached=True)
        have_llm = True
    except ImportError:  # torch/transformers absent: the chat test skips
        pass
    reports = tmp_path_factory.mktemp("reports")
    run = reports / "simple-run"
    run.mkdir()
    (run / "report.html").write_text("<html><body><h1>analyze report</h1></body></html>")
    (run / "results.json").write_text(json.dumps({"model": "simple", "best": {"throughput": {"variant": "batch8"}}}))
    _png(run / "throughput_latency.png")
    server = start_nereid(
        [EXAMPLES, bulk, llm_repo],
        "--model-control-mode=explicit",
        "--load-model=add_sub_python",
        "--load-model=simple",
        "--load-model=tensor_kinds",
        *(["--load-model=chat_llm"] if have_llm else []),
        RESTRICTION,
        "--metrics-config=summary_latencies=true",  # the live view's p50 / p99 come from the latency summaries
        f"--dashboard-reports-dir={reports}",
        log_dir=tmp_path_factory.mktemp("logs"),
        timeout=180,
    )
    server.extra["llm"] = "1" if have_llm else ""
    yield server
    assert server.stop() == 0, server.log()


def _png(path: Path) -> None:
    """A real 16x16 PNG, so that the page's <img> decodes it."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + bytes([200, 30, 30]) * 16 for _ in range(16))
    header = struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser: Any, server: RunningServer) -> Iterator[Any]:
    context = browser.new_context(extra_http_headers=HEADER, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"the page raised: {errors}"


def _open(page: Any, server: RunningServer, view: str = "models") -> None:
    page.goto(f"{server.base}/dashboard#{view}")
    if view == "models":
        page.wait_for_selector("[data-model]")


def _index(server: RunningServer) -> list[dict[str, Any]]:
    reply = requests.post(f"{server.base}/v2/repository/index", headers=HEADER, timeout=30)
    reply.raise_for_status()
    rows: list[dict[str, Any]] = reply.json()
    return rows


def _row_state(page: Any, model: str) -> str:
    state: str = page.locator(f'[data-model="{model}"]').first.get_attribute("data-state")
    return state


def test_dashboard_is_refused_without_the_restricted_api_header(browser: Any, server: RunningServer) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        response = page.goto(f"{server.base}/dashboard")
        assert response.status == 403
        assert "This API is restricted, expecting header 'x-operator'" in page.content()
        assert requests.get(f"{server.base}/dashboard/api/live", timeout=10).status_code == 403
    finally:
        context.close()
    assert requests.get(f"{server.base}/dashboard", headers=HEADER, timeout=10).status_code == 200


def test_models_table_matches_the_repository_index(page: Any, server: RunningServer) -> None:
    index = _index(server)
    _open(page, server)
    assert page.locator("[data-testid=model-count]").inner_text() == f"{len(index)} of {len(index)} model versions"
    # Virtual rows: the page holds a screenful, not a thousand.
    assert page.locator("[data-testid=model-rows] [data-model]").count() < 60
    shown = page.eval_on_selector_all(
        "[data-testid=model-rows] [data-model]", "rows => rows.map(r => [r.dataset.model, r.dataset.version, r.dataset.state])"
    )
    expected = [[r["name"], r.get("version", ""), r.get("state", "UNAVAILABLE")] for r in index]
    assert shown == expected[: len(shown)]
    for row in index:
        if row.get("state") == "READY":
            page.fill("[data-testid=model-filter]", row["name"])
            assert _row_state(page, row["name"]) == "READY"
    # The filter narrows 1,000 names to one, fast; scrolling reaches the last model.
    started = time.monotonic()
    page.fill("[data-testid=model-filter]", "bulk_0999")
    page.wait_for_selector('[data-model="bulk_0999"]')
    assert time.monotonic() - started < 2.0
    assert page.locator("[data-testid=model-rows] [data-model]").count() == 1
    page.fill("[data-testid=model-filter]", "bulk_")
    assert page.locator("[data-testid=model-count]").inner_text() == f"{MANY} of {len(index)} model versions"
    page.locator("[data-testid=model-rows]").evaluate("body => body.scrollTop = body.scrollHeight")
    page.wait_for_selector('[data-model="bulk_0999"]')
    page.fill("[data-testid=model-filter]", "add_sub_python")
    page.click('[data-model="add_sub_python"]')
    config = json.loads(page.locator("[data-testid=config-json]").inner_text())
    assert config["name"] == "add_sub_python" and config["backend"] == "python"
    row = page.locator('[data-model="add_sub_python"]')
    assert "python" in row.inner_text() and "1×CPU" in row.inner_text() and "max 64" in row.inner_text()


def _act(page: Any, action: str) -> str:
    page.click(f"[data-testid=action-{action}]")
    page.click("[data-testid=confirm-yes]")
    outcome = page.locator("[data-testid=action-outcome]")
    outcome.wait_for()
    return str(outcome.inner_text())


def test_unload_then_load_changes_the_state_shown(page: Any, server: RunningServer) -> None:
    _open(page, server)
    page.fill("[data-testid=model-filter]", "simple")
    page.click('[data-model="simple"]')
    # Cancelling the confirmation does nothing.
    page.click("[data-testid=action-unload]")
    page.click("[data-testid=confirm-no]")
    assert page.locator("[data-testid=action-outcome]").count() == 0
    assert _row_state(page, "simple") == "READY"
    assert "succeeded" in _act(page, "unload")
    page.wait_for_function("() => document.querySelector('[data-model=\"simple\"]').dataset.state === 'UNAVAILABLE'")
    assert requests.get(f"{server.base}/v2/models/simple/ready", timeout=10).status_code == 400
    assert "succeeded" in _act(page, "load")
    page.wait_for_function("() => document.querySelector('[data-model=\"simple\"]').dataset.state === 'READY'")
    assert requests.get(f"{server.base}/v2/models/simple/ready", timeout=10).status_code == 200
    # Reload loads it again from the repository (the server logs a second load) and leaves it READY.
    loads = server.log().count("successfully loaded 'simple'")
    page.click("[data-testid=action-reload]")
    page.click("[data-testid=confirm-yes]")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=action-outcome]')?.textContent === \"Reload of 'simple' succeeded.\""
    )
    deadline = time.monotonic() + 10
    while server.log().count("successfully loaded 'simple'") <= loads and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.log().count("successfully loaded 'simple'") == loads + 1
    assert _row_state(page, "simple") == "READY"
    # A load that fails shows the server's own error.
    page.fill("[data-testid=model-filter]", "broken_model")
    page.click('[data-model="broken_model"]')
    message = _act(page, "load")
    reply = requests.post(f"{server.base}/v2/repository/models/broken_model/load", headers=HEADER, timeout=30)
    assert reply.status_code >= 400 and message == reply.json()["error"]


def test_charts_update_under_load_from_nereid_perf(page: Any, server: RunningServer) -> None:
    _open(page, server, "traffic")
    page.wait_for_selector("[data-testid=traffic-model] option[value=add_sub_python]", state="attached")
    page.select_option("[data-testid=traffic-model]", "add_sub_python")
    page.wait_for_selector("[data-testid=model-rps]")
    perf = subprocess.Popen(
        [sys.executable, "-m", "nereid", "perf", "-m", "add_sub_python", "-u", server.http_url, "--concurrency-range", "2:2:1",
         "-p", "1500", "-r", "4", "-q"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        page.wait_for_function(
            "() => parseFloat(document.querySelector('[data-testid=model-rps]').textContent) > 1", timeout=30000
        )
        assert float(page.locator("[data-testid=server-rps]").inner_text()) > 1
        points = int(page.locator('[data-testid="chart-model requests"]').get_attribute("data-points"))
        page.wait_for_function(
            f"() => +document.querySelector('[data-testid=\"chart-model requests\"]').dataset.points > {points}", timeout=10000
        )
        assert page.locator("[data-testid=batch-sizes]").inner_text().startswith("Executions by batch size")
        assert page.locator("[data-testid=model-infer]").inner_text() not in ("–", "")
        # p50 and p99 of each stage (queue, compute input, infer, output), from the latency summaries.
        quantiles = page.locator('[data-testid="chart-model latency p50 / p99"]')
        assert int(quantiles.get_attribute("data-points")) > 0
        assert [label.strip() for label in quantiles.locator(".u-legend .u-label").all_inner_texts()][-8:] == [
            f"{stage} {q}" for stage in ("queue", "compute input", "infer", "output") for q in ("p50", "p99")
        ]
        page.wait_for_function("() => !['–', ''].includes(document.querySelector('[data-testid=model-p99]').textContent)")
    finally:
        perf.kill()
        perf.wait()


def test_failures_per_second_follow_failing_requests(page: Any, server: RunningServer) -> None:
    """tensor_kinds fails a request whose TEXT is not UTF-8 (its model raises): the live view counts it."""
    import threading

    import tritonclient.http as httpclient

    _open(page, server, "traffic")
    page.wait_for_selector("[data-testid=traffic-model] option[value=tensor_kinds]", state="attached")
    page.select_option("[data-testid=traffic-model]", "tensor_kinds")
    page.wait_for_selector("[data-testid=model-fps]")
    stop = threading.Event()
    failed: list[str] = []

    def fail_requests() -> None:
        with httpclient.InferenceServerClient(server.http_url) as client:
            for _ in range(600):  # bounded: at most a minute of requests
                if stop.is_set():
                    return
                tensor = httpclient.InferInput("TEXT", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([b"\xff"], dtype=np.object_))
                try:
                    client.infer("tensor_kinds", [tensor])
                except Exception as exc:  # the model's own failure, as the client sees it
                    failed.append(str(exc))
                stop.wait(0.1)

    sender = threading.Thread(target=fail_requests)
    sender.start()
    try:
        page.wait_for_function("() => parseFloat(document.querySelector('[data-testid=model-fps]').textContent) > 0")
        page.wait_for_function("() => parseFloat(document.querySelector('[data-testid=server-fps]').textContent) > 0")
    finally:
        stop.set()
        sender.join(30)
    assert failed and all("tensor_kinds" in text or "decode" in text for text in failed), failed[:1]


def test_try_it_form_returns_the_sum_and_difference_for_add_sub(page: Any, server: RunningServer) -> None:
    _open(page, server, "tryit")
    page.wait_for_selector("[data-testid=tryit-model] option[value=add_sub_python]", state="attached")
    page.select_option("[data-testid=tryit-model]", "add_sub_python")
    page.fill("[data-testid=input-INPUT0]", "1, 2, 3, 4")
    page.fill("[data-testid=input-INPUT1]", "10 20 30 40")
    page.click("[data-testid=infer-send]")
    page.wait_for_selector("[data-testid=infer-result]")
    sums = page.locator("[data-testid=output-OUTPUT0] td").all_inner_texts()
    differences = page.locator("[data-testid=output-OUTPUT1] td").all_inner_texts()
    assert [float(v) for v in sums] == [11, 22, 33, 44]
    assert [float(v) for v in differences] == [-9, -18, -27, -36]
    # A bad shape shows the server's error, naming the model and the tensor.
    page.fill("[data-testid=shape-INPUT0]", "1, 3")
    page.fill("[data-testid=input-INPUT0]", "1 2 3")
    page.click("[data-testid=infer-send]")
    error = page.locator("[data-testid=infer-error]").inner_text()
    assert "add_sub_python" in error and "INPUT0" in error


def test_try_it_shows_bytes_as_text_and_image_shaped_outputs_as_images(page: Any, server: RunningServer) -> None:
    _open(page, server, "tryit")
    page.wait_for_selector("[data-testid=tryit-model] option[value=tensor_kinds]", state="attached")
    page.select_option("[data-testid=tryit-model]", "tensor_kinds")
    page.fill("[data-testid=input-TEXT]", "quiet words")
    page.click("[data-testid=infer-send]")
    page.wait_for_selector("[data-testid=infer-result]")
    assert page.locator("[data-testid=output-SHOUTED] pre").inner_text() == "QUIET WORDS"
    image = page.locator("[data-testid=output-PICTURE] img")
    page.wait_for_function("() => document.querySelector('[data-testid=output-PICTURE] img').naturalWidth === 16")
    red = image.evaluate(
        """img => { const c = document.createElement('canvas'); c.width = 16; c.height = 16; const g = c.getContext('2d');
        g.drawImage(img, 0, 0); return Array.from(g.getImageData(8, 8, 1, 1).data); }"""
    )
    assert red == [255, 0, 0, 255]


def test_chat_box_streams_tokens_from_the_llm(page: Any, server: RunningServer) -> None:
    if not server.extra["llm"]:
        pytest.skip("the LLM backend's frameworks (torch, transformers) are not installed")
    _open(page, server, "tryit")
    page.wait_for_selector("[data-testid=tryit-model] option[value=chat_llm]", state="attached")
    page.select_option("[data-testid=tryit-model]", "chat_llm")
    page.fill("[data-testid=chat-input]", "Hello there")
    # Record every length the reply passes through: a stream shows it grow in several steps.
    page.evaluate(
        """() => {
        window.replyLengths = [];
        new MutationObserver(() => {
          const reply = document.querySelector('[data-role=assistant] span');
          if (reply) window.replyLengths.push(reply.textContent.length);
        }).observe(document.querySelector('[data-testid=chat-messages]'), {subtree: true, childList: true, characterData: true});
      }"""
    )
    page.click("[data-testid=chat-send]")
    page.wait_for_function("() => document.querySelector('[data-testid=chat-send]').textContent === 'Send'", timeout=60000)
    assert page.locator("[data-testid=chat-error]").count() == 0
    reply = page.locator("[data-role=assistant] span").inner_text()
    lengths = sorted(set(page.evaluate("window.replyLengths")) - {0})
    assert reply and len(lengths) >= 3, lengths
    # The live view's LLM figures come from the engine that produced them.
    llm = requests.get(f"{server.base}/dashboard/api/live?model=chat_llm", headers=HEADER, timeout=10).json()["model"]["llm"]
    assert llm["generation_tokens"] > 0 and llm["ttft_count"] >= 1 and llm["running"] == 0
    # The paged KV cache's figures: the pool's blocks (all back once the reply is done) and the prefix cache.
    assert llm["kv_blocks_used"] == 0 and llm["kv_blocks_free"] > 0 and llm["prefix_cache_queries"] > 0
    assert llm["preemptions"] == 0 and llm["refused"] == 0
    # ... and the live view charts them for the LLM: tokens/s, and running and waiting sequences with TTFT.
    _open(page, server, "traffic")
    page.wait_for_selector("[data-testid=traffic-model] option[value=chat_llm]", state="attached")
    page.select_option("[data-testid=traffic-model]", "chat_llm")
    for title, labels in (("LLM tokens", ["tokens/s"]), ("LLM sequences", ["running", "waiting", "TTFT ms"])):
        chart = page.locator(f'[data-testid="chart-{title}"]')
        chart.wait_for()
        shown = [label.strip() for label in chart.locator(".u-legend .u-label").all_inner_texts() if label.strip()]
        assert all(label in shown for label in labels), (title, shown)
    page.wait_for_function("() => +document.querySelector('[data-testid=\"chart-LLM tokens\"]').dataset.points > 0")
    assert "blocks" in page.locator("[data-testid=llm-kv]").inner_text()
    assert page.locator("[data-testid=llm-preemptions]").inner_text() == "0"
    assert page.locator("[data-testid=llm-refused]").inner_text() == "0"


_FAKE_GPU = {"index": 0, "utilization": 0.37, "used_bytes": 2 * 1024**3, "total_bytes": 80 * 1024**3}


def test_gpus_are_shown_where_present_and_hidden_otherwise(page: Any, server: RunningServer) -> None:
    _open(page, server, "traffic")
    page.wait_for_function("() => document.querySelector('[data-testid=server-rss]').textContent !== '–'")
    gpus = requests.get(f"{server.base}/dashboard/api/live", headers=HEADER, timeout=10).json()["process"]["gpus"]
    # What this machine has (none without an NVIDIA driver): one readout per GPU, no empty GPU row otherwise.
    assert page.locator("[data-testid^=gpu-]").count() == len(gpus)
    # A server that reads a GPU through NVML: the page shows its utilisation and memory.

    def with_a_gpu(route: Any) -> None:
        answer = route.fetch()
        snapshot = answer.json()
        snapshot["process"]["gpus"] = [_FAKE_GPU]
        route.fulfill(response=answer, json=snapshot)

    page.route("**/dashboard/api/live*", with_a_gpu)
    readout = page.locator("[data-testid=gpu-0]")
    readout.wait_for()
    assert readout.inner_text() == "37% · 2.0 GiB of 80.0 GiB"
    page.unroute("**/dashboard/api/live*")
    page.wait_for_function("() => document.querySelectorAll('[data-testid^=gpu-]').length === " + str(len(gpus)))


def test_reports_view_lists_the_analyze_reports_with_their_charts(page: Any, server: RunningServer) -> None:
    _open(page, server, "reports")
    page.wait_for_selector("[data-testid=report]")
    assert "simple-run" in page.locator("[data-testid=report-list]").inner_text()
    assert "batch8" in page.locator("[data-testid=report]").inner_text()
    page.wait_for_function("() => [...document.querySelectorAll('.report-charts img')].some(i => i.naturalWidth === 16)")
    frame = page.frame_locator("iframe[title=report]")
    assert frame.locator("h1").inner_text() == "analyze report"
