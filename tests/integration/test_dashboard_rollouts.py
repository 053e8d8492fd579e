"""The dashboard's Rollouts view against a real `nereid serve` whose model `m` has a version 2 failing one request
in five (tests/integration/rollout_models.py): the monitoring JSON it reads, and in a real browser (Playwright driving
Debian's chromium) a rollout started from the form, paused and resumed, refused while one is open with the server's
own message, rolled back by its gate with the reason and history the API gives, promoted then undone through the
confirmations, and the drift of each tensor marked against the thresholds of docs/monitoring.md."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests

from tests.integration.rollout_models import versioned_python_model
from tests.servers import RunningServer, start_nereid

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system-deps)")
# docs/monitoring.md: above 0.1 a shift worth a look, above 0.25 a large shift (dashboard/src/rollouts.js).
PSI_WATCH, PSI_DRIFT = 0.1, 0.25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    folder = versioned_python_model(repo, "m", v2_fail_every="5", v2_offset="2")
    x = np.random.default_rng(3).normal(0, 1, (2000, 1)).astype(np.float32)
    np.savez(folder / "1" / "reference.npz", X=x, **{"output:Y": x + 1})  # version 1's reference: X ~ N(0, 1)
    # Every request sampled: the tests count what each one carried.
    server = start_nereid(repo, "--model-control-mode=explicit", "--load-model=m", "--monitoring-samples-per-second=100000",
                          log_dir=tmp_path_factory.mktemp("logs"))  # fmt: skip
    yield server
    assert server.stop() == 0, server.log()


def _send(server: RunningServer, value: float, version: str = "") -> int:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}
    path = f"/v2/models/m/versions/{version}/infer" if version else "/v2/models/m/infer"
    reply = requests.post(f"{server.base}{path}", data=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)
    return reply.status_code


def _get(server: RunningServer, path: str) -> Any:
    reply = requests.get(f"{server.base}{path}", timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _monitored(server: RunningServer, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        view: dict[str, Any] = _get(server, "/dashboard/api/monitoring")
        if until(view) or time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def _version(view: dict[str, Any], version: str) -> dict[str, Any]:
    found = [v for v in view["versions"] if v["model"] == "m" and v["version"] == version]
    return found[0] if found else {}


def test_monitoring_json_gives_each_tensors_drift_and_the_data_quality_issues(server: RunningServer) -> None:
    for value in np.random.default_rng(5).normal(3, 1, 120):  # three standard deviations off the reference
        assert _send(server, float(value), version="1") == 200
    assert _send(server, float("nan"), version="1") == 200

    def drifted(view: dict[str, Any]) -> bool:
        tensors = {t["name"]: t for t in _version(view, "1").get("tensors", [])}
        return "X" in tensors and tensors["X"]["psi"] > PSI_DRIFT and any(q["issue"] == "nan" for q in _version(view, "1")["quality"])

    view = _monitored(server, drifted)
    assert view["active"] and view["window_seconds"] == 60 and view["sampled"] >= 1
    v1 = _version(view, "1")
    assert v1["reference"].endswith("reference.npz")
    tensors = {(t["direction"], t["name"]): t for t in v1["tensors"]}
    assert set(tensors) == {("input", "X"), ("output", "Y")}
    assert tensors[("input", "X")]["psi"] > PSI_DRIFT and 0 < tensors[("input", "X")]["ks"] <= 1
    assert tensors[("input", "X")]["samples"] > 0
    assert {"tensor": "in:X", "issue": "nan", "count": 1} in v1["quality"]
    # The same figures as the metrics, which the page cannot read (another port, another origin).
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'nereid_data_quality_issues_total{issue="nan",model="m",tensor="in:X",version="1"} 1' in metrics.splitlines()
    assert requests.post(f"{server.base}/dashboard/api/monitoring", timeout=10).status_code == 405


@pytest.fixture
def page(server: RunningServer) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{server.base}/dashboard?interval=300#rollouts")
        yield page
        browser.close()
    assert not errors, f"the page raised: {errors}"


def _status(server: RunningServer) -> dict[str, Any]:
    status: dict[str, Any] = _get(server, "/v2/nereid/rollouts/m")
    return status


def _card_state(page: Any, state: str) -> None:
    page.wait_for_selector(f"[data-testid=rollout][data-model=m][data-state={state}]")


def _start(page: Any, steps: str) -> str:
    page.wait_for_selector("[data-testid=start-model] option[value=m]", state="attached")
    assert page.locator("[data-testid=start-version]").input_value() == "2"  # the newest ready version by default
    page.fill("[data-testid=start-steps]", steps)
    page.click("[data-testid=start-send]")
    outcome = page.locator("[data-testid=start-outcome]")
    outcome.wait_for()
    return str(outcome.inner_text())


def _enabled(page: Any) -> set[str]:
    return {a for a in ("pause", "resume", "abort", "promote", "undo") if page.locator(f"[data-testid=rollout-{a}]").is_enabled()}


@needs_chromium
def test_a_rollout_started_from_the_page_is_paused_resumed_and_rolled_back_by_its_gate(page: Any, server: RunningServer) -> None:
    assert _start(page, "canary=50%/60s:20,canary=100%/60s") == "Rollout of m started: version 2 against 1."
    _card_state(page, "running")
    assert _status(server)["steps"] == "canary=50%/60s:20,canary=100%/60s"
    assert "(1 of 2): canary 50%" in page.locator("[data-testid=rollout-step]").inner_text()
    assert _enabled(page) == {"pause", "abort", "promote"}
    # Pause needs no confirmation; the primary then answers everything.
    page.click("[data-testid=rollout-pause]")
    _card_state(page, "paused")
    assert _status(server)["state"] == "paused" and _enabled(page) == {"resume", "abort", "promote"}
    # A second rollout while this one is open: the server's own message, word for word.
    message = _start(page, "canary=10%/60s")
    reply = requests.post(f"{server.base}/v2/nereid/rollouts/m/start", json={"version": "2", "steps": "canary=10%/60s"}, timeout=10)
    assert reply.status_code == 400 and message == reply.json()["error"]
    assert page.locator("[data-testid=start-outcome]").get_attribute("class") == "error"
    page.click("[data-testid=rollout-resume]")
    _card_state(page, "running")
    # Traffic: version 2 fails one request in five, the gate judges at its 20 candidate requests and rolls back.
    for _ in range(200):
        _send(server, 0.0)
        if _status(server)["state"] != "running":
            break
    status = _status(server)
    assert status["state"] == "rolled_back" and "error rate" in status["reason"]
    _card_state(page, "rolled_back")
    assert page.locator("[data-testid=rollout-reason]").inner_text() == status["reason"]
    assert _enabled(page) == set()
    figures = {row.get_attribute("data-figure"): row for row in page.locator("[data-testid=rollout-figures] tbody tr").all()}
    page.wait_for_function(
        "n => document.querySelector('[data-figure=requests] [data-testid=candidate]').textContent === String(n)", arg=status["versions"]["2"]["requests"]
    )
    assert figures["errors"].locator("[data-testid=candidate]").inner_text() == str(status["versions"]["2"]["errors"])
    assert figures["requests"].locator("[data-testid=primary]").inner_text() == str(status["versions"]["1"]["requests"])
    history = _get(server, "/v2/nereid/rollouts/m/history")["history"]
    assert [e["event"] for e in history] == ["started", "paused", "resumed", "rolled_back"]
    shown = page.locator("[data-testid=rollout-history] li b").all_inner_texts()
    assert shown == [e["event"] for e in history]


@needs_chromium
def test_promote_and_undo_ask_first_and_the_drift_is_marked(page: Any, server: RunningServer) -> None:
    status = _status(server) if requests.get(f"{server.base}/v2/nereid/rollouts/m", timeout=10).ok else {}
    if status.get("state") in ("running", "paused"):
        requests.post(f"{server.base}/v2/nereid/rollouts/m/abort", timeout=10).raise_for_status()
    _start(page, "canary=10%/1h:100000")
    _card_state(page, "running")
    # Cancelling the confirmation changes nothing.
    page.click("[data-testid=rollout-promote]")
    assert "Promote version 2 of m" in page.locator("[data-testid=rollout-confirm]").inner_text()
    page.click("[data-testid=confirm-no]")
    assert page.locator("[data-testid=rollout-outcome]").count() == 0 and _status(server)["state"] == "running"
    page.click("[data-testid=rollout-promote]")
    page.click("[data-testid=confirm-yes]")
    _card_state(page, "promoted")
    assert page.locator("[data-testid=rollout-outcome]").inner_text() == "Promote: the rollout of m is now promoted."
    assert _enabled(page) == {"undo"} and _send(server, 0.0) in (200, 400, 500)  # version 2 answers now
    page.click("[data-testid=rollout-undo]")
    assert "Version 1 takes full traffic again" in page.locator("[data-testid=rollout-confirm]").inner_text()
    page.click("[data-testid=confirm-yes]")
    _card_state(page, "rolled_back")
    assert page.locator("[data-testid=rollout-reason]").inner_text() == _status(server)["reason"] == "promotion undone by hand"
    # Drift: each tensor's PSI cell is marked as docs/monitoring.md reads it, as the monitoring JSON gives it.
    for value in [*np.random.default_rng(9).normal(3, 1, 60), float("nan")]:
        _send(server, float(value), version="1")

    def seen(view: dict[str, Any]) -> bool:
        v1 = _version(view, "1")
        return any(t["psi"] > PSI_DRIFT for t in v1.get("tensors", [])) and any(q["issue"] == "nan" for q in v1.get("quality", []))

    view = _monitored(server, seen)
    page.wait_for_function("() => document.querySelector('[data-testid=monitoring] tr[data-version=\"1\"][data-tensor=\"in:X\"] [data-testid=quality]')?.textContent.includes('nan')")
    drifted = [t for t in _version(view, "1")["tensors"] if t["psi"] > PSI_DRIFT]
    assert drifted
    for tensor in drifted:  # a large shift stays one while the window moves
        key = ("in:" if tensor["direction"] == "input" else "out:") + tensor["name"]
        cell = page.locator(f'[data-testid=monitoring] tr[data-version="1"][data-tensor="{key}"] [data-testid=psi][data-level=drift]')
        cell.wait_for()
        assert cell.inner_text().endswith("drift") and float(cell.inner_text().split()[0]) > PSI_DRIFT
    assert "nan" in page.locator('[data-testid=monitoring] tr[data-version="1"][data-tensor="in:X"] [data-testid=quality]').inner_text()
