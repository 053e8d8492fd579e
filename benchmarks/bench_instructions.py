"""Same-run A/B of the instructions the server executes per request: two source trees (the code before a change and
after it) each serve the example repository under valgrind's callgrind, and the same fixed requests are sent to each.

Throughput and even CPU time per request move by tens of percent on a shared VM (steal time, caches shared with other
guests), which hides a change of a few percent. The count of instructions executed is nearly free of that noise: it
is what the code does, not how fast the machine did it. It does not see cache misses or system-call cost, so it
complements the throughput benchmarks; it does not replace them. The client is this process (not counted); only
the server process runs under valgrind, from its first request after a warm-up to the last of each cell.

    .venv/bin/python benchmarks/bench_instructions.py --a /tmp/before/src --b src --requests 400

Needs valgrind (`apt-get install -y valgrind`). A server under callgrind runs about 50x slower, so the cells are
small; the counts per request still settle within a percent or two at a few hundred requests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from loadgen import http_binary_body, http_json_body  # noqa: E402
from tests.servers import free_port  # noqa: E402

REPO = ROOT / "examples" / "model_repository"
# The ONNX `simple` model (the core path, run on the event loop) and the Python backend's add_sub (the worker path;
# the worker's own instructions are not counted, only the server's side of each request).
INPUTS = {
    "simple": {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)},
    "add_sub_python": {"INPUT0": np.ones((1, 4), dtype=np.float32), "INPUT1": np.ones((1, 4), dtype=np.float32)},
}


def _without_monitoring(src: Path) -> list[str]:
    """Monitoring off where the tree has it: it samples a number of requests a second, and callgrind's fiftyfold
    slowdown would make that a large share of the requests counted here (its cost per sample is measured by
    bench_rollouts.py at full speed)."""
    flags = src / "nereid" / "serve_flags.py"
    has_monitoring = flags.exists() and "--monitoring-samples-per-second" in flags.read_text()
    return ["--monitoring-samples-per-second=0"] if has_monitoring else []


class ValgrindServer:
    """`python -m nereid serve` from one source tree, under callgrind with its instrumentation off until `count`
    turns it on (which also spares the start-up valgrind's slowest mode)."""

    def __init__(self, src: Path, out_dir: Path, label: str) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.out_dir = out_dir
        self.label = label
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_dir}/{label}.%p",
            sys.executable, "-m", "nereid", "serve", "--model-repository", str(REPO),
            "--model-control-mode=explicit", *(f"--load-model={m}" for m in INPUTS), "--log-info=false",
            f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
            *_without_monitoring(src),
        ]  # fmt: skip
        self.log = open(out_dir / f"{label}.log", "wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.close()
                tail = (out_dir / f"{label}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{label}: the server exited:\n{tail}")
            try:
                if requests.get(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"{label}: the server was not ready in 600 s")

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.process.pid)], check=True, capture_output=True)

    def count(self, send: Callable[[], None]) -> int:
        """Instructions the server executed while `send()` ran."""
        self._control("--zero")
        self._control("--instr=on")
        send()
        self._control("--instr=off")
        before = set(self.out_dir.glob(f"{self.label}.{self.process.pid}*"))
        self._control("--dump")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = set(self.out_dir.glob(f"{self.label}.{self.process.pid}*")) - before
            for path in new:
                match = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.MULTILINE)
                if match:
                    path.unlink()
                    return int(match.group(1))
            time.sleep(0.2)
        raise RuntimeError(f"{self.label}: no callgrind dump appeared")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _http_request(port: int, model: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST /v2/models/{model}/infer HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _read_response(conn: socket.socket, pending: bytearray) -> None:
    """Read one whole HTTP/1.1 response (Content-Length framed) off a keep-alive connection."""
    while True:
        head_end = pending.find(b"\r\n\r\n")
        if head_end >= 0:
            head = bytes(pending[:head_end]).lower()
            length = int(re.search(rb"\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            total = head_end + 4 + length
            if len(pending) >= total:
                if not head.startswith(b"http/1.1 200"):
                    raise RuntimeError(bytes(pending[:total]).decode(errors="replace"))
                del pending[:total]
                return
        chunk = conn.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        pending += chunk


def _in_threads(client: Callable[[], None], clients: int) -> None:
    """`clients` copies of `client` at once, each on its own connection; returns when all are done."""
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def http_sender(
    port: int, model: str, body: bytes, headers: dict[str, str], requests_per_client: int, clients: int
) -> Callable[[], None]:
    message = _http_request(port, model, body, headers)

    def one_client() -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            pending = bytearray()
            for _ in range(requests_per_client):
                conn.sendall(message)
                _read_response(conn, pending)

    return partial(_in_threads, one_client, clients)


def grpc_sender(port: int, model: str, requests_per_client: int, clients: int) -> Callable[[], None]:
    def one_client() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        tensors = []
        for name, array in INPUTS[model].items():
            tensors.append(
                grpcclient.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "FP32")
            )
            tensors[-1].set_data_from_numpy(array)
        for _ in range(requests_per_client):
            client.infer(model, tensors)
        client.close()

    return partial(_in_threads, one_client, clients)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="the src folder of the code before")
    parser.add_argument("--b", type=Path, required=True, help="the src folder of the code after")
    parser.add_argument("--requests", type=int, default=400, help="requests per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(INPUTS), choices=list(INPUTS))
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is missing: apt-get install -y valgrind")
    bodies = {m: (http_json_body(INPUTS[m]), http_binary_body(INPUTS[m], ["OUTPUT0", "OUTPUT1"])) for m in args.models}
    results: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        servers = {"A": ValgrindServer(args.a, Path(tmp), "A"), "B": ValgrindServer(args.b, Path(tmp), "B")}
        try:
            for rnd in range(args.rounds + 1):  # round 0 warms each route up, uncounted
                for concurrency in args.concurrency:
                    per_client = max(1, args.requests // concurrency) if rnd else 20
                    for name in ("A", "B") if rnd % 2 else ("B", "A"):
                        server = servers[name]
                        cells = {}
                        for model, (json_request, binary_request) in bodies.items():
                            port = server.http_port
                            cells[f"{model} HTTP JSON"] = http_sender(
                                port, model, *json_request, per_client, concurrency
                            )
                            cells[f"{model} HTTP binary"] = http_sender(
                                port, model, *binary_request, per_client, concurrency
                            )
                            cells[f"{model} gRPC"] = grpc_sender(server.grpc_port, model, per_client, concurrency)
                        for route, send in cells.items():
                            if not rnd:
                                send()
                                continue
                            total = server.count(send)
                            results.setdefault((route, concurrency, name), []).append(
                                total / (per_client * concurrency)
                            )
                            print(f"round {rnd} {name} {route} c={concurrency}: {results[(route, concurrency, name)][-1]:,.0f}",
                                  file=sys.stderr, flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"\nInstructions the server executed per request ({args.requests} requests a cell, {args.rounds} rounds, mean)\n"
    )
    print("| model and route | c | A | B | B/A | A's rounds | B's rounds |")
    print("|---|---|---|---|---|---|---|")
    routes = [f"{model} {route}" for model in args.models for route in ("HTTP JSON", "HTTP binary", "gRPC")]
    for concurrency in args.concurrency:
        for route in routes:
            a, b = results[(route, concurrency, "A")], results[(route, concurrency, "B")]
            mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
            print(f"| {route} | {concurrency} | {mean_a:,.0f} | {mean_b:,.0f} | {mean_b / mean_a:.3f} "
                  f"| {' '.join(f'{x:,.0f}' for x in a)} | {' '.join(f'{x:,.0f}' for x in b)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
