"""Takes the screenshots of docs/images/dashboard-*.png: a real server (the examples, two models of one group so
that one gets evicted, the tiny LLM, and model `m` of docs/rollouts.md whose version 2 fails one request in five), a
short real `nereid analyze` run for the reports view, traffic from `nereid perf`, a rollout of `m` from version 1
to 2 that its gate rolls back, and Playwright driving Debian's chromium through each view.

    .venv/bin/python dashboard/screenshots.py docs/images                  # all of them
    .venv/bin/python dashboard/screenshots.py docs/images --only rollouts  # the two of the rollouts view
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.rollout_models import versioned_python_model  # noqa: E402
from tests.servers import RunningServer, start_nereid  # noqa: E402

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


# The rollout of the screenshots: version 2 of `m` answers Y = X + 2 (version 1: X + 1) and fails every fifth request.
# The canary step's gate judges once the candidate has 200 requests, so the first picture shows the step with its
# figures under way, and the second the rollback that follows.
ROLLOUT_STEPS = "canary=10%/120s:200,canary=50%/120s"
# The clients' inputs are shifted by 0.4 standard deviations from the reference: a PSI between 0.1 and 0.25.
INPUT_SHIFT = 0.4


def _rollout_model(repo: Path) -> None:
    """Model `m` (tests/integration/rollout_models.py) with a reference.npz for version 1: X ~ N(0, 1), Y = X + 1."""
    folder = versioned_python_model(repo, "m", v2_fail_every="5", v2_offset="2")
    x = np.random.default_rng(7).normal(0, 1, (2000, 1)).astype(np.float32)
    np.savez(folder / "1" / "reference.npz", X=x, **{"output:Y": x + 1})


class _Traffic:
    """Clients of model `m` naming no version, one after another at about `rate` requests a second."""

    def __init__(self, server: RunningServer, rate: float) -> None:
        self.url = f"{server.base}/v2/models/m/infer"
        self.rate = rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, value: float, session: Any = requests) -> None:
        """One request; version 2's failures (what the gate counts) are answers like any other here."""
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}
        session.post(self.url, data=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)

    def _run(self) -> None:
        rng = np.random.default_rng(11)
        with requests.Session() as session:
            while not self.stop.is_set():
                self.send(float(rng.normal(INPUT_SHIFT, 1)), session)
                time.sleep(1 / self.rate)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _rollout(server: RunningServer, path: str = "", body: dict[str, Any] | None = None) -> dict[str, Any]:
    url = f"{server.base}/v2/nereid/rollouts/m{path}"
    reply = requests.post(url, json=body, timeout=30) if body is not None else requests.get(url, timeout=30)
    reply.raise_for_status()
    result: dict[str, Any] = reply.json()
    return result


def _rollout_shots(page: Any, server: RunningServer, out: Path) -> None:
    """dashboard-rollouts.png (the canary step under way) and dashboard-rollout-rolled-back.png (its gate failed)."""
    page.goto(f"{server.base}/dashboard#rollouts")
    page.wait_for_selector("[data-testid=start-model] option[value=m]", state="attached")
    page.fill("[data-testid=start-steps]", ROLLOUT_STEPS)
    page.click("[data-testid=start-send]")  # before any traffic: without a rollout, version 2 (the newest) would answer
    page.wait_for_selector("[data-testid=rollout][data-model=m]")
    traffic = _Traffic(server, rate=60)
    try:
        for value in (float("nan"),) * 6 + (9.0,):  # data-quality issues: NaN, and out of the reference's range
            traffic.send(value)
        # Live figures: the candidate has some of its 200 requests, some of them failed, the gate still waits.
        deadline = time.monotonic() + 60
        while _rollout(server)["versions"]["2"]["requests"] < 90 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.2)  # one more refresh of the page
        page.screenshot(path=str(out / "dashboard-rollouts.png"), full_page=True)
        traffic.rate = 200
        deadline = time.monotonic() + 90
        while _rollout(server)["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        status = _rollout(server)
        if status["state"] != "rolled_back":
            raise RuntimeError(f"the rollout of m was not rolled back: {status}")
        time.sleep(4)  # traffic after the rollback, all to version 1, shows in the monitoring figures
        page.wait_for_selector("[data-testid=rollout][data-state=rolled_back] [data-testid=rollout-reason]")
        page.screenshot(path=str(out / "dashboard-rollout-rolled-back.png"), full_page=True)
    finally:
        traffic.close()


def _rollouts_only(out: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="dashboard-shots-"))
    _rollout_model(work / "repo")
    server = start_nereid(work / "repo", "--model-control-mode=explicit", "--load-model=m", timeout=120)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            _rollout_shots(page, server, out)
            browser.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Takes the dashboard's screenshots of docs/images.")
    parser.add_argument("out", nargs="?", default="docs/images")
    parser.add_argument("--only", choices=["rollouts"], help="take only these screenshots (by default: all of them)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Debian's chromium is needed (make system-deps)")
    if args.only == "rollouts":
        _rollouts_only(out, chromium)
        print(f"screenshots written to {out}")
        return 0
    from playwright.sync_api import sync_playwright

    from nereid.backends.llm.tiny_model import write_vllm_model

    work = Path(tempfile.mkdtemp(prefix="dashboard-shots-"))
    extra = work / "repo"
    extra.mkdir()
    _grouped_copies(extra)
    _rollout_model(extra)
    write_vllm_model(extra, "chat_llm", {"max_model_len": 256, "max_num_seqs": 4, "cpu_threads": 1}, cached=True)
    reports = work / "reports"
    subprocess.run(
        [sys.executable, "-m", "nereid", "analyze", "-m", "simple", "--model-repository", str(EXAMPLES), "-o", str(reports / "simple-quick"),
         "--time-budget-s", "20", "--concurrency", "1,2", "--measurement-interval-ms", "300", "--max-trials", "4", "--stability-percentage", "50"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    server = start_nereid(
        [EXAMPLES, extra], "--model-control-mode=explicit", "--load-model=add_sub_python", "--load-model=simple",
        "--load-model=simple_string", "--load-model=chat_llm", "--load-model=m", "--model-load-on-demand=true", "--model-memory-budget=4GiB",
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
            _rollout_shots(page, server, out)
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
