"""Drive a v2 server with C load generators (wrk for HTTP, h2load for gRPC) and parse their results.

Both are Debian packages (`apt-get install -y wrk nghttp2-client`); a Python client on a 2-core machine
would steal the CPU the server under test needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["LoadResult", "http_json_body", "http_binary_body", "grpc_body", "run_wrk", "run_h2load", "require_tools"]


@dataclass
class LoadResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int

    def row(self) -> str:
        return f"{self.requests_per_s:10.0f} {self.p50_ms:8.2f} {self.p99_ms:8.2f}"


def require_tools() -> None:
    missing = [t for t in ("wrk", "h2load") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"missing {missing}: apt-get install -y wrk nghttp2-client")


def http_json_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    doc = {
        "inputs": [
            {"name": n, "datatype": _dtype(a), "shape": list(a.shape), "data": a.reshape(-1).tolist()} for n, a in inputs.items()
        ]
    }
    return json.dumps(doc).encode(), {"Content-Type": "application/json"}


def http_binary_body(inputs: dict[str, np.ndarray], outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    doc = {
        "inputs": [
            {"name": n, "datatype": _dtype(a), "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
            for n, a in inputs.items()
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    header = json.dumps(doc).encode()
    body = header + b"".join(np.ascontiguousarray(a).tobytes() for a in inputs.values())
    return body, {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}


def grpc_body(model: str, inputs: dict[str, np.ndarray]) -> bytes:
    """A length-prefixed ModelInferRequest, the body of one unary gRPC call."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=_dtype(array), shape=array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    payload = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def _dtype(array: np.ndarray) -> str:
    return {"int32": "INT32", "float32": "FP32", "int64": "INT64", "float64": "FP64"}[str(array.dtype)]


_WRK_SCRIPT = """
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
wrk.method = "POST"
{headers}
"""


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_wrk(
    url: str, body: bytes, headers: dict[str, str], connections: int, seconds: float, timeout_s: float = 2.0
) -> LoadResult:
    """A closed loop of `connections` POSTs; a request slower than `timeout_s` (wrk's default: 2 s) is an error."""
    with tempfile.TemporaryDirectory() as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        header_lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_SCRIPT.format(body=body_path, headers=header_lines))
        out = subprocess.run(
            ["wrk", "-t", "1", "-c", str(connections), "-d", f"{max(int(seconds), 1)}s", "--timeout", f"{timeout_s:g}s",
             "--latency", "-s", str(script), url],  # fmt: skip
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    latencies = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    p50 = _ms(*re.match(r"([\d.]+)(\w+)", latencies["50"]).groups())  # type: ignore[union-attr]
    p99 = _ms(*re.match(r"([\d.]+)(\w+)", latencies["99"]).groups())  # type: ignore[union-attr]
    errors_match = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = int(errors_match.group(1)) if errors_match else 0
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    return LoadResult(rps, p50, p99, errors)


def run_h2load(url: str, path: str, body: bytes, connections: int, seconds: float) -> LoadResult:
    """Unary gRPC calls over h2c, one stream in flight per connection (concurrency = connections)."""
    with tempfile.TemporaryDirectory() as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        log_path = Path(tmp) / "log"
        completed = subprocess.run(
            [
                "h2load",
                "-c", str(connections),
                "-m", "1",
                "-t", "1",
                "-D", str(max(int(seconds), 1)),
                "-d", str(body_path),
                "-H", "content-type: application/grpc",
                "-H", "te: trailers",
                "--log-file", str(log_path),
                f"http://{url}{path}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = [line.split("\t") for line in log_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise RuntimeError(f"h2load completed no request:\n{completed.stdout[-2000:]}")
    starts = np.array([int(r[0]) for r in rows], dtype=np.int64)
    durations_ms = np.array([int(r[2]) for r in rows], dtype=np.float64) / 1000.0
    errors = sum(1 for r in rows if r[1] != "200")
    span_s = (starts.max() - starts.min()) / 1e6 if len(starts) > 1 else seconds
    return LoadResult(len(rows) / max(span_s, 1e-9), float(np.percentile(durations_ms, 50)), float(np.percentile(durations_ms, 99)), errors)


def cpu_count() -> int:
    return os.cpu_count() or 1
