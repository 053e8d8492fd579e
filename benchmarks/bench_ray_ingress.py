"""Issue 16 benchmark: the ingress of a Ray Serve deployment. The same ONNX adder (FP32 [1,4], HTTP JSON, wrk at
concurrency C) through Ray Serve's own HTTP proxy and through Nereid's ingress on the head node of a 3-node
loopback cluster (127.0.0.2-4, one replica per node), and served by a single `nereid serve`, alternating round
by round in one run. Prints req/s, p50/p99 and errors, and the ratios.

    .venv/bin/python benchmarks/bench_ray_ingress.py [--seconds 10] [--rounds 3] [--concurrency 16]
    .venv/bin/python benchmarks/bench_ray_ingress.py --seconds 2 --rounds 1     # smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.orchestration_models import onnx_adder  # noqa: E402
from tests.ray_cluster import LoopbackCluster, free_port_on  # noqa: E402
from tests.servers import start_nereid  # noqa: E402

from benchmarks.loadgen import LoadResult, http_json_body, run_wrk  # noqa: E402

MODEL = "adder"


def _wait_ok(url: str, body: bytes, headers: dict[str, str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.post(url, data=body, headers=headers, timeout=30).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {seconds:g} s")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    from nereid.ray.cli import deploy, parse_ray_serve_args

    body, headers = http_json_body({"INPUT0": np.ones((1, 4), np.float32)})
    results: dict[str, list[LoadResult]] = {"Ray Serve HTTP proxy": [], "Nereid ingress": [], "single nereid serve": []}
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "models"
        onnx_adder(repository, MODEL, 1.0)
        single = start_nereid(repository)
        loopback = LoopbackCluster()
        try:
            loopback.start()
            head = loopback.nodes[0]
            http, grpc, metrics, proxy = (free_port_on(loopback.nodes) for _ in range(4))
            _, options = parse_ray_serve_args([
                "--model-repository", str(repository), "--num-replicas=3", "--cpus-per-replica=0.5",
                f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
            ])  # fmt: skip
            deploy(options, serve_http_port=proxy, serve_http_host=head)
            urls = {
                "Ray Serve HTTP proxy": f"http://{head}:{proxy}/v2/models/{MODEL}/infer",
                "Nereid ingress": f"http://{head}:{http}/v2/models/{MODEL}/infer",
                "single nereid serve": f"{single.base}/v2/models/{MODEL}/infer",
            }
            for url in urls.values():
                _wait_ok(url, body, headers)
            for _ in range(args.rounds):
                for name, url in urls.items():
                    results[name].append(run_wrk(url, body, headers, args.concurrency, args.seconds))
        finally:
            loopback.stop()
            single.stop()
    print(f"\n{args.rounds} round(s) of {args.seconds:g} s, wrk -c {args.concurrency}, HTTP JSON, ONNX adder FP32 [1,4]\n")
    print("| path | req/s (per round) | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        rates = ", ".join(f"{r.requests_per_s:.0f}" for r in runs)
        p50 = max(r.p50_ms for r in runs)
        p99 = max(r.p99_ms for r in runs)
        print(f"| {name} | {rates} | {p50:.2f} | {p99:.2f} | {sum(r.errors for r in runs)} |")
    mean = {name: sum(r.requests_per_s for r in runs) / len(runs) for name, runs in results.items()}
    print(f"\nNereid ingress / Serve proxy: {mean['Nereid ingress'] / mean['Ray Serve HTTP proxy']:.2f}x; "
          f"Nereid ingress / single server: {mean['Nereid ingress'] / mean['single nereid serve']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
