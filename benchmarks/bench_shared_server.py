"""Three models on one shared server under mixed traffic (issue 42, deployment 1), measured with perf_analyzer.

- fraud: XGBoost, 500 trees of depth 8 over 256 features, through Nereid's fil backend; one transaction per request.
- recommender: a DLRM-like ONNX model (26 embedding tables, 1M rows in all, and MLPs); 64 candidates per request.
- resnet50: ResNet-50 in ONNX; one 3x224x224 image per request.

Each model has dynamic batching and one instance, so the three execute side by side. First each model alone
(perf_analyzer at a fixed concurrency) gives its throughput, p99 and the batch its batcher forms. Then the bare
framework's capacity at that batch, in this process with every core (XGBoost's inplace_predict, the ONNX Runtime
session): the most any server can reach. Then the mix, three perf_analyzers at once in request-rate mode with
the shares of `--mix` (70% fraud, 20% recommender, 10% images), at rising fractions of the rate the bare frameworks
could sustain for that mix on this machine (1 / sum(share / bare capacity)): each model's achieved rate and p99,
and the highest fraction at which every model kept up (achieved >= 95% of the asked rate).

    .venv/bin/python benchmarks/bench_shared_server.py                   # 5 s windows
    .venv/bin/python benchmarks/bench_shared_server.py --window-ms 2000 --fractions 0.5  # smoke run
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
from tests.servers import RunningServer, start_nereid  # noqa: E402

from benchmarks.image_api.resnet import export_onnx  # noqa: E402
from benchmarks.report import publish  # noqa: E402
from benchmarks.shared_server import models, repository  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "shared_server"
RESULTS = ROOT / "benchmarks" / "results" / "shared_server.md"
MODELS = ("fraud", "recommender", "resnet50")
ALONE_CONCURRENCY = {"fraud": 16, "recommender": 8, "resnet50": 16}
BATCH_ARGS = {"fraud": [], "recommender": ["-b", str(models.CANDIDATES)], "resnet50": []}
ROWS_PER_REQUEST = {"fraud": 1, "recommender": models.CANDIDATES, "resnet50": 1}  # perf_analyzer counts rows
UNIT = {"fraud": "1 transaction", "recommender": f"{models.CANDIDATES} candidates", "resnet50": "1 image"}


@dataclass
class Alone:
    result: PerfResult
    batch: float  # inferences per execution (requests of 64 rows count as 64 for the recommender)
    bare: float  # requests per second the bare framework reaches at that batch


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window-ms", type=int, default=5000)
    parser.add_argument("--mix", default="70,20,10", help="shares of fraud, recommender and image requests")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.4, 0.6, 0.8, 1.0])
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
    alone: dict[str, Alone] = {}
    mixes: list[tuple[float, dict[str, float], dict[str, PerfResult | Exception]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-shared-server-") as tmp_name:
        tmp = Path(tmp_name)
        repo = repository.build(tmp / "repo", artifacts)
        data = repository.recommender_input_data(tmp / "recommender.json")
        server = start_nereid(repo, "--log-verbose=0", timeout=300)
        try:
            for model in MODELS:
                base = _perf_args(model, server, data, args.window_ms)
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
                batch = (after[0] - before[0]) / max(after[1] - before[1], 1)
                alone[model] = Alone(result, batch, float("nan"))
                print(
                    f"alone {model:11} {_per_s(model, result):9.1f}/s p99 {result.p99_us / 1000:8.1f} ms batch {batch:.1f}",
                    flush=True,
                )
            for model in MODELS:
                rows = max(1, round(alone[model].batch))
                alone[model].bare = _bare_capacity(model, artifacts, rows)
                print(f"bare  {model:11} {alone[model].bare:9.1f}/s at {rows} rows per call", flush=True)
            bare_mix = 1.0 / sum(shares[m] / alone[m].bare for m in MODELS)
            for fraction in args.fractions:
                rates = {m: fraction * bare_mix * shares[m] for m in MODELS}
                results = _run_mix(analyzer, server, data, args.window_ms, rates, tmp)
                mixes.append((fraction, rates, results))
                line = " ".join(
                    f"{m} {_per_s(m, r):.1f}/{rates[m]:.1f} p99 {r.p99_us / 1000:.0f} ms"
                    if isinstance(r, PerfResult)
                    else f"{m} failed"
                    for m, r in results.items()
                )
                print(f"mix {fraction:.2f}: {line}", flush=True)
        finally:
            server.stop()

    lines = [
        "# Three models on one shared server: fraud (XGBoost, fil), recommender (DLRM-like, ONNX), ResNet-50 (ONNX)",
        "",
        f"`benchmarks/bench_shared_server.py --window-ms {args.window_ms} --mix {args.mix}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {os.cpu_count()} CPUs, perf_analyzer 2.51 over "
        "HTTP. Bare: the framework alone in this process with every core, at the batch Nereid's batcher formed alone.",
        "",
        "Alone:",
        "",
        "| model | requests of | concurrency | Nereid requests/s | p99 ms | mean batch (rows) | bare framework /s | Nereid / bare |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        a = alone[model]
        lines.append(
            f"| {model} | {UNIT[model]} | {ALONE_CONCURRENCY[model]} | {_per_s(model, a.result):.1f} | {a.result.p99_us / 1000:.1f} "
            f"| {a.batch:.1f} | {a.bare:.1f} | {_per_s(model, a.result) / a.bare:.2f} |"
        )
    bare_mix = 1.0 / sum(shares[m] / alone[m].bare for m in MODELS)
    lines += [
        "",
        f"The mix ({args.mix} of requests): the bare frameworks, time-sharing the machine, could sustain {bare_mix:.1f} "
        "requests/s in these shares. Each row asks a fraction of that; a model keeps up when it achieves 95% of its rate.",
        "",
        "| fraction of the bare mix | "
        + " | ".join(f"{m} asked / achieved /s, p99 ms" for m in MODELS)
        + " | all kept up |",
        "|---|" + "---|" * len(MODELS) + "---|",
    ]
    best = 0.0
    for fraction, rates, results in mixes:
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
        f"Nereid sustained the mix at {best:.2f} of the bare frameworks' capacity (the highest fraction tried at which every model kept up).",
    ]
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
