"""What monitoring and rollouts cost the requests they watch, in one run:

- overhead: throughput, p99 and the server's CPU time per request at c=16 (wrk, HTTP JSON) on the Python add_sub
  model and the ONNX `simple` model, with monitoring off and no rollout (off) against: monitoring on at its default
  sampling; that and a canary step at 0.01% (the rollout's routing and windows on every request, one request in
  10,000 to the candidate); a canary at 10% (a second version serving, in its own instance) with monitoring off and
  with monitoring on (what monitoring costs while a canary runs). Servers alternate through the cases, each fresh;
- shadow: the primary's throughput at c=16, and its p99 under perf_analyzer's request-rate mode at 300 requests a
  second (what a user feels on a server with room to spare), with no rollout against a shadow step copying 100% of
  the requests to the candidate (the client's answers all come from the primary);
- rollback: a candidate failing one request in five under a 20% canary step needing 50 candidate requests, driven by
  4 client threads: the time from the request that gave the step its 50th candidate answer (the first moment the
  gate can fail) to the last request any client got from the candidate, and the failures the clients saw.

The repository is the example models with versions 1 and 2 of each (the same model twice, version_policy all).

    .venv/bin/python benchmarks/bench_rollouts.py [--seconds 10] [--rounds 2] [--out benchmarks/results/rollouts.md]

Needs wrk (`apt-get install -y wrk`); perf_analyzer is installed into a cache on first use (tests/perf_analyzer.py).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from loadgen import LoadResult, http_json_body, run_wrk  # noqa: E402
from tests.integration.rollout_models import versioned_python_model  # noqa: E402
from tests.perf_analyzer import PerfAnalyzer, install_perf_analyzer  # noqa: E402
from tests.servers import RunningServer, start_nereid  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"
MODELS = {
    "add_sub_python": {"INPUT0": np.ones((1, 4), dtype=np.float32), "INPUT1": np.ones((1, 4), dtype=np.float32)},
    "simple": {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)},
}
CANARY = "canary=10%/3600s:100000000"
CANARY_ROUTING = "canary=0.01%/3600s:100000000"
SHADOW = "shadow=100%/3600s:100000000"


def build_repository(root: Path) -> Path:
    repository = root / "models"
    for model in MODELS:
        source = EXAMPLES / model
        target = repository / model
        shutil.copytree(source, target)
        shutil.copytree(source / "1", target / "2")
        config = target / "config.pbtxt"
        config.write_text(config.read_text() + "\nversion_policy { all { } }\n")
    return repository


def serve(repository: Path, monitoring: bool, rollout: str, logs: Path) -> RunningServer:
    flags = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in MODELS), "--log-info=false"]
    if not monitoring:
        flags.append("--monitoring-samples-per-second=0")
    server = start_nereid(repository, *flags, log_dir=logs)
    if rollout:
        for model in MODELS:
            answer = requests.post(f"{server.base}/v2/nereid/rollouts/{model}/start",
                                   json={"version": "2", "steps": rollout}, timeout=30)  # fmt: skip
            answer.raise_for_status()
    return server


@dataclass(frozen=True)
class Cell:
    """One wrk run, and the CPU time the server's processes (the server, its fork server and Python workers) spent
    per request meanwhile: steadier than throughput on a shared machine, where wrk takes its share of 2 cores."""

    load: LoadResult
    cpu_us_per_request: float


def _server_cpu_seconds(pid: int) -> float:
    processes = [psutil.Process(pid)]
    processes += processes[0].children(recursive=True)
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def drive(server: RunningServer, model: str, seconds: float) -> Cell:
    body, headers = http_json_body(MODELS[model])
    url = f"{server.base}/v2/models/{model}/infer"
    run_wrk(url, body, headers, 16, 2)  # warm-up
    before = _server_cpu_seconds(server.process.pid)
    load = run_wrk(url, body, headers, 16, seconds)
    spent = _server_cpu_seconds(server.process.pid) - before
    return Cell(load, spent / max(1.0, load.requests_per_s * seconds) * 1e6)


def compare(
    repository: Path, logs: Path, cases: dict[str, tuple[bool, str]], seconds: float, rounds: int
) -> dict[str, dict[str, list[Cell]]]:
    results: dict[str, dict[str, list[Cell]]] = {case: {m: [] for m in MODELS} for case in cases}
    for _ in range(rounds):
        for case, (monitoring, rollout) in cases.items():
            server = serve(repository, monitoring, rollout, logs)
            try:
                for model in MODELS:
                    results[case][model].append(drive(server, model, seconds))
            finally:
                server.stop()
            time.sleep(1)
    return results


def paced_p99_ms(
    analyzer: PerfAnalyzer, server: RunningServer, model: str, per_second: int, seconds: float, csv: Path
) -> float:
    """The p99 latency, in ms, of requests perf_analyzer sends on a fixed schedule (its request-rate mode, which
    counts each request from its scheduled time, so a backed-up server is not hidden by the client waiting)."""
    result = analyzer.measure(
        "-m", model, "-i", "http", "-u", server.http_url, "--request-rate-range", str(per_second),
        "-p", str(int(seconds * 1000)), "--max-trials", "3", "--stability-percentage", "999", "--percentile", "99",
        csv_path=csv, allow_unstable=True,
    )  # fmt: skip
    return result.p99_us / 1000


def shadow_latency(repository: Path, logs: Path, seconds: float, rounds: int) -> list[str]:
    analyzer = install_perf_analyzer()
    csv = logs / "perf_analyzer.csv"
    cases = {"no rollout": "", "shadow 100%": SHADOW}
    p99: dict[str, dict[str, list[float]]] = {case: {m: [] for m in MODELS} for case in cases}
    for _ in range(rounds):
        for case, rollout in cases.items():
            server = serve(repository, True, rollout, logs)
            try:
                for model in MODELS:
                    p99[case][model].append(paced_p99_ms(analyzer, server, model, 300, seconds, csv))
            finally:
                server.stop()
    lines = ["### The primary's p99 at 300 requests a second (perf_analyzer --request-rate-range 300): no rollout against a 100% shadow step", "",
             "| model | no rollout p99 ms | shadow 100% p99 ms | ratio | per round |", "|---|---|---|---|---|"]  # fmt: skip
    for model in MODELS:
        a, b = statistics.median(p99["no rollout"][model]), statistics.median(p99["shadow 100%"][model])
        rounds_text = (
            ", ".join(f"{x:.2f}" for x in p99["no rollout"][model])
            + " vs "
            + ", ".join(f"{x:.2f}" for x in p99["shadow 100%"][model])
        )
        lines.append(f"| {model} | {a:.2f} | {b:.2f} | {b / a:.2f} | {rounds_text} |")
    return [*lines, ""]


def _drive_until_rolled_back(server: RunningServer, body: dict[str, Any]) -> tuple[list[tuple[float, bool]], int]:
    """4 client threads until a second after the rollout stopped running: each answer's time and whether it came
    from the candidate (version 2 answers 2.0, or failed), and the failures the clients saw."""
    answers: list[tuple[float, bool]] = []
    failures = [0]
    deadline = [time.monotonic() + 30]

    def client() -> None:
        session = requests.Session()
        while time.monotonic() < deadline[0]:
            reply = session.post(f"{server.base}/v2/models/m/infer", json=body, timeout=30)
            failed = reply.status_code != 200
            failures[0] += failed
            answers.append((time.monotonic(), failed or reply.json()["outputs"][0]["data"][0] == 2.0))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    while time.monotonic() < deadline[0]:
        if requests.get(f"{server.base}/v2/nereid/rollouts/m", timeout=30).json()["state"] != "running":
            deadline[0] = time.monotonic() + 1.0  # a second more of traffic after the rollback
            break
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    return answers, failures[0]


def rollback(root: Path, logs: Path, trials: int) -> list[str]:
    """Time from the failing window to all traffic on the primary, and the failures users saw, per trial."""
    repository = versioned_python_model(root / "rollback", "m", v2_fail_every="5", v2_offset="2").parent
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
    lines = ["### Rollback: a candidate failing 20% of its requests, 20% canary, gate at 50 candidate requests", "",
             "| trial | requests until the rollback | candidate answers | failures seen | failure share | gate-ready → last candidate answer ms |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for trial in range(trials):
        server = start_nereid(
            repository, "--model-control-mode=explicit", "--load-model=m", "--log-info=false", log_dir=logs
        )
        try:
            requests.post(f"{server.base}/v2/nereid/rollouts/m/start", json={"version": "2", "steps": "canary=20%/60s:50"},
                          timeout=30).raise_for_status()  # fmt: skip
            answers, failures = _drive_until_rolled_back(server, body)
        finally:
            server.stop()
        candidate = sorted(answered for answered, from_candidate in answers if from_candidate)
        ready = candidate[49] if len(candidate) >= 50 else float("nan")
        last = candidate[-1] if candidate else float("nan")
        during = sum(1 for answered, _ in answers if answered <= last)  # the requests while the candidate took some
        lines.append(f"| {trial + 1} | {during} | {len(candidate)} | {failures} | {failures / max(1, during):.1%} | "
                     f"{(last - ready) * 1000:.0f} |")  # fmt: skip
    return [*lines, ""]


def table(results: dict[str, dict[str, list[Cell]]], base: str, other: str, title: str) -> list[str]:
    lines = [f"### {title}", "",
             f"| model | {base} req/s | {other} req/s | ratio | {base} p99 ms | {other} p99 ms | p99 ratio | "
             f"{base} CPU µs/req | {other} CPU µs/req | CPU ratio | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model in MODELS:
        a, b = results[base][model], results[other][model]
        rate_a, rate_b = (statistics.median(c.load.requests_per_s for c in cells) for cells in (a, b))
        p99_a, p99_b = (statistics.median(c.load.p99_ms for c in cells) for cells in (a, b))
        cpu_a, cpu_b = (statistics.median(c.cpu_us_per_request for c in cells) for cells in (a, b))
        errors = sum(c.load.errors for c in a + b)
        lines.append(f"| {model} | {rate_a:,.0f} | {rate_b:,.0f} | {rate_b / rate_a:.3f} | {p99_a:.2f} | {p99_b:.2f} | "
                     f"{p99_b / p99_a:.2f} | {cpu_a:.0f} | {cpu_b:.0f} | {cpu_b / cpu_a:.3f} | {errors} |")  # fmt: skip
    rounds = " / ".join(
        f"{model}: " + ", ".join(f"{c.load.requests_per_s:,.0f} ({c.cpu_us_per_request:.0f} µs)" for c in results[base][model])
        + " vs " + ", ".join(f"{c.load.requests_per_s:,.0f} ({c.cpu_us_per_request:.0f} µs)" for c in results[other][model])
        for model in MODELS
    )  # fmt: skip
    return [*lines, "", f"Per round, req/s (server CPU per request): {rounds}.", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rollback-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rollouts.md")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        repository = build_repository(Path(tmp))
        overhead = compare(repository, logs, {"off": (False, ""), "monitoring": (True, ""), "routing": (True, CANARY_ROUTING),
                                              "canary, monitoring off": (False, CANARY), "canary": (True, CANARY)},
                           args.seconds, args.rounds)  # fmt: skip
        shadow = compare(
            repository, logs, {"no rollout": (True, ""), "shadow 100%": (True, SHADOW)}, args.seconds, args.rounds
        )
        paced = shadow_latency(repository, logs, args.seconds, args.rounds)
        rolled_back = rollback(Path(tmp), logs, args.rollback_trials)
    out = ["# What monitoring and rollouts cost (`benchmarks/bench_rollouts.py`)", "",
           f"`{' '.join(['benchmarks/bench_rollouts.py', *sys.argv[1:]])}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
           f"wrk, HTTP JSON, 16 connections, {args.seconds:g} s a cell, {args.rounds} alternating rounds, medians.", ""]  # fmt: skip
    out += table(
        overhead, "off", "monitoring", "Monitoring off and no rollout (off) against default monitoring (monitoring)"
    )
    out += table(
        overhead,
        "off",
        "routing",
        "Off against default monitoring and a 0.01% canary step: the routing and windows on every request (routing)",
    )
    out += table(
        overhead,
        "canary, monitoring off",
        "canary",
        "A 10% canary running, monitoring off against default monitoring: what monitoring costs while a canary runs",
    )
    out += table(
        overhead, "off", "canary", "Off against default monitoring and a 10% canary: a second version serving (canary)"
    )
    out += table(
        shadow,
        "no rollout",
        "shadow 100%",
        "No rollout against a shadow step copying every request to the candidate, at c=16",
    )
    out += paced
    out += rolled_back
    text = "\n".join(out) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
