"""`nereid analyze` command line: flags parsed into `AnalyzeSettings`, progress on stderr, a summary on stdout.
Every failure is one line on stderr and a non-zero exit (2 for bad flags, 1 for a failed run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nereid.tools.analyze.settings import (
    AnalyzeError,
    AnalyzeSettings,
    parse_bool_list,
    parse_concurrency_list,
    parse_int_list,
    parse_objective,
    parse_preferred_list,
)
from nereid.tools.common import ToolParser, progress_printer, run_tool

__all__ = ["main", "parse_analyze_args"]

_PROG = "nereid analyze"


def _parser() -> argparse.ArgumentParser:
    p = ToolParser(
        error_type=AnalyzeError,
        prog=_PROG,
        description=(
            "Search model configurations (max_batch_size, dynamic batching, instance count, ONNX intra-op threads) on a "
            "v2 server in explicit model-control mode, measure each with nereid perf, and write the best config for each "
            "objective, a CSV, charts and an HTML report."
        ),
        allow_abbrev=False,
    )
    add = p.add_argument
    add("-m", "--model", dest="model", required=True, metavar="MODEL", help="model to analyze")
    add("--model-repository", metavar="PATH", help="repository holding the model (needed unless --url is given)")
    add("-u", "--url", default="", metavar="HOST:PORT", help="HTTP address of a running server in explicit mode (default: start nereid serve)")
    add("--grpc-url", default="", metavar="HOST:PORT", help="gRPC address of that server for -i grpc (default: its host, port 8001)")
    add("--metrics-url", default="", metavar="HOST:PORT", help="its metrics endpoint (default: its host, port 8002)")
    add("-i", "--protocol", dest="protocol", default="http", type=str.lower, choices=["http", "grpc"], help="protocol of the load (default http)")
    add("-o", "--output-dir", default="analysis", metavar="DIR", help="where the report and the best configs go (default ./analysis)")
    add("--mode", default="quick", choices=["quick", "brute"], help="quick: hill climbing from the model's config (default); brute: every combination")
    add("--objective", action="append", default=None, metavar="NAME", help="max_throughput or min_latency (repeatable; default both)")
    add("--max-p99-latency-ms", type=float, default=None, metavar="MS", help="constraint: p99 latency at most this")
    add("--min-throughput", type=float, default=None, metavar="N", help="constraint: at least this many inferences/s")
    add("--max-memory-mb", type=float, default=None, metavar="MB", help="constraint: server memory at most this")
    add("--max-batch-sizes", default=None, metavar="LIST", help="max_batch_size values to try with dynamic batching (default 2,4,...,64)")
    add("--dynamic-batching", default=None, metavar="on|off|both", help="dynamic batching settings to try (default both)")
    add("--max-queue-delays-us", default=None, metavar="LIST", help="max_queue_delay_microseconds values (default 0,500)")
    add("--preferred-batch-sizes", default=None, metavar="LIST", help="none, max (the variant's max_batch_size) or sizes (default none)")
    add("--instance-counts", default=None, metavar="LIST", help="instance counts to try (default 1..min(4, cores))")
    add("--intra-op-threads", default=None, metavar="LIST", help="ONNX intra_op_thread_count values (default 1,2,4,... up to the cores)")
    add("--concurrency", default="1,2,4,8", metavar="LIST", help="concurrency levels for each config: 1,2,4 or start:end:step (default 1,2,4,8)")
    add("-b", "--batch-size", type=int, default=1, metavar="N", help="batch size of each request (default 1)")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2", help="shape of a variable input without the batch dimension (repeatable)")
    add("--measurement-interval-ms", type=int, default=1000, metavar="MS", help="perf window length (default 1000)")
    add("--max-trials", type=int, default=5, metavar="N", help="windows per level before giving up on stability (default 5)")
    add("--stability-percentage", type=float, default=20.0, metavar="PCT", help="allowed spread of the last 3 windows (default 20)")
    add("--warmup-s", type=float, default=0.25, metavar="S", help="load before the first window of each level (default 0.25)")
    add("--time-budget-s", type=float, default=600.0, metavar="S", help="the whole search fits in this many seconds (default 600)")
    add("--max-variants", type=int, default=0, metavar="N", help="measure at most this many configurations (default: no limit)")
    add("--copy-model-files", action="store_true", help="copy version folders into the output repository instead of linking them")
    add("--server-start-timeout-s", type=float, default=120.0, metavar="S", help="how long the server analyze starts may take")
    add("-v", "--verbose", action="store_true", help="every perf window in the progress, tracebacks on internal errors")
    add("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def parse_analyze_args(argv: list[str]) -> tuple[AnalyzeSettings, bool]:
    """Parse `nereid analyze` flags into settings (and the quiet flag); raises `AnalyzeError` on a bad value."""
    args = _parser().parse_args(argv)
    from nereid.tools.perf import PerfError, parse_shape

    try:
        shapes = dict(parse_shape(text) for text in args.shape)
    except PerfError as exc:
        raise AnalyzeError(str(exc)) from None
    settings = AnalyzeSettings(
        model=args.model,
        model_repository=Path(args.model_repository) if args.model_repository else None,
        url=args.url,
        grpc_url=args.grpc_url,
        metrics_url=args.metrics_url,
        protocol=args.protocol,
        output_dir=Path(args.output_dir),
        mode=args.mode,
        objectives=list(dict.fromkeys(parse_objective(o) for o in args.objective)) if args.objective else ["max_throughput", "min_latency"],
        max_p99_latency_ms=args.max_p99_latency_ms,
        min_throughput=args.min_throughput,
        max_memory_mb=args.max_memory_mb,
        max_batch_sizes=parse_int_list("--max-batch-sizes", args.max_batch_sizes) if args.max_batch_sizes else None,
        dynamic_batching=parse_bool_list(args.dynamic_batching) if args.dynamic_batching else None,
        max_queue_delays_us=parse_int_list("--max-queue-delays-us", args.max_queue_delays_us, 0) if args.max_queue_delays_us else None,
        preferred_batch_sizes=parse_preferred_list(args.preferred_batch_sizes) if args.preferred_batch_sizes else None,
        instance_counts=parse_int_list("--instance-counts", args.instance_counts) if args.instance_counts else None,
        intra_op_threads=parse_int_list("--intra-op-threads", args.intra_op_threads) if args.intra_op_threads else None,
        concurrency=parse_concurrency_list(args.concurrency),
        batch_size=args.batch_size,
        shapes=shapes,
        measurement_interval_ms=args.measurement_interval_ms,
        max_trials=args.max_trials,
        stability_percentage=args.stability_percentage,
        warmup_s=args.warmup_s,
        time_budget_s=args.time_budget_s,
        max_variants=args.max_variants,
        copy_model_files=args.copy_model_files,
        server_start_timeout_s=args.server_start_timeout_s,
        verbose=args.verbose,
    )
    settings.validate()
    return settings, bool(args.quiet)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nereid analyze`; returns the exit status (0 ok, 1 failed run, 2 bad flags)."""
    return run_tool(
        argv,
        prog=_PROG,
        print_help=_parser().print_help,
        parse=parse_analyze_args,
        run=_run,
        error=AnalyzeError,
        verbose=lambda parsed: bool(parsed[0].verbose),
        debug_env="NEREID_ANALYZE_DEBUG",
    )


def _run(parsed: tuple[AnalyzeSettings, bool]) -> int:
    settings, quiet = parsed
    from nereid.tools.analyze.runner import run_analyze

    result = run_analyze(settings, progress_printer(quiet))
    for objective in settings.objectives:
        pick = result.best.get(objective)
        if pick is None:
            sys.stdout.write(f"{objective}: no measured configuration meets the constraints\n")
        else:
            m = pick.measurement
            sys.stdout.write(
                f"{objective}: {pick.outcome.label} (concurrency {m.concurrency}: {m.throughput:,.1f} infer/s, "
                f"p99 {m.p99_ms:.2f} ms) -> {pick.config_path}\n"
            )
    sys.stdout.write(f"report: {result.files['html']}\n")
    if result.fatal:
        sys.stderr.write(f"{_PROG}: error: {result.fatal}\n")
        return 1
    if not any(o.measured for o in result.outcomes):
        sys.stderr.write(f"{_PROG}: error: no configuration could be measured\n")
        return 1
    return 0
