"""Three models on one shared server under mixed traffic (issue 42, deployment 1), measured with perf_analyzer.

- fraud: XGBoost, 500 trees of depth 8 over 256 features, through Nereid's fil backend; one transaction per request.
- recommender: a DLRM-like ONNX model (26 embedding tables, 1M rows in all, and MLPs); 64 candidates per request.
- resnet50: ResNet-50 in ONNX; one 3x224x224 image per request.

Each model has dynamic batching and one instance, so the three execute side by side. Nereid serves them with its
fil and onnxruntime backends; real Triton 2.51 (`--servers triton`) with Python-backend models (benchmarks/
triton_python), since its FIL and ONNX Runtime backends do not ship on PyPI. For each server, first each model alone
(perf_analyzer at a fixed concurrency) gives its throughput, p99 and the batch its batcher forms. Then the bare
framework's capacity at that batch, in this process with every core (XGBoost's inplace_predict, the ONNX Runtime
session), measured once, at the first server's batch: the most any server can reach. Then the mix, three
asynchronous perf_analyzers at once in request-rate mode with
the shares of `--mix` (70% fraud, 20% recommender, 10% images), at rising fractions of the rate the bare frameworks
could sustain for that mix on this machine (1 / sum(share / bare capacity)): each model's achieved rate and p99,
and the highest fraction at which every model kept up (achieved >= 95% of the asked rate).

    .venv/bin/python benchmarks/bench_shared_server.py                   # 5 s windows
    .venv/bin/python benchmarks/bench_shared_server.py --window-ms 2000 --fractions 0.5 --servers nereid  # smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.perf_analyzer import PerfAnalyzer, PerfResult, install_perf_analyzer  # noqa: E402
from tests.servers import RunningServer, start_nereid, start_real_triton  # noqa: E402

from benchmarks import triton_python  # noqa: E402
from benchmarks.image_api.resnet import export_onnx  # noqa: E402
from benchmarks.report import publish  # noqa: E402
from benchmarks.shared_server import models, repository  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "shared_server"
RESULTS = ROOT / "benchmarks" / "results" / "shared_server.md"
MODELS = ("fraud", "recommender", "resnet50")
ALONE_CONCURRENCY = {"fraud": 16, "recommender": 8, "resnet50": 16}
BATCH_ARGS = {"fraud": [], "recommender": ["-b", str(models.CANDIDATES)], "resnet50": []}
ROWS_PER_REQUEST = {"fraud": 1, "recommender": models.CANDIDATES, "resnet50": 1}  # perf_analyzer counts rows
SERVERS = {"nereid": "Nereid", "triton": "Triton 2.51 (Python backend)"}
UNIT = {"fraud": "1 transaction", "recommender": f"{models.CANDIDATES} candidates", "resnet50": "1 image"}


@dataclass
class Alone:
    result: PerfResult
    batch: float  # inferences per execution (requests of 64 rows count as 64 for the recommender)


def _stats(server: RunningServer, model: str) -> tuple[int, int]:
    doc = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    return int(doc["inference_count"]), int(doc["execution_count"])


def _perf_args(model: str, server: RunningServer, data: Path, window_ms: int) -> list[str]:
    args = ["-m", model, "-i", "http", "-u", server.http_url, "-p", str(window_ms), *BATCH_ARGS[model]]
    args += ["--max-trials", "3", "--stability-percentage", "999"]  # three windows, each counted
    if model == "recommender":
        args += ["--input-data", str(data)]
    return args


def _bare_capacity(model: str, artifacts: dict[str, Path], rows: int, seconds: float = 4.0) -> float:
    """Requests per second of the framework alone at `rows` rows per call, no server: the better of one thread
    and one per core (small batches run faster on one thread)."""
    return max(_bare_rate(model, artifacts, rows, threads, seconds) for threads in sorted({1, os.cpu_count() or 1}))


def _bare_rate(model: str, artifacts: dict[str, Path], rows: int, threads: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    if model == "fraud":
        import xgboost as xgb

        booster = xgb.Booster(model_file=str(artifacts["fraud"]))
        booster.set_param({"nthread": threads})
        batch = rng.standard_normal((rows, models.FRAUD_FEATURES)).astype(np.float32)

        def call() -> None:
            booster.inplace_predict(batch)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(artifacts[model]), options, providers=["CPUExecutionProvider"])
        if model == "recommender":
            dense, sparse = models.recommender_request(rng, rows)
            feeds = {"DENSE": dense, "SPARSE": sparse}
        else:
            feeds = {"INPUT": rng.standard_normal((rows, 3, 224, 224), dtype=np.float32)}

        def call() -> None:
            session.run(None, feeds)

    call()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        calls += 1
    return calls * rows / ROWS_PER_REQUEST[model] / (time.perf_counter() - started)


def _per_s(model: str, result: PerfResult) -> float:
    """perf_analyzer's inferences/s as requests/s (it counts each row of a batched request)."""
    return result.throughput / ROWS_PER_REQUEST[model]


def _run_mix(
    analyzer: PerfAnalyzer, server: RunningServer, data: Path, window_ms: int, rates: dict[str, float], tmp: Path
) -> dict[str, PerfResult | Exception]:
    """Three perf_analyzers at once, each at its model's request rate; a failed one is a cell of the table."""
    results: dict[str, PerfResult | Exception] = {}

    def run(model: str) -> None:
        try:
            # Asynchronous: in its default synchronous mode a request-rate run has 4 threads, each waiting for its
            # reply, so a model with 300 ms replies could never be asked more than about 13 requests/s.
            results[model] = analyzer.measure(
                *_perf_args(model, server, data, window_ms), "--request-rate-range", f"{rates[model]:.2f}", "--async",
                csv_path=tmp / f"mix-{model}.csv", allow_unstable=True,
            )  # fmt: skip
        except Exception as exc:
            results[model] = exc

    threads = [threading.Thread(target=run, args=(model,)) for model in MODELS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _measure_alone(
    analyzer: PerfAnalyzer, server: RunningServer, data: Path, window_ms: int, tmp: Path
) -> dict[str, Alone]:
    alone: dict[str, Alone] = {}
    for model in MODELS:
        base = _perf_args(model, server, data, window_ms)
        analyzer.run(*base, "--concurrency-range", "4", "--max-trials", "1")  # warm-up: one window
        before = _stats(server, model)
        result = analyzer.measure(
            *base,
            "--concurrency-range",
            str(ALONE_CONCURRENCY[model]),
            csv_path=tmp / f"{model}.csv",
            allow_unstable=True,
        )
        after = _stats(server, model)
        alone[model] = Alone(result, (after[0] - before[0]) / max(after[1] - before[1], 1))
        print(
            f"alone {model:11} {_per_s(model, result):9.1f}/s p99 {result.p99_us / 1000:8.1f} ms batch {alone[model].batch:.1f}",
            flush=True,
        )
    return alone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--mix", default="70,20,10", help="shares of fraud, recommender and image requests")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.4, 0.6, 0.8, 1.0])
    parser.add_argument("--servers", nargs="+", default=["nereid", "triton"], choices=list(SERVERS))
    parser.add_argument(
        "--resnet-instances", type=int, default=1, help="ResNet-50 instances, the cores shared out as their threads"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    shares = dict(zip(MODELS, (float(s) / 100 for s in args.mix.split(","))))

    artifacts = {
        "fraud": models.train_fraud(OUT / "fraud.json"),
        "recommender": models.export_recommender(OUT / "recommender.onnx"),
        "resnet50": export_onnx(ROOT / "benchmarks" / "out" / "image_api" / "resnet50.onnx"),
    }
    analyzer: PerfAnalyzer = install_perf_analyzer()
    started = time.time()
    alone: dict[str, dict[str, Alone]] = {}
    bare: dict[str, float] = {}  # requests/s of each framework alone, at the batch the first server formed
    mixes: dict[str, list[tuple[float, dict[str, float], dict[str, PerfResult | Exception]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-shared-server-") as tmp_name:
        tmp = Path(tmp_name)
        data = repository.recommender_input_data(tmp / "recommender.json")
        for key in args.servers:
            if key == "triton":
                triton_python.ensure_packages("onnxruntime", "xgboost", imports="onnxruntime, xgboost")
                server = start_real_triton(
                    repository.build(
                        tmp / "triton-repo", artifacts, triton=True, resnet_instances=args.resnet_instances
                    ),
                    timeout=300,
                )
            else:
                server = start_nereid(
                    repository.build(tmp / "repo", artifacts, resnet_instances=args.resnet_instances),
                    "--log-verbose=0",
                    timeout=300,
                )
            try:
                print(f"== {SERVERS[key]}", flush=True)
                alone[key] = _measure_alone(analyzer, server, data, args.window_ms, tmp)
                if not bare:
                    for model in MODELS:
                        rows = max(1, round(alone[key][model].batch))
                        bare[model] = _bare_capacity(model, artifacts, rows)
                        print(f"bare  {model:11} {bare[model]:9.1f}/s at {rows} rows per call", flush=True)
                bare_mix = 1.0 / sum(shares[m] / bare[m] for m in MODELS)
                mixes[key] = []
                for fraction in args.fractions:
                    rates = {m: fraction * bare_mix * shares[m] for m in MODELS}
                    results = _run_mix(analyzer, server, data, args.window_ms, rates, tmp)
                    mixes[key].append((fraction, rates, results))
                    line = " ".join(
                        f"{m} {_per_s(m, r):.1f}/{rates[m]:.1f} p99 {r.p99_us / 1000:.0f} ms"
                        if isinstance(r, PerfResult)
                        else f"{m} failed"
                        for m, r in results.items()
                    )
                    print(f"mix {fraction:.2f}: {line}", flush=True)
            finally:
                server.stop()
            time.sleep(5)  # the stopped server's processes go before the next one starts

    first = args.servers[0]
    lines = [
        "# Three models on one shared server: fraud (XGBoost), recommender (DLRM-like, ONNX), ResNet-50 (ONNX)",
        "",
        f"`benchmarks/bench_shared_server.py --window-ms {args.window_ms} --mix {args.mix}"
        + (f" --resnet-instances {args.resnet_instances}" if args.resnet_instances > 1 else "")
        + "`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {os.cpu_count()} CPUs, perf_analyzer 2.51 over "
        f"HTTP. Nereid serves fraud with its fil backend and the others with its onnxruntime backend; real Triton 2.51 "
        "serves each in a Python-backend model (benchmarks/triton_python: its FIL and ONNX Runtime backends do not ship "
        f"on PyPI). Bare: the framework alone in this process with every core, at the batch {SERVERS[first]}'s batcher "
        "formed alone.",
        "",
        "Alone:",
        "",
        "| model | requests of | server | concurrency | requests/s | p99 ms | mean batch (rows) | bare framework /s | of bare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for key in args.servers:
            a = alone[key][model]
            rate = _per_s(model, a.result)
            lines.append(
                f"| {model} | {UNIT[model]} | {SERVERS[key]} | {ALONE_CONCURRENCY[model]} | {rate:.1f} | "
                f"{a.result.p99_us / 1000:.1f} | {a.batch:.1f} | {bare[model]:.1f} | {rate / bare[model]:.2f} |"
            )
    if {"nereid", "triton"} <= set(args.servers):
        ratios = ", ".join(
            f"{m} {_per_s(m, alone['nereid'][m].result) / _per_s(m, alone['triton'][m].result):.2f}x" for m in MODELS
        )
        lines += ["", f"Nereid over Triton alone: {ratios}."]
    bare_mix = 1.0 / sum(shares[m] / bare[m] for m in MODELS)
    lines += [
        "",
        f"The mix ({args.mix} of requests): the bare frameworks, time-sharing the machine, could sustain {bare_mix:.1f} "
        "requests/s in these shares. Each row asks a fraction of that; a model keeps up when it achieves 95% of its "
        "rate. Three perf_analyzers at once, asynchronous, at the models' request rates.",
    ]
    for key in args.servers:
        lines += [
            "",
            f"{SERVERS[key]}:",
            "",
            "| fraction of the bare mix | "
            + " | ".join(f"{m} asked / achieved /s, p99 ms" for m in MODELS)
            + " | all kept up |",
            "|---|" + "---|" * len(MODELS) + "---|",
        ]
        best = 0.0
        for fraction, rates, results in mixes[key]:
            cells, kept = [], True
            for model in MODELS:
                r = results[model]
                if isinstance(r, PerfResult):
                    cells.append(f"{rates[model]:.1f} / {_per_s(model, r):.1f}, {r.p99_us / 1000:.0f}")
                    kept = kept and _per_s(model, r) >= 0.95 * rates[model]
                else:
                    cells.append(f"{rates[model]:.1f} / failed")
                    kept = False
            if kept:
                best = max(best, fraction)
            lines.append(f"| {fraction:.2f} | " + " | ".join(cells) + f" | {'yes' if kept else 'no'} |")
        lines += [
            "",
            f"{SERVERS[key]} sustained the mix at {best:.2f} of the bare frameworks' capacity (the highest fraction "
            "tried at which every model kept up).",
        ]
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
