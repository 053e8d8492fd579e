"""`nereid perf` command line: perf_analyzer's flag names parsed into a `PerfConfig`, live progress on stderr,
the summary table on stdout, `-f` CSV and `--json`. Every failure is one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from nereid.tools.common import ToolParser, progress_printer, run_tool
from nereid.tools.perf.config import (
    PerfConfig,
    PerfError,
    parse_concurrency_range,
    parse_request_rate_range,
    parse_sequence_id_range,
    parse_shape,
)

__all__ = ["PerfOutputs", "main", "parse_perf_args"]

_PROG = "nereid perf"


@dataclass(slots=True)
class PerfOutputs:
    csv_path: str | None = None
    verbose_csv: bool = False
    json_path: str | None = None  # "-" for stdout
    quiet: bool = False


def _parser() -> argparse.ArgumentParser:
    p = ToolParser(
        error_type=PerfError,
        prog=_PROG,
        description="Measure throughput and latency of a model on a running v2 (Triton-protocol) server, like perf_analyzer.",
        allow_abbrev=False,
    )
    add = p.add_argument
    add("-m", dest="model", required=True, metavar="MODEL", help="model name")
    add("-x", dest="version", default="", metavar="VERSION", help="model version (default: the server's choice)")
    add("-u", dest="url", default="", metavar="HOST:PORT", help="server URL (default localhost:8000 for HTTP, localhost:8001 for gRPC)")
    add("-i", dest="protocol", default="http", type=str.lower, choices=["http", "grpc"], help="protocol (default http)")
    add("-b", dest="batch_size", type=int, default=1, metavar="N", help="batch size of each request (default 1)")
    add("--concurrency-range", metavar="START:END:STEP", help="closed-loop concurrency levels (default 1)")
    add("--request-rate-range", metavar="START:END:STEP", help="open-loop request rates in requests/s")
    add("--request-distribution", default="constant", choices=["constant", "poisson"], help="gaps between requests in request-rate mode")
    add("-p", "--measurement-interval", dest="measurement_interval", type=int, default=5000, metavar="MS", help="window length in ms (default 5000)")
    add("-s", "--stability-percentage", dest="stability_percentage", type=float, default=10.0, metavar="PCT", help="allowed spread of the last 3 windows (default 10)")
    add("-r", "--max-trials", dest="max_trials", type=int, default=10, metavar="N", help="windows per level before giving up on stability (default 10)")
    add("--percentile", type=int, default=None, metavar="P", help="stabilise on the P-th percentile latency instead of the average")
    add("-l", "--latency-threshold", dest="latency_threshold", type=float, default=0.0, metavar="MS", help="stop the search once latency exceeds this")
    add("--input-data", action="append", default=None, metavar="random|zero|PATH", help="input data: random (default), zero, a JSON file or a directory (repeatable)")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2", help="shape of an input without the batch dimension (repeatable)")
    add("--string-length", type=int, default=128, metavar="N", help="length of random strings (default 128)")
    add("--string-data", default=None, metavar="TEXT", help="use this string for every string element")
    add("--input-tensor-format", default="binary", choices=["binary", "json"], help="HTTP input tensors (default binary)")
    add("--output-tensor-format", default="binary", choices=["binary", "json"], help="HTTP output tensors (default binary)")
    add("--streaming", action="store_true", help="gRPC bidirectional streaming (needed for decoupled models)")
    add("-a", "--async", dest="async_mode", action="store_true", help="accepted for compatibility: requests are always asynchronous")
    add("--sync", action="store_true", help="accepted for compatibility")
    add("--sequence-length", type=int, default=None, metavar="N", help="base length of sequences for sequence models (default 20)")
    add("--sequence-length-variation", type=float, default=20.0, metavar="PCT", help="+/- variation of sequence lengths (default 20)")
    add("--sequence-id-range", default="1", metavar="START[:END]", help="sequence ids to use (default 1, unbounded)")
    add("--num-of-sequences", type=int, default=4, metavar="N", help="concurrent sequences in request-rate mode (default 4)")
    add("--shared-memory", default="none", choices=["none", "system"], help="pass tensors in system shared memory")
    add("--output-shared-memory-size", type=int, default=102400, metavar="BYTES", help="shared memory per variable-size output (default 102400)")
    add("-H", dest="headers", action="append", default=[], metavar="NAME:VALUE", help="extra HTTP header (repeatable)")
    add("-f", dest="csv_path", default=None, metavar="PATH", help="write perf_analyzer's latency report CSV here")
    add("--verbose-csv", action="store_true", help="add request counts, streaming and client CPU columns to the CSV")
    add("--json", dest="json_path", nargs="?", const="-", default=None, metavar="PATH", help="write results as JSON (to stdout without PATH)")
    add("--workers", type=int, default=0, metavar="N", help="load-generator processes (default: chosen from the load and CPU count)")
    add("--request-timeout", type=float, default=60.0, metavar="S", help="give up on a request after this many seconds (default 60)")
    add("--warmup", type=float, default=0.0, metavar="S", help="seconds of load before the first window (default 0)")
    add("--seed", type=int, default=0, help="seed for random data and Poisson gaps")
    add("-v", "--verbose", action="store_true", help="print a traceback on internal errors")
    add("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def parse_perf_args(argv: list[str]) -> tuple[PerfConfig, PerfOutputs]:
    """Parse `nereid perf` flags; raises `PerfError` on any bad value (the message names the flag)."""
    args = _parser().parse_args(argv)
    shapes = dict(parse_shape(text) for text in args.shape)
    headers = {}
    for text in args.headers:
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise PerfError(f"-H: expected NAME:VALUE, got '{text}'")
        headers[name.strip()] = value.strip()
    config = PerfConfig(
        model_name=args.model,
        model_version=args.version,
        url=args.url,
        protocol=args.protocol,
        concurrency_range=parse_concurrency_range(args.concurrency_range) if args.concurrency_range is not None else None,
        request_rate_range=parse_request_rate_range(args.request_rate_range) if args.request_rate_range is not None else None,
        request_distribution=args.request_distribution,
        batch_size=args.batch_size,
        measurement_interval_ms=args.measurement_interval,
        stability_percentage=args.stability_percentage,
        max_trials=args.max_trials,
        percentile=args.percentile,
        latency_threshold_ms=args.latency_threshold,
        input_data=args.input_data or ["random"],
        shapes=shapes,
        string_length=args.string_length,
        string_data=args.string_data,
        input_tensor_format=args.input_tensor_format,
        output_tensor_format=args.output_tensor_format,
        streaming=args.streaming,
        async_mode=args.async_mode,
        sequence_length=args.sequence_length if args.sequence_length is not None else 20,
        sequence_length_given=args.sequence_length is not None,
        sequence_length_variation=args.sequence_length_variation,
        sequence_id_range=parse_sequence_id_range(args.sequence_id_range),
        num_of_sequences=args.num_of_sequences,
        shared_memory=args.shared_memory,
        output_shared_memory_size=args.output_shared_memory_size,
        headers=headers,
        workers=args.workers,
        request_timeout_s=args.request_timeout,
        warmup_s=args.warmup,
        seed=args.seed,
        verbose=args.verbose,
    )
    config.validate()
    return config, PerfOutputs(args.csv_path, args.verbose_csv, args.json_path, args.quiet)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nereid perf`; returns the exit status (0 ok, 1 failed run, 2 bad flags)."""
    return run_tool(
        argv,
        prog=_PROG,
        print_help=_parser().print_help,
        parse=parse_perf_args,
        run=_run,
        error=PerfError,
        verbose=lambda parsed: bool(parsed[0].verbose),
        debug_env="NEREID_PERF_DEBUG",
    )


def _run(parsed: tuple[PerfConfig, PerfOutputs]) -> int:
    config, outputs = parsed
    from nereid.tools.perf.report import format_table, json_document, write_csv, write_json
    from nereid.tools.perf.runner import run_perf

    results = run_perf(config, progress_printer(outputs.quiet))
    table = format_table(results)
    (sys.stderr if outputs.json_path == "-" else sys.stdout).write(table)
    if outputs.csv_path:
        write_csv(results, outputs.csv_path, config.percentile, outputs.verbose_csv)
    if outputs.json_path == "-":
        sys.stdout.write(json.dumps(json_document(results, config), indent=2) + "\n")
    elif outputs.json_path:
        write_json(results, config, outputs.json_path)
    return 0
