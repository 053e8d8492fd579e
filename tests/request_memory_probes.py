"""Issue 38's request-memory probe, shared by its integration test and benchmarks/bench_request_memory.py: clients
that declare a large gRPC message or HTTP body and send part of it, all at once, while normal inference runs and the
server's process tree's RSS is sampled. Raw sockets on 127.0.0.1 only; every probe is bounded in bytes and time."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hpack import Decoder, Encoder

__all__ = ["MiB", "ProbeResult", "Traffic", "RssWatcher", "grpc_probe", "http_probe", "run_probes", "tree_rss"]

MiB = 1 << 20
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_FRAME = 1 * MiB  # the largest DATA frame Nereid accepts (and advertises)
_SEND = 8 * MiB  # bytes per sendall: big writes keep 2 GiB of probing within seconds on 2 cores


def tree_rss(pid: int) -> int:
    """RSS of a process and all its children (a server's model worker processes)."""
    try:
        process = psutil.Process(pid)
        total = int(process.memory_info().rss)
        for child in process.children(recursive=True):
            try:
                total += int(child.memory_info().rss)
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


class RssWatcher:
    """Samples a process tree's RSS every 20 ms while in its `with` block; `peak - before` is its growth."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = tree_rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peak = max(self.peak, tree_rss(self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.before

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss(self.pid))


class Traffic:
    """Normal inference one request after another through the official client (`grpc` or `http`) while in its `with`
    block: the latency of each success and the errors of the failures."""

    def __init__(self, url: str, protocol: str, model: str = "add_sub") -> None:
        self.url, self.protocol, self.model = url, protocol, model
        self.latencies: list[float] = []
        self.finished: list[float] = []  # time.monotonic() at the end of each success, beside its latency
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def p99_ms(self) -> float:
        if len(self.latencies) < 2:
            return float("nan")
        return statistics.quantiles(self.latencies, n=100)[98] * 1000

    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")

    def within(self, windows: list[tuple[float, float]]) -> list[float]:
        """The latencies of the requests that ended inside any of the (start, end) monotonic windows."""
        return [
            latency
            for latency, end in zip(self.latencies, self.finished)
            if any(start <= end <= stop for start, stop in windows)
        ]

    def _run(self) -> None:
        module: object = grpcclient if self.protocol == "grpc" else httpclient
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        client = module.InferenceServerClient(self.url)  # type: ignore[attr-defined]
        inputs = [module.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    result = client.infer(self.model, inputs)
                    assert np.array_equal(result.as_numpy("OUTPUT0"), data + data)
                    self.latencies.append(time.perf_counter() - started)
                    self.finished.append(time.monotonic())
                except Exception as exc:  # every failure is reported by the caller
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self._stop.wait(0.05)
        finally:
            client.close()


@dataclass
class ProbeResult:
    sent: int = 0  # bytes of the body or message the server took before it answered or closed
    sent_at: float = 0.0  # time.monotonic() when the probe stopped sending
    status: str = ""  # HTTP status code, or the stream's grpc-status ("" when none came)
    message: str = ""  # the error text of the answer
    errors: list[str] = field(default_factory=list)


class _Receiver:
    """Reads a socket on a thread of its own, keeping the first 1 MiB (answers are small), until it closes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = bytearray()
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(256 * 1024):
                if len(self.data) < MiB:
                    self.data += chunk
        except OSError:
            pass
        self.closed.set()

    def wait_for(self, done: Callable[[bytes], bool], timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while not done(bytes(self.data)) and not self.closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return bytes(self.data)


def _send(sock: socket.socket, first: bytes, chunk: bytes, total: int) -> int:
    """`first` (headers and the start of the body), then `chunk` until `total` body bytes are sent or the server
    closes: a hostile client sends on after a refusal. The body bytes sent."""
    sent = 0
    try:
        sock.sendall(first)
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # refused and closed: what it said is read next
    return sent


def _grpc_status(data: bytes) -> tuple[str, str] | None:
    """grpc-status and grpc-message of stream 1 from the server's frames so far, or None before they came."""
    decoder, pos = Decoder(), 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        kind, stream_id = data[pos + 3], int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        if len(data) - pos - 9 < length:
            return None
        if kind == 1 and stream_id == 1:  # HEADERS
            fields = dict(decoder.decode(data[pos + 9 : pos + 9 + length]))
            if "grpc-status" in fields:
                return str(fields["grpc-status"]), str(fields.get("grpc-message", ""))
        pos += 9 + length
    return None


def grpc_probe(port: int, declared: int, total: int, hold: threading.Event, answer_timeout: float = 20) -> ProbeResult:
    """A ModelInfer call whose message prefix declares `declared` bytes, then `total` bytes of it in 1 MiB DATA
    frames, ignoring flow control as a hostile client would; the connection stays open until `hold` is set."""
    result = ProbeResult()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        receiver = _Receiver(sock)
        block = Encoder().encode(
            [(":method", "POST"), (":scheme", "http"), (":path", _MODEL_INFER), (":authority", "x"),
             ("content-type", "application/grpc"), ("te", "trailers")]
        )  # fmt: skip
        headers = _frame(1, 0x4, block)  # HEADERS, END_HEADERS
        data_frame = _frame(0, 0, bytes(_FRAME))
        first = _PREFACE + _frame(4, 0, b"") + headers + _frame(0, 0, b"\0" + declared.to_bytes(4, "big") + bytes(_FRAME - 5))
        sent = _FRAME
        result.sent = sent + _send(sock, first, data_frame * (_SEND // _FRAME), total - sent)
        result.sent_at = time.monotonic()
        status = _grpc_status(receiver.wait_for(lambda data: _grpc_status(data) is not None, answer_timeout))
        if status is not None:
            result.status, result.message = status
        hold.wait(120)
        _hang_up(sock)
    return result


def _hang_up(sock: socket.socket) -> None:
    """Close for real: shutdown wakes the receiving thread's recv (a bare close leaves the socket open under it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the server closed it first


def _frame(kind: int, flags: int, payload: bytes, stream_id: int | None = None) -> bytes:
    stream = (0 if kind == 4 else 1) if stream_id is None else stream_id
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _http_answer(data: bytes) -> tuple[str, str] | None:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if len(body) < length:
        return None
    return head.split()[1].decode(), body[:length].decode(errors="replace")


def http_probe(port: int, declared: int, total: int, hold: threading.Event, answer_timeout: float = 20) -> ProbeResult:
    """An /infer POST declaring a `declared`-byte JSON body, then `total` bytes of it; the connection stays open (if
    the server keeps it) until `hold` is set."""
    result = ProbeResult()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        receiver = _Receiver(sock)
        head = (
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % declared
        )
        result.sent = _send(sock, head, bytes(_SEND), total)
        result.sent_at = time.monotonic()
        answer = _http_answer(receiver.wait_for(lambda data: _http_answer(data) is not None, answer_timeout))
        if answer is not None:
            result.status, result.message = answer
        hold.wait(120)
        _hang_up(sock)
    return result


def run_probes(probe: Callable[[int, int, int, threading.Event, float], ProbeResult], port: int, count: int,
               declared: int, total: int, answer_timeout: float = 20) -> tuple[list[ProbeResult], float]:
    """`count` probes at once; each holds its connection until all have sent and been answered (or timed out).
    The results, and the seconds the probing took."""
    hold = threading.Event()
    results = [ProbeResult() for _ in range(count)]
    finished = threading.Semaphore(0)

    def one(index: int) -> None:
        try:
            results[index] = probe(port, declared, total, _Signal(hold, finished), answer_timeout)  # type: ignore[arg-type]
        except Exception as exc:
            results[index].errors.append(f"{type(exc).__name__}: {exc}")
            finished.release()

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for _ in range(count):
        finished.acquire(timeout=answer_timeout + 120)
    elapsed = time.monotonic() - started
    hold.set()
    for thread in threads:
        thread.join(30)
    return results, elapsed


class _Signal:
    """The `hold` a probe waits on, which first says that this probe is done sending and reading its answer."""

    def __init__(self, hold: threading.Event, finished: threading.Semaphore) -> None:
        self.hold, self.finished = hold, finished

    def wait(self, timeout: float) -> bool:
        self.finished.release()
        return self.hold.wait(timeout)
