"""`nereid perf`: a load generator and latency/throughput meter for any v2 (Triton-protocol) server, what
perf_analyzer does. Clients run in worker processes; this package never imports the server's internals.

Python API (what `nereid analyze` builds on)::

    from nereid.tools.perf import PerfConfig, run_perf
    results = run_perf(PerfConfig("simple", url="localhost:8000", concurrency_range=(1, 4, 1)))
    results[0].throughput, results[0].latency.p99_us, results[0].server.queue_us

Names resolve lazily, so worker processes that import one submodule do not pay for numpy and the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nereid.tools.common import lazy_exports

if TYPE_CHECKING:
    from nereid.tools.perf.cli import main, parse_perf_args
    from nereid.tools.perf.config import (
        PerfConfig,
        PerfError,
        parse_concurrency_range,
        parse_request_rate_range,
        parse_shape,
    )
    from nereid.tools.perf.report import CSV_COLUMNS, csv_text, format_table, json_document, write_csv, write_json
    from nereid.tools.perf.results import LatencySummary, PerfResult
    from nereid.tools.perf.runner import run_perf
    from nereid.tools.perf.server_stats import ServerBreakdown

_EXPORTS = {
    "main": "cli",
    "parse_perf_args": "cli",
    "PerfConfig": "config",
    "PerfError": "config",
    "parse_concurrency_range": "config",
    "parse_request_rate_range": "config",
    "parse_shape": "config",
    "CSV_COLUMNS": "report",
    "csv_text": "report",
    "format_table": "report",
    "json_document": "report",
    "write_csv": "report",
    "write_json": "report",
    "LatencySummary": "results",
    "PerfResult": "results",
    "run_perf": "runner",
    "ServerBreakdown": "server_stats",
}

__all__ = [
    "CSV_COLUMNS",
    "LatencySummary",
    "PerfConfig",
    "PerfError",
    "PerfResult",
    "ServerBreakdown",
    "csv_text",
    "format_table",
    "json_document",
    "main",
    "parse_concurrency_range",
    "parse_perf_args",
    "parse_request_rate_range",
    "parse_shape",
    "run_perf",
    "write_csv",
    "write_json",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
