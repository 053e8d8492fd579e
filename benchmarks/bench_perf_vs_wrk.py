"""Issue 7 benchmark: is `nereid perf` a load generator as strong as wrk? Both drive real Triton 2.51
(tests/reference_triton.py) on the same Python-backend add/sub model (FP32 [4] x2, max_batch_size 64) over
HTTP JSON at concurrency 16, alternating run by run, with identical request bodies. Prints the throughput ratio
and the latencies each tool saw.

    .venv/bin/python benchmarks/bench_perf_vs_wrk.py [--seconds 10] [--rounds 3] [--concurrency 16]
    .venv/bin/python benchmarks/bench_perf_vs_wrk.py --seconds 2 --rounds 1     # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_real_triton  # noqa: E402

from benchmarks.loadgen import LoadResult, http_json_body, require_tools, run_wrk  # noqa: E402
from nereid.tools.perf import PerfConfig, PerfResult, run_perf  # noqa: E402

MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 64
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

INPUTS = {
    "INPUT0": np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32),
    "INPUT1": np.array([[1.0, 1.0, 1.0, 1.0]], dtype=np.float32),
}


def write_repository(root: Path) -> Path:
    model = root / "add_sub"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL_PY)
    return root


def run_nereid_perf(url: str, data_file: Path, concurrency: int, seconds: float) -> PerfResult:
    """Three windows that together last `seconds`, the same span wrk measures; no stability retries."""
    config = PerfConfig(
        "add_sub",
        url=url,
        concurrency_range=(concurrency, concurrency, 1),
        measurement_interval_ms=max(200, int(seconds * 1000 / 3)),
        max_trials=3,
        stability_percentage=100.0,
        input_data=[str(data_file)],
        input_tensor_format="json",
        output_tensor_format="json",
    )
    return run_perf(config)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=3, help="wrk/perf pairs, alternating")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    require_tools()
    body, headers = http_json_body(INPUTS)
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp) / "repository")
        data_file = Path(tmp) / "data.json"
        data_file.write_text(json.dumps({"data": [{name: array.reshape(-1).tolist() for name, array in INPUTS.items()}]}))
        server = start_real_triton(repository, "--log-info=false")
        rows: list[tuple[str, int, float, float, float, str]] = []
        try:
            url = f"http://{server.http_url}/v2/models/add_sub/infer"
            run_wrk(url, body, headers, args.concurrency, 1)  # warm the server and its Python stub
            for round_index in range(1, args.rounds + 1):
                wrk: LoadResult = run_wrk(url, body, headers, args.concurrency, args.seconds)
                rows.append(("wrk", round_index, wrk.requests_per_s, wrk.p50_ms, wrk.p99_ms, f"errors {wrk.errors}"))
                perf = run_nereid_perf(server.http_url, data_file, args.concurrency, args.seconds)
                note = f"client CPU {perf.client_cpu_percent:.0f}% ({perf.workers} worker)"
                rows.append(("nereid perf", round_index, perf.throughput, perf.latency.p50_us / 1000, perf.latency.p99_us / 1000, note))
        finally:
            server.stop()
    wrk_rps = [r[2] for r in rows if r[0] == "wrk"]
    perf_rps = [r[2] for r in rows if r[0] == "nereid perf"]
    ratio = float(np.mean(perf_rps) / np.mean(wrk_rps)) if wrk_rps and min(wrk_rps) > 0 else float("nan")
    per_round = [p / w for p, w in zip(perf_rps, wrk_rps) if w > 0]
    print(f"\nReal Triton 2.51, Python add_sub (FP32 [4] x2), HTTP JSON, concurrency {args.concurrency}, {args.seconds:g} s runs\n")
    print("| tool | round | requests/s | p50 ms | p99 ms | notes |")
    print("|---|---:|---:|---:|---:|---|")
    for tool, round_index, rps, p50, p99, note in rows:
        print(f"| {tool} | {round_index} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {note} |")
    print(f"\nnereid perf / wrk throughput: {ratio:.2f}x over all rounds, median of per-round ratios {np.median(per_round):.2f}x")


if __name__ == "__main__":
    main()
