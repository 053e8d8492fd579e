"""Issue 14's hostile-client probes, one at a time, against Nereid and real Triton on the same Python model in one
run: each probe's growth of the server's RSS (its whole process tree) and the p99 and failures of normal
requests sent meanwhile. Every probe is bounded in count and time and speaks only to 127.0.0.1.

    .venv/bin/python benchmarks/bench_hostile_clients.py [--scale 1.0] [--seconds 20] [--only nereid|triton]

--scale shrinks every count and size (0.05 for a quick proof that it runs); --seconds bounds the timed probes.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpack import Encoder  # noqa: E402
from hyperframe.frame import (  # noqa: E402
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
)
from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

MIB = 1024 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_INFER_BODY = (
    b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]},'
    b'{"name":"INPUT1","datatype":"FP32","shape":[1,4],"data":[1,1,1,1]}]}'
)


# -- measuring ------------------------------------------------------------------------------------------------
def tree_rss(pid: int) -> int:
    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


@dataclass
class Observation:
    rss_before: int = 0
    rss_peak: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    note: str = ""


class Watcher:
    """While a probe runs: normal requests one after another (10 ms apart) and RSS samples every 100 ms."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.seen = Observation(rss_before=tree_rss(server.process.pid))
        self.seen.rss_peak = self.seen.rss_before
        self.threads = [threading.Thread(target=self._requests), threading.Thread(target=self._sample)]

    def __enter__(self) -> Observation:
        for thread in self.threads:
            thread.start()
        return self.seen

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # what the probe left behind is still in the peak
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _requests(self) -> None:
        url = f"{self.server.base}/v2/models/add_sub_python/infer"
        session = requests.Session()
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                ok = session.post(url, data=_INFER_BODY, timeout=5).status_code == 200
            except requests.RequestException:
                ok = False
                session = requests.Session()
            if ok:
                self.seen.latencies.append(time.perf_counter() - started)
            else:
                self.seen.failures += 1
            self.stop.wait(0.01)

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.seen.rss_peak = max(self.seen.rss_peak, tree_rss(self.server.process.pid))
            self.stop.wait(0.1)


# -- probes ---------------------------------------------------------------------------------------------------
def _connect(port: int, timeout: float = 5) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return sock


def _send_until_blocked(sock: socket.socket, chunks: Callable[[], bytes | None], seconds: float) -> int:
    """Send chunks until they run out, the peer stops reading for 2 s, closes, or time is up; bytes sent."""
    sock.settimeout(2)
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        chunk = chunks()
        if chunk is None:
            break
        try:
            sock.sendall(chunk)
        except (TimeoutError, OSError):
            break
        sent += len(chunk)
    return sent


def probe_big_body(server: RunningServer, scale: float, seconds: float) -> str:
    declared, to_send = 8 * 1024 * MIB, int(256 * MIB * scale)
    sock = _connect(server.http_port)
    sock.sendall(b"POST /v2/models/add_sub_python/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % declared)
    block = b"\0" * MIB
    left = [to_send]

    def chunks() -> bytes | None:
        if left[0] <= 0:
            return None
        piece = block[: left[0]]
        left[0] -= len(piece)
        return piece

    sent = _send_until_blocked(sock, chunks, seconds)
    sock.close()
    return f"{sent / MIB:.1f} of {to_send / MIB:.1f} MiB taken"


def probe_pipelined(server: RunningServer, scale: float, seconds: float) -> str:
    count = int(300_000 * scale)
    sock = _connect(server.http_port)
    request = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n"
    batch = 1000
    left = [count]

    def chunks() -> bytes | None:
        if left[0] <= 0:
            return None
        n = min(batch, left[0])
        left[0] -= n
        return request * n

    sent = _send_until_blocked(sock, chunks, seconds)
    time.sleep(1)
    sock.close()
    return f"{sent // len(request)} of {count} written"


def _hold_connections(port: int, count: int, seconds: float, slow: bool) -> str:
    socks = []
    for _ in range(count):
        try:
            sock = _connect(port)
            if slow:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n")
            socks.append(sock)
        except OSError:
            break
    deadline = time.monotonic() + seconds
    closed = 0
    while time.monotonic() < deadline:
        time.sleep(1)
        if slow:
            for sock in socks:
                try:
                    sock.sendall(b"x-a: b\r\n")  # one more header line a second, never the end
                except OSError:
                    closed += 1
    for sock in socks:
        sock.close()
    return f"{len(socks)} opened" + (f", {closed} writes refused" if slow else "")


def probe_slowloris(server: RunningServer, scale: float, seconds: float) -> str:
    return _hold_connections(server.http_port, int(800 * scale), seconds, slow=True)


def probe_idle(server: RunningServer, scale: float, seconds: float) -> str:
    return _hold_connections(server.http_port, int(3000 * scale), seconds, slow=False)


class _H2:
    """A raw HTTP/2 client: preface and SETTINGS, then whatever frames the probe writes."""

    def __init__(self, port: int) -> None:
        self.sock = _connect(port)
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())
        self.encoder = Encoder()
        self.received = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while data := self.sock.recv(65536):
                if len(self.received) < 4 * MIB:
                    self.received += data
        except OSError:
            pass

    def headers(self, stream_id: int, path: str, end_headers: bool = True, end_stream: bool = False) -> HeadersFrame:
        block = self.encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
        )
        flags = (["END_HEADERS"] if end_headers else []) + (["END_STREAM"] if end_stream else [])
        return HeadersFrame(stream_id, data=block, flags=flags)

    def send(self, frames: Sequence[Frame]) -> bool:
        try:
            self.sock.sendall(b"".join(f.serialize() for f in frames))
            return True
        except OSError:
            return False

    def frames(self) -> list[Frame]:
        out, pos, data = [], 0, bytes(self.received)
        while len(data) - pos >= 9:
            frame, length = Frame.parse_frame_header(memoryview(data[pos : pos + 9]))
            if len(data) - pos - 9 < length:
                break
            frame.parse_body(memoryview(data[pos + 9 : pos + 9 + length]))
            out.append(frame)
            pos += 9 + length
        return out

    def goaway(self) -> str:
        for frame in self.frames():
            if isinstance(frame, GoAwayFrame):
                return f"GOAWAY {frame.error_code}"
        return "no GOAWAY"

    def close(self) -> None:
        self.sock.close()


_INFER = "/inference.GRPCInferenceService/ModelInfer"


def probe_rapid_reset(server: RunningServer, scale: float, seconds: float) -> str:
    count = int(50_000 * scale)
    client = _H2(server.grpc_port)
    deadline = time.monotonic() + seconds
    done = 0
    for start in range(0, count, 100):
        batch: list[Frame] = []
        for n in range(start, min(start + 100, count)):
            stream_id = 2 * n + 1
            batch += [client.headers(stream_id, _INFER), RstStreamFrame(stream_id, error_code=8)]
        if not client.send(batch) or time.monotonic() > deadline:
            break
        done = min(start + 100, count)
    time.sleep(0.5)
    answer = client.goaway()
    client.close()
    return f"{done} of {count} sent, {answer}"


def probe_continuation(server: RunningServer, scale: float, seconds: float) -> str:
    total = int(256 * MIB * scale)
    client = _H2(server.grpc_port)
    first = client.headers(1, _INFER, end_headers=False)
    client.send([first])
    piece = ContinuationFrame(1, data=b"\x00\x01a" + b"\x7f" * (16384 - 3))
    left = [total]

    def chunks() -> bytes | None:
        if left[0] <= 0:
            return None
        left[0] -= 64 * 16384
        return piece.serialize() * 64

    sent = _send_until_blocked(client.sock, chunks, seconds)
    time.sleep(0.5)
    answer = client.goaway()
    client.close()
    return f"{sent / MIB:.1f} of {total / MIB:.1f} MiB taken, {answer}"


def probe_open_streams(server: RunningServer, scale: float, seconds: float) -> str:
    count = int(20_000 * scale)
    client = _H2(server.grpc_port)
    time.sleep(0.3)
    advertised = "no MAX_CONCURRENT_STREAMS"
    for frame in client.frames():
        if isinstance(frame, SettingsFrame) and SettingsFrame.MAX_CONCURRENT_STREAMS in frame.settings:
            advertised = f"MAX_CONCURRENT_STREAMS {frame.settings[SettingsFrame.MAX_CONCURRENT_STREAMS]}"
    opened = 0
    for start in range(0, count, 200):
        batch = [client.headers(2 * n + 1, _INFER) for n in range(start, min(start + 200, count))]
        if not client.send(batch):
            break
        opened = min(start + 200, count)
    time.sleep(min(seconds, 3))
    refused = sum(1 for frame in client.frames() if isinstance(frame, RstStreamFrame))
    client.close()
    return f"{opened} opened, {refused} refused, {advertised}"


def probe_grpc_prefix(server: RunningServer, scale: float, seconds: float) -> str:
    total = int(256 * MIB * scale)
    client = _H2(server.grpc_port)
    client.send([client.headers(1, _INFER)])
    prefix = b"\x00" + (2 * 1024 * MIB).to_bytes(4, "big")
    left = [total]
    started = [False]

    def chunks() -> bytes | None:
        if left[0] <= 0:
            return None
        body = b"\0" * 16384
        if not started[0]:
            started[0] = True
            body = prefix + body[5:]
        left[0] -= 64 * 16384
        return DataFrame(1, data=body).serialize() * 64  # a hostile client ignores flow control

    sent = _send_until_blocked(client.sock, chunks, seconds)
    time.sleep(0.5)
    frames = client.frames()
    ended = any(isinstance(f, (RstStreamFrame, GoAwayFrame)) or (isinstance(f, HeadersFrame) and "END_STREAM" in f.flags) for f in frames)
    client.close()
    return f"{sent / MIB:.1f} of {total / MIB:.1f} MiB taken, " + ("refused" if ended else "no answer")


PROBES: list[tuple[str, Callable[[RunningServer, float, float], str]]] = [
    ("Content-Length 8 GiB declared, 256 MiB sent", probe_big_body),
    ("300k pipelined requests written, none read", probe_pipelined),
    ("800 slowloris connections", probe_slowloris),
    ("3,000 idle connections", probe_idle),
    ("50k HTTP/2 HEADERS+RST_STREAM (rapid reset)", probe_rapid_reset),
    ("HEADERS then 256 MiB of CONTINUATION", probe_continuation),
    ("20k HTTP/2 streams opened and left open", probe_open_streams),
    ("gRPC message prefix of 2 GiB, 256 MiB sent", probe_grpc_prefix),
]


def _repository(root: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(ROOT / "examples" / "model_repository" / "add_sub_python", repo / "add_sub_python")
    return repo


def run_all(server: RunningServer, scale: float, seconds: float, only: str) -> list[tuple[str, str, Observation]]:
    rows = []
    for name, probe in PROBES:
        if only not in name:
            continue
        with Watcher(server) as seen:
            try:
                note = probe(server, scale, seconds)
            except Exception as exc:  # a probe that breaks says so in the table; the others still run
                note = f"probe error: {type(exc).__name__}: {exc}"
        alive = _alive(server)
        rows.append((name, note + ("" if alive else ", SERVER DOWN"), seen))
        if not alive:
            break
    return rows


def _alive(server: RunningServer) -> bool:
    try:
        return requests.get(f"{server.base}/v2/health/live", timeout=10).status_code == 200
    except requests.RequestException:
        return False


def _p99(latencies: list[float]) -> str:
    if len(latencies) < 2:
        return "n/a"
    return f"{statistics.quantiles(latencies, n=100)[98] * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--only", choices=["nereid", "triton"], default=None)
    parser.add_argument("--probe", default="", help="run only the probes whose name contains this text")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    repo = _repository(root)
    results: dict[str, list[tuple[str, str, Observation]]] = {}
    try:
        for kind in ("nereid", "triton"):
            if args.only not in (None, kind):
                continue
            if kind == "triton" and not reference_ready():
                print("real Triton is not here: skipped")
                continue
            server = start_nereid(repo, log_dir=root) if kind == "nereid" else start_real_triton(repo)
            try:
                results[kind] = run_all(server, args.scale, args.seconds, args.probe)
            finally:
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nscale {args.scale}, timed probes {args.seconds:g} s; RSS of the server's process tree; normal requests: "
          f"HTTP JSON add_sub_python, one at a time, 10 ms apart\n")
    header = "| probe | " + " | ".join(f"{k}: RSS growth | {k}: p99 / failed | {k}: result" for k in results) + " |"
    print(header)
    print("|" + "---|" * (1 + 3 * len(results)))
    for index, (name, _) in enumerate(p for p in PROBES if args.probe in p[0]):
        cells = [name]
        for rows in results.values():
            if index >= len(rows):
                cells += ["-", "-", "not run (server down)"]
                continue
            _, note, seen = rows[index]
            growth = (seen.rss_peak - seen.rss_before) / MIB
            cells += [f"+{growth:.0f} MiB", f"{_p99(seen.latencies)} / {seen.failures}", note]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
