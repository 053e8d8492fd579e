"""Issue 38's request-memory probe against Nereid with --request-memory-limit=512MiB and with the limit off (0), in
one run: eight clients at once declare a 1 GiB gRPC message (or HTTP body) and send 256 MiB of it (then, a second
shape, declare 100 MiB and send 96 MiB: some fit under the limit and hold their bytes), while normal add_sub
inferences go one after another through the official client. Prints the peak growth of the server's process tree
RSS and the p50/p99 of the normal requests, quiet and while the probes send.

    .venv/bin/python benchmarks/bench_request_memory.py [--probes 8] [--sent-mib 256] [--rounds 5] [--quiet-seconds 3]

The normal requests "while probes send" are those that ended between a round's start and its last probe's last byte
(rounds pooled): without a limit the probes then wait for an answer that never comes, a quiet time left out.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.request_memory_probes import MiB, RssWatcher, Traffic, grpc_probe, http_probe, run_probes  # noqa: E402
from tests.servers import RunningServer, start_nereid  # noqa: E402


def _quiet(server: RunningServer, protocol: str, seconds: float) -> Traffic:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with Traffic(url, protocol) as traffic:
        time.sleep(seconds)
    return traffic


_SHAPES = ((1024 * MiB, 256), (100 * MiB, 96))  # (declared, MiB sent): refused outright; partly admitted, then held


def _row(repository: Path, protocol: str, limit: str, declared: int, sent_mib: int, args: argparse.Namespace) -> list[str]:
    # A server of its own per row: memory a row freed stays in the allocator's heap and would hide the next row's growth.
    server = start_nereid(repository, f"--request-memory-limit={limit}", "--http-max-input-size=2147483648")
    try:
        _quiet(server, protocol, 1.0)  # warm: first-call allocations land before the baseline
        quiet = _quiet(server, protocol, args.quiet_seconds)
        url = server.grpc_url if protocol == "grpc" else server.http_url
        port = server.grpc_port if protocol == "grpc" else server.http_port
        probe = grpc_probe if protocol == "grpc" else http_probe
        answers: Counter[str] = Counter()
        windows: list[tuple[float, float]] = []  # while the probes were sending
        taken = 0
        # A probe that gets no answer (admitted, or no limit) waits 3 s with its bytes held, then closes.
        with RssWatcher(server.process.pid) as rss, Traffic(url, protocol) as during:
            for _ in range(args.rounds):
                started = time.monotonic()
                results, _ = run_probes(probe, port, args.probes, declared, sent_mib * MiB, answer_timeout=3)
                windows.append((started, max(r.sent_at for r in results)))
                taken += sum(r.sent for r in results)
                for r in results:
                    answers[(f"grpc-status {r.status}" if protocol == "grpc" else f"HTTP {r.status}") if r.status else "no answer"] += 1
        sending = during.within(windows)
        seconds = sum(stop - start for start, stop in windows)
        return [
            protocol,
            "512 MiB" if limit != "0" else "off",
            f"{declared // MiB:,} MiB declared, {sent_mib} MiB sent",
            f"+{rss.growth / MiB:,.0f} MiB",
            ", ".join(f"{n}x {answer}" for answer, n in sorted(answers.items())),
            f"{taken / MiB:,.0f} MiB in {seconds:.1f} s",
            f"{quiet.p50_ms():.1f} / {quiet.p99_ms():.1f} ms",
            f"{len(sending)}",
            f"{_ms(sending, 50)} / {_ms(sending, 99)} ms",
            f"{len(during.errors)}",
        ]
    finally:
        server.stop()


def _ms(latencies: list[float], percentile: int) -> str:
    if len(latencies) < 2:
        return "n/a"
    return f"{statistics.quantiles(latencies, n=100, method='inclusive')[percentile - 1] * 1000:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--sent-mib", type=int, default=256, help="at most this much sent per probe")
    parser.add_argument("--quiet-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5, help="probe rounds, pooled (each sends probes x sent-mib)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder) / "repository"
        shutil.copytree(ROOT / "tests" / "models" / "python" / "add_sub", repository / "add_sub")
        rows = [
            _row(repository, protocol, limit, declared, min(sent_mib, args.sent_mib), args)
            for protocol in ("grpc", "http")
            for declared, sent_mib in _SHAPES
            for limit in ("512MiB", "0")
        ]
    memory = psutil.virtual_memory().total / (1 << 30)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {psutil.cpu_count()} CPUs, "
          f"{memory:.0f} GiB RAM, Python {platform.python_version()}")  # fmt: skip
    print(f"# per row: {args.rounds} rounds of {args.probes} probes at once")
    print()
    head = ["transport", "limit", "each probe", "peak RSS growth", "probe answers", "probe bytes sent", "normal p50 / p99, quiet",
            "normal requests while probes send", "normal p50 / p99, while probes send", "normal failures"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
