"""A high-traffic image API (issue 42, deployment 2): ResNet-50 (real architecture, random weights, ONNX Runtime)
with dynamic batching, each client sending one image per request, served by Nereid, real Triton 2.51 (the same
repository with ResNet-50's session in a Python-backend model: Triton's ONNX Runtime backend is not on PyPI), Ray
Serve (`@serve.batch`) and LitServe (its batching), all driven by wrk with the same number of connections, and set
against the in-process limit: the same ONNX Runtime session called in one process at the batch size Nereid's
batcher formed.

Two paths: `binary` sends the 3x224x224 float32 tensor (Nereid: the v2 binary tensor extension; Ray Serve: the
raw bytes; LitServe: the bytes in base64 JSON, as LitServe reads requests as JSON); `jpeg` sends a 640x480 JPEG
that the server decodes and resizes (Nereid and Triton: an ensemble of a Python preprocessing model and ResNet-50; the peers
decode in their batch handler / per request). The in-process limit of the JPEG path decodes the batch, then runs it.

    .venv/bin/python benchmarks/bench_image_api.py                                # 16 clients, 20 s per cell
    .venv/bin/python benchmarks/bench_image_api.py --seconds 5 --servers nereid  # smoke run

Needs wrk (apt) and, for the peers, ray[serve] and litserve (pip); Triton's onnxruntime and Pillow are installed
into the reference Triton's venv on first use.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_nereid, start_real_triton  # noqa: E402

from benchmarks import triton_python  # noqa: E402
from benchmarks.image_api import imaging, nereid_repository  # noqa: E402
from benchmarks.image_api.batch_log import mean_batch  # noqa: E402
from benchmarks.image_api.resnet import export_onnx  # noqa: E402
from benchmarks.loadgen import LoadResult, http_binary_body, run_wrk  # noqa: E402
from benchmarks.report import publish  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "image_api"
RESULTS = ROOT / "benchmarks" / "results" / "image_api.md"


@dataclass
class Row:
    path: str
    server: str
    result: LoadResult
    mean_batch: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nereid_jpeg_body(jpeg: bytes) -> tuple[bytes, dict[str, str]]:
    """A BYTES tensor in the binary extension: each element is its 4-byte little-endian length, then its bytes."""
    element = len(jpeg).to_bytes(4, "little") + jpeg
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IMAGE",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(element)},
                }
            ],
            "outputs": [{"name": "LOGITS", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + element, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def _resnet_counts(base: str) -> tuple[int, int]:
    stats = requests.get(f"{base}/v2/models/resnet50/stats", timeout=10).json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def measure_v2_server(
    name: str,
    onnx: Path,
    image: np.ndarray,
    jpeg: bytes,
    paths: list[str],
    clients: int,
    seconds: float,
    tmp: Path,
    instances: int,
) -> list[Row]:
    """Nereid, or real Triton with ResNet-50 in a Python model: the same repository otherwise, the same requests."""
    if name == "Nereid":
        repo = nereid_repository.build(tmp / "nereid-repo", onnx, instances=instances)
        server = start_nereid(repo, "--log-verbose=0", timeout=180)
    else:
        triton_python.ensure_packages("onnxruntime", "pillow", imports="onnxruntime, PIL")
        repo = nereid_repository.build(tmp / "triton-repo", onnx, python_resnet=True, instances=instances)
        server = start_real_triton(repo, timeout=180)
    rows = []
    try:
        bodies = {
            "binary": ("resnet50", http_binary_body({"INPUT": image[None]}, ["LOGITS"])),
            "jpeg": ("resnet50_jpeg", _nereid_jpeg_body(jpeg)),
        }
        for path in paths:
            model, (body, headers) = bodies[path]
            url = f"{server.base}/v2/models/{model}/infer"
            run_wrk(url, body, headers, clients, min(seconds, 3), timeout_s=30)
            inferences, executions = _resnet_counts(server.base)
            result = run_wrk(url, body, headers, clients, seconds, timeout_s=30)
            inferences2, executions2 = _resnet_counts(server.base)
            batch = (inferences2 - inferences) / max(executions2 - executions, 1)
            rows.append(Row(path, name, result, batch))
            print(f"{name:9} {path:6} {result.row()}  batch {batch:.1f}", flush=True)
    finally:
        server.stop()
    return rows


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer in {timeout:.0f} s")


def measure_peer(
    name: str,
    onnx: Path,
    image: np.ndarray,
    jpeg: bytes,
    paths: list[str],
    clients: int,
    seconds: float,
    tmp: Path,
    max_ongoing: int,
) -> list[Row]:
    port = _free_port()
    batch_log = tmp / f"{name}-batches"
    env = {**os.environ, "BENCH_BATCH_LOG": str(batch_log), "PYTHONPATH": str(ROOT)}
    module = {"Ray Serve": "ray_server", "LitServe": "litserve_server"}[name]
    command = [sys.executable, "-m", f"benchmarks.image_api.{module}", str(onnx), str(port)]
    if name == "Ray Serve":
        command.append(str(max_ongoing))
    log = open(tmp / f"{module}.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    rows = []
    try:
        _wait_http(f"http://127.0.0.1:{port}/", process, 180)
        for path in paths:
            if name == "Ray Serve":
                url = f"http://127.0.0.1:{port}/{path}"
                body, headers = (
                    (image.tobytes() if path == "binary" else jpeg),
                    {"Content-Type": "application/octet-stream"},
                )
            else:
                url = f"http://127.0.0.1:{port}/predict"
                data = image.tobytes() if path == "binary" else jpeg
                body = json.dumps({"kind": path, "data": base64.b64encode(data).decode()}).encode()
                headers = {"Content-Type": "application/json"}
            run_wrk(url, body, headers, clients, min(seconds, 3), timeout_s=30)
            batch_log.unlink(missing_ok=True)
            result = run_wrk(url, body, headers, clients, seconds, timeout_s=30)
            batch = mean_batch(batch_log)
            rows.append(Row(path, name, result, batch))
            print(f"{name:9} {path:6} {result.row()}  batch {batch:.1f}", flush=True)
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
        log.close()
    return rows


def in_process_limit(onnx: Path, batch: int, jpeg: bytes | None, seconds: float) -> float:
    """Images per second of one process calling the session at `batch` (decoding the JPEGs first when given)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    for _ in range(2):
        session.run(None, {"INPUT": images})
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        inputs = imaging.decode_batch([jpeg] * batch) if jpeg is not None else images
        session.run(None, {"INPUT": inputs})
        runs += 1
    return runs * batch / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument(
        "--servers",
        nargs="+",
        default=["nereid", "triton", "ray", "litserve"],
        choices=["nereid", "triton", "ray", "litserve"],
    )
    parser.add_argument("--paths", nargs="+", default=["binary", "jpeg"], choices=["binary", "jpeg"])
    parser.add_argument(
        "--ray-max-ongoing",
        type=int,
        default=32,
        help="Ray Serve's max_ongoing_requests (its default of 5 caps batches at 5)",
    )
    parser.add_argument(
        "--resnet-instances",
        type=int,
        default=1,
        help="ResNet-50 instances on Nereid and Triton, the cores shared out as their intra-op threads",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    onnx = export_onnx(OUT / "resnet50.onnx")
    image = np.random.default_rng(1).standard_normal((3, 224, 224), dtype=np.float32)
    jpeg = imaging.sample_jpeg()
    started = time.time()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-image-api-") as tmp_name:
        tmp = Path(tmp_name)
        if "nereid" in args.servers:
            rows += measure_v2_server(
                "Nereid", onnx, image, jpeg, args.paths, args.clients, args.seconds, tmp, args.resnet_instances
            )
        # The limit right after Nereid and before the peers, whose stopped processes take a while to go.
        limits: dict[str, tuple[int, float]] = {}
        for path in args.paths:
            nereid = [r for r in rows if r.server == "Nereid" and r.path == path]
            batch = max(1, round(nereid[0].mean_batch)) if nereid else nereid_repository.MAX_BATCH // 2
            limits[path] = (
                batch,
                in_process_limit(onnx, batch, jpeg if path == "jpeg" else None, min(args.seconds, 10)),
            )
            print(f"in-process {path:6} batch {batch}: {limits[path][1]:.1f} images/s", flush=True)
        for server in (s for s in args.servers if s != "nereid"):
            if server == "triton":
                rows += measure_v2_server(
                    "Triton 2.51 (Python backend)",
                    onnx,
                    image,
                    jpeg,
                    args.paths,
                    args.clients,
                    args.seconds,
                    tmp,
                    args.resnet_instances,
                )
            else:
                name = {"ray": "Ray Serve", "litserve": "LitServe"}[server]
                rows += measure_peer(
                    name, onnx, image, jpeg, args.paths, args.clients, args.seconds, tmp, args.ray_max_ongoing
                )
            time.sleep(5)  # the stopped server's processes go before the next one starts

    lines = [
        "# High-traffic image API: ResNet-50, Nereid against real Triton, Ray Serve, LitServe and the in-process limit",
        "",
        f"`benchmarks/bench_image_api.py --clients {args.clients} --seconds {args.seconds:g}"
        + (f" --resnet-instances {args.resnet_instances}" if args.resnet_instances > 1 else "")
        + "`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {os.cpu_count()} CPUs, wrk with {args.clients} "
        "connections (one image per request). The limit: the same ONNX Runtime session in one process at the batch "
        "size Nereid's batcher formed (decoding the JPEGs first on the jpeg path).",
        "",
        "| path | server | images/s | p50 ms | p99 ms | errors | mean batch | of the in-process limit | Nereid over this server |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in args.paths:
        batch, limit = limits[path]
        lines.append(f"| {path} | in-process limit (batch {batch}) | {limit:.1f} | | | | {batch} | 1.00 | |")
        nereid_rate = next(
            (r.result.requests_per_s for r in rows if r.server == "Nereid" and r.path == path), float("nan")
        )
        for row in (r for r in rows if r.path == path):
            rate = row.result.requests_per_s
            versus = "" if row.server == "Nereid" or nereid_rate != nereid_rate else f"{nereid_rate / rate:.2f}x"
            lines.append(
                f"| {path} | {row.server} | {rate:.1f} | {row.result.p50_ms:.0f} | {row.result.p99_ms:.0f} | {row.result.errors} "
                f"| {row.mean_batch:.1f} | {rate / limit:.2f} | {versus} |"
            )
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
