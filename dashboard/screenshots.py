"""Takes the screenshots of docs/images/dashboard-*.png: a real server (the examples, two models of one group so
that one gets evicted, the tiny LLM), a short real `nereid analyze` run for the reports view, traffic from
`nereid perf`, and Playwright driving Debian's chromium through each view.

    .venv/bin/python dashboard/screenshots.py docs/images
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_nereid  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"


def _grouped_copies(repo: Path) -> None:
    """Two copies of add_sub_python in group 'demo' (limit 1): using the second evicts the first."""
    source = EXAMPLES / "add_sub_python"
    for name in ("tenant_a", "tenant_b"):
        target = repo / name
        shutil.copytree(source, target)
        config = (source / "config.pbtxt").read_text().replace('name: "add_sub_python"', f'name: "{name}"')
        config += '\nparameters { key: "nereid.group" value { string_value: "demo" } }\n'
        (target / "config.pbtxt").write_text(config)


def _infer(base: str, model: str) -> None:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]} for n in ("INPUT0", "INPUT1")]}
    requests.post(f"{base}/v2/models/{model}/infer", json=body, timeout=60).raise_for_status()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images").resolve()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Debian's chromium is needed (make system-deps)")
    from playwright.sync_api import sync_playwright

    from nereid.backends.llm.tiny_model import write_vllm_model

    work = Path(tempfile.mkdtemp(prefix="dashboard-shots-"))
    extra = work / "repo"
    extra.mkdir()
    _grouped_copies(extra)
    write_vllm_model(extra, "chat_llm", {"max_model_len": 256, "max_num_seqs": 4, "cpu_threads": 1}, cached=True)
    reports = work / "reports"
    subprocess.run(
        [sys.executable, "-m", "nereid", "analyze", "-m", "simple", "--model-repository", str(EXAMPLES), "-o", str(reports / "simple-quick"),
         "--time-budget-s", "20", "--concurrency", "1,2", "--measurement-interval-ms", "300", "--max-trials", "4", "--stability-percentage", "50"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    server = start_nereid(
        [EXAMPLES, extra], "--model-control-mode=explicit", "--load-model=add_sub_python", "--load-model=simple",
        "--load-model=simple_string", "--load-model=chat_llm", "--model-load-on-demand=true", "--model-memory-budget=4GiB",
        "--model-group-limit=demo:1", "--metrics-config=summary_latencies=true", f"--dashboard-reports-dir={reports}", timeout=180,
    )  # fmt: skip
    perf = None
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(f"{server.base}/dashboard#memory")  # open first, so the memory view sees the loads and evictions
            time.sleep(1.5)
            _infer(server.base, "tenant_a")  # a cold start
            _infer(server.base, "tenant_b")  # a cold start that evicts tenant_a (group limit)
            time.sleep(1.5)
            page.screenshot(path=str(out / "dashboard-memory.png"))
            page.goto(f"{server.base}/dashboard#models")
            page.wait_for_selector("[data-model]")
            page.click('[data-model="add_sub_python"]')
            page.wait_for_selector("[data-testid=config-json]")
            page.screenshot(path=str(out / "dashboard-models.png"))
            perf = subprocess.Popen(
                [sys.executable, "-m", "nereid", "perf", "-m", "add_sub_python", "-u", server.http_url, "--concurrency-range", "4:4:1",
                 "-p", "20000", "-r", "3", "-q"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            page.goto(f"{server.base}/dashboard#traffic")
            page.wait_for_selector("[data-testid=traffic-model] option[value=add_sub_python]", state="attached")
            page.select_option("[data-testid=traffic-model]", "add_sub_python")
            time.sleep(20)
            page.screenshot(path=str(out / "dashboard-traffic.png"), full_page=True)
            perf.kill()
            page.goto(f"{server.base}/dashboard#tryit")
            page.wait_for_selector("[data-testid=tryit-model] option[value=add_sub_python]", state="attached")
            page.select_option("[data-testid=tryit-model]", "add_sub_python")
            page.fill("[data-testid=input-INPUT0]", "1, 2, 3, 4")
            page.fill("[data-testid=input-INPUT1]", "10, 20, 30, 40")
            page.click("[data-testid=infer-send]")
            page.wait_for_selector("[data-testid=infer-result]")
            page.screenshot(path=str(out / "dashboard-tryit.png"))
            page.select_option("[data-testid=tryit-model]", "chat_llm")
            page.fill("[data-testid=chat-input]", "Write a short poem about the sea")
            page.click("[data-testid=chat-send]")
            page.wait_for_function("() => document.querySelector('[data-testid=chat-send]').textContent === 'Send'", timeout=60000)
            page.screenshot(path=str(out / "dashboard-chat.png"))
            page.goto(f"{server.base}/dashboard#reports")
            page.wait_for_selector("[data-testid=report]")
            page.wait_for_function("() => [...document.querySelectorAll('.report-charts img')].every(i => i.complete)")
            page.screenshot(path=str(out / "dashboard-reports.png"))
            browser.close()
    finally:
        if perf is not None:
            perf.kill()
            perf.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"screenshots written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
