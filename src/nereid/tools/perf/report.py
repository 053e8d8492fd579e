"""Output formats: the summary table, perf_analyzer's latency-report CSV (`-f`, microseconds, rows by increasing
throughput) and a JSON document of every result."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from nereid.tools.perf.config import PerfConfig, PerfError
from nereid.tools.perf.results import PerfResult

__all__ = ["CSV_COLUMNS", "csv_text", "format_table", "json_document", "write_csv", "write_json"]

# perf_analyzer's column names after the first ("Concurrency" or "Request Rate").
CSV_COLUMNS = [
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
    "request/response",
    "response wait",
]
_VERBOSE_COLUMNS = [
    "Request Count",
    "Server Request Count",
    "Server Execution Count",
    "Avg First Response",
    "Responses/Request",
    "Client CPU %",
    "Stable",
]


def _us(value: float) -> str:
    return str(int(round(value)))


def csv_text(results: list[PerfResult], percentile: int | None = None, verbose: bool = False) -> str:
    if not results:
        return ""
    first = "Request Rate" if results[0].mode == "request_rate" else "Concurrency"
    columns = [first, *CSV_COLUMNS]
    extra = percentile if percentile is not None and percentile not in (50, 90, 95, 99) else None
    if extra is not None:
        columns.insert(columns.index("p99 latency") + 1, f"p{extra} latency")
    if verbose:
        columns += _VERBOSE_COLUMNS
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for r in sorted(results, key=lambda item: item.throughput):
        server = r.server
        send_recv = r.client_send_us + r.client_recv_us
        row = [
            str(r.concurrency) if r.mode == "concurrency" else f"{r.request_rate:g}",
            f"{r.throughput:.2f}",
            _us(r.client_send_us),
            _us(r.network_server_us),
            _us(server.queue_us if server else 0),
            _us(server.compute_input_us if server else 0),
            _us(server.compute_infer_us if server else 0),
            _us(server.compute_output_us if server else 0),
            _us(r.client_recv_us),
            _us(r.latency.p50_us),
            _us(r.latency.p90_us),
            _us(r.latency.p95_us),
            _us(r.latency.p99_us),
            _us(r.latency.avg_us),
            _us(send_recv),
            _us(max(0.0, r.latency.avg_us - send_recv)),
        ]
        if extra is not None:
            row.insert(columns.index(f"p{extra} latency"), _us(r.latency.extra[extra]))
        if verbose:
            row += [
                str(r.request_count),
                str(server.request_count if server else ""),
                str(server.execution_count if server else ""),
                _us(r.first_response.avg_us) if r.first_response else "",
                f"{r.responses_per_request:.2f}" if r.responses_per_request is not None else "",
                f"{r.client_cpu_percent:.1f}",
                "1" if r.stable else "0",
            ]
        writer.writerow(row)
    return out.getvalue()


def write_csv(results: list[PerfResult], path: str | Path, percentile: int | None = None, verbose: bool = False) -> None:
    try:
        Path(path).write_text(csv_text(results, percentile, verbose))
    except OSError as exc:
        raise PerfError(f"-f: cannot write {path}: {exc.strerror}") from None


def json_document(results: list[PerfResult], config: PerfConfig) -> dict[str, Any]:
    return {
        "model": config.model_name,
        "model_version": config.model_version,
        "url": config.server_url,
        "protocol": config.protocol,
        "streaming": config.streaming,
        "mode": config.mode,
        "batch_size": config.batch_size,
        "measurement_interval_ms": config.measurement_interval_ms,
        "stability_percentage": config.stability_percentage,
        "results": [r.to_dict() for r in results],
    }


def write_json(results: list[PerfResult], config: PerfConfig, path: str | Path) -> None:
    text = json.dumps(json_document(results, config), indent=2) + "\n"
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise PerfError(f"--json: cannot write {path}: {exc.strerror}") from None


def format_table(results: list[PerfResult]) -> str:
    """A fixed-width summary, one row per level, latencies in microseconds."""
    if not results:
        return "no results\n"
    streaming = any(r.first_response is not None for r in results)
    head = ["Concurrency" if results[0].mode == "concurrency" else "Rate/s", "Infer/s", "p50 us", "p90 us", "p95 us", "p99 us", "Avg us"]
    head += ["Queue us", "CompIn us", "Infer us", "CompOut us"]
    if streaming:
        head += ["1st resp us", "Resp/req"]
    head += ["Client CPU", "Stable"]
    rows = []
    for r in results:
        server = r.server
        row = [
            str(r.concurrency) if r.mode == "concurrency" else f"{r.request_rate:g}",
            f"{r.throughput:,.1f}",
            *(f"{v:,.0f}" for v in (r.latency.p50_us, r.latency.p90_us, r.latency.p95_us, r.latency.p99_us, r.latency.avg_us)),
        ]
        if server is not None:
            row += [f"{v:,.0f}" for v in (server.queue_us, server.compute_input_us, server.compute_infer_us, server.compute_output_us)]
        else:
            row += ["-"] * 4
        if streaming:
            row += [
                f"{r.first_response.avg_us:,.0f}" if r.first_response else "-",
                f"{r.responses_per_request:.2f}" if r.responses_per_request is not None else "-",
            ]
        row += [f"{r.client_cpu_percent:.0f}%", "yes" if r.stable else "no"]
        rows.append(row)
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in [head, *rows]]
    return "\n".join(lines) + "\n"
