"""Issue 6 benchmark: an XGBoost binary classifier (500 trees, depth 8, 32 features) served three ways in one run,
at batch 1 with concurrency 16 and at batch 1024:

- Nereid's fil backend (XGBoost's in-place prediction through its C API, batches of 512+ rows split over the
  cores; dynamic batching);
- MLServer 1.7.1's xgboost runtime (pip mlserver mlserver-xgboost, in a venv this script creates);
- real Triton 2.51 (tests/reference_triton.py) running a Python-backend model.py that calls XGBoost.

All three get the same HTTP/JSON v2 body from wrk (MLServer speaks no binary tensor extension); Nereid and
Triton are also driven with the binary extension. Each server's answer is checked against XGBoost first.

    .venv/bin/python benchmarks/bench_fil.py [--seconds 10] [--trees 500] [--out benchmarks/results/fil.md]

Setup, once: the MLServer venv (~/.cache/nereid-bench/mlserver-venv, with uvloop<0.22 as MLServer 1.7.1
needs) and xgboost in the reference Triton venv are installed by this script when missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, free_port, start_nereid, start_real_triton  # noqa: E402

from benchmarks import triton_python  # noqa: E402
from benchmarks.loadgen import LoadResult, http_binary_body, http_json_body, require_tools, run_wrk  # noqa: E402

FEATURES = 32
TRITON_MODEL = ROOT / "benchmarks" / "triton_python" / "xgboost_model.py"  # the Python-backend route to XGBoost
MLSERVER_VENV = Path.home() / ".cache" / "nereid-bench" / "mlserver-venv"

NEREID_CONFIG = """
name: "xgb"
backend: "fil"
max_batch_size: 1024
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
parameters {{ key: "model_type" value {{ string_value: "xgboost_json" }} }}
parameters {{ key: "output_class" value {{ string_value: "true" }} }}
parameters {{ key: "predict_proba" value {{ string_value: "true" }} }}
"""

TRITON_CONFIG = """
name: "xgb"
backend: "python"
max_batch_size: 1024
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
"""


def train(path: Path, trees: int, depth: int) -> object:
    import xgboost as xgb

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((20_000, FEATURES)).astype(np.float32)
    labels = (rows[:, 0] + rows[:, 1] * rows[:, 2] + 0.5 * rng.standard_normal(len(rows)) > 0).astype(np.float32)
    params = {"objective": "binary:logistic", "max_depth": depth, "eta": 0.1, "tree_method": "hist", "nthread": os.cpu_count()}
    booster = xgb.train(params, xgb.DMatrix(rows, label=labels), num_boost_round=trees)
    booster.save_model(str(path))
    return booster


def ensure_mlserver() -> Path:
    binary = MLSERVER_VENV / "bin" / "mlserver"
    if not binary.exists():
        print("installing MLServer 1.7.1 into", MLSERVER_VENV, file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(MLSERVER_VENV)], check=True)
        subprocess.run([str(MLSERVER_VENV / "bin" / "pip"), "install", "-q", "mlserver==1.7.1", "mlserver-xgboost==1.7.1",
                        "uvloop<0.22"], check=True)
    return binary


def start_mlserver(model_dir: Path, log_dir: Path) -> RunningServer:
    binary = ensure_mlserver()
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    (model_dir / "settings.json").write_text(json.dumps(
        {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port, "host": "127.0.0.1", "debug": False}
    ))
    log_path = log_dir / "mlserver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(binary), "start", str(model_dir)], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = RunningServer(process, http_port, grpc_port, metrics_port, log_path)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlserver exited:\n{server.log()}")
        try:
            if requests.get(f"{server.base}/v2/models/xgb/ready", timeout=1).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop_group(server)
    raise RuntimeError(f"mlserver not ready:\n{server.log()}")


def stop_group(server: RunningServer) -> None:
    """MLServer and Triton start worker processes of their own: stop the whole process group."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


def check(name: str, url: str, rows: np.ndarray, expected: np.ndarray, pick: Callable[[dict], np.ndarray]) -> None:
    body, headers = http_json_body({"input__0": rows})
    answer = requests.post(url, data=body, headers=headers, timeout=60)
    answer.raise_for_status()
    got = pick(answer.json())
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        raise SystemExit(f"{name} answered {got[:3]} where XGBoost says {expected[:3]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--trees", type=int, default=500)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16, help="connections for the batch-1 run")
    parser.add_argument("--batch-concurrency", type=int, default=4, help="connections for the batch-1024 run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fil.md")
    args = parser.parse_args()
    require_tools()
    ensure_mlserver()
    triton_python.ensure_packages("xgboost", imports="xgboost")
    rng = np.random.default_rng(1)
    one = rng.standard_normal((1, FEATURES)).astype(np.float32)
    batch = rng.standard_normal((1024, FEATURES)).astype(np.float32)
    results: list[tuple[str, str, str, LoadResult]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_path = tmp / "xgboost.json"
        booster = train(model_path, args.trees, args.depth)
        p = booster.inplace_predict(one)  # type: ignore[attr-defined]
        expected = np.stack([1 - p, p], axis=1)
        kernel_rows_per_s = _kernel_rows_per_s(booster, batch)
        # The three repositories.
        for repo, config in (("nereid", NEREID_CONFIG), ("triton", TRITON_CONFIG)):
            version = tmp / repo / "xgb" / "1"
            version.mkdir(parents=True)
            (version / "xgboost.json").write_bytes(model_path.read_bytes())
            (tmp / repo / "xgb" / "config.pbtxt").write_text(config.format(features=FEATURES))
        shutil.copy(TRITON_MODEL, tmp / "triton" / "xgb" / "1" / "model.py")
        mlserver_dir = tmp / "mlserver"
        mlserver_dir.mkdir()
        (mlserver_dir / "model.json").write_bytes(model_path.read_bytes())
        (mlserver_dir / "model-settings.json").write_text(json.dumps(
            {"name": "xgb", "implementation": "mlserver_xgboost.XGBoostModel", "parameters": {"uri": "./model.json"}}
        ))

        def v2_output(doc: dict) -> np.ndarray:
            return np.asarray(doc["outputs"][0]["data"], dtype=np.float32).reshape(len(one), -1)

        def run_all(server_name: str, url: str, binary: bool) -> None:
            for label, rows, connections in (("batch 1", one, args.concurrency), ("batch 1024", batch, args.batch_concurrency)):
                body, headers = http_json_body({"input__0": rows})
                results.append((server_name, label, "HTTP JSON", run_wrk(url, body, headers, connections, args.seconds)))
                if binary:
                    body, headers = http_binary_body({"input__0": rows}, ["output__0"])
                    results.append((server_name, label, "HTTP binary", run_wrk(url, body, headers, connections, args.seconds)))

        nereid = start_nereid(tmp / "nereid", "--log-info=false", log_dir=tmp)
        try:
            url = f"{nereid.base}/v2/models/xgb/infer"
            check("nereid", url, one, expected, v2_output)
            run_all("Nereid fil", url, True)
        finally:
            nereid.stop()
        mlserver = start_mlserver(mlserver_dir, tmp)
        try:
            url = f"{mlserver.base}/v2/models/xgb/infer"
            # MLServer's xgboost runtime returns P(class 1) for a Booster-backed binary model.
            check("mlserver", url, one, expected[:, 1:], lambda d: np.asarray(d["outputs"][0]["data"], np.float32).reshape(1, -1)[:, -1:])
            run_all("MLServer 1.7.1 xgboost", url, False)
        finally:
            stop_group(mlserver)
        triton = start_real_triton(tmp / "triton")
        try:
            url = f"{triton.base}/v2/models/xgb/infer"
            check("triton", url, one, expected, v2_output)
            run_all("Triton 2.51 Python backend", url, True)
        finally:
            stop_group(triton)
    table = _table(results, args, kernel_rows_per_s)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Tree model benchmark (`benchmarks/bench_fil.py`)\n\n" + table)


def _kernel_rows_per_s(booster: object, rows: np.ndarray) -> float:
    """XGBoost's own speed on one core for these rows (inplace_predict, 1 thread, median of 20 calls): what any
    server that runs this model through XGBoost can reach per core, before HTTP and JSON."""
    single = booster.copy()  # type: ignore[attr-defined]
    single.set_param({"nthread": 1})
    single.inplace_predict(rows)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        single.inplace_predict(rows)
        times.append(time.perf_counter() - start)
    return len(rows) / float(np.median(times))


def _table(results: list[tuple[str, str, str, LoadResult]], args: argparse.Namespace, kernel_rows_per_s: float) -> str:
    lines = [
        f"XGBoost binary classifier, {args.trees} trees, max depth {args.depth}, {FEATURES} FP32 features, probabilities out. "
        f"wrk on the same 2-core machine, {args.seconds:.0f} s per cell; batch 1 at {args.concurrency} connections, "
        f"batch 1024 at {args.batch_concurrency}. Nereid and Triton: one instance, dynamic batching (100 µs); "
        "MLServer: its defaults.",
        "",
        "| server | batch | body | requests/s | rows/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for server, label, body, r in results:
        rows = r.requests_per_s * (1024 if label == "batch 1024" else 1)
        lines.append(f"| {server} | {label} | {body} | {r.requests_per_s:,.0f} | {rows:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors} |")
    lines += ["", "| batch | body | Nereid / MLServer | Nereid / Triton Python backend |", "|---|---|---:|---:|"]
    for label in ("batch 1", "batch 1024"):
        def rps(server: str, body: str, label: str = label) -> float:
            return next((r.requests_per_s for s, la, b, r in results if s.startswith(server) and la == label and b == body), float("nan"))

        lines.append(f"| {label} | HTTP JSON | {rps('Nereid', 'HTTP JSON') / rps('MLServer', 'HTTP JSON'):.1f}x | "
                     f"{rps('Nereid', 'HTTP JSON') / rps('Triton', 'HTTP JSON'):.2f}x |")
        lines.append(f"| {label} | HTTP binary | - | {rps('Nereid', 'HTTP binary') / rps('Triton', 'HTTP binary'):.2f}x |")
    mlserver_rows = next((r.requests_per_s * 1024 for s, la, b, r in results
                          if s.startswith("MLServer") and la == "batch 1024"), float("nan"))
    cores = os.cpu_count() or 1
    lines += [
        "",
        f"Ceiling at batch 1024: XGBoost itself computes {kernel_rows_per_s:,.0f} rows/s on one core here "
        f"({kernel_rows_per_s * cores:,.0f} on all {cores}, with nothing left for HTTP). 5x MLServer's "
        f"{mlserver_rows:,.0f} rows/s would be {5 * mlserver_rows:,.0f} rows/s, "
        f"{5 * mlserver_rows / (kernel_rows_per_s * cores):.1f}x what the cores can compute.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
