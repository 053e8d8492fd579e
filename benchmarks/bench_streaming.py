"""Streaming and composed inference on Nereid and on real Triton, side by side in one run.

(a) A decoupled Python model sends 64 responses per request to 16 concurrent gRPC streams (tritonclient.grpc
    streaming clients, spread over several client processes): responses per second, and the time to the first
    response of a request at p50 and p99.
(b) The same three-step pipeline (three Python models: x + 1, then * 2, then - 3, FP32 [16]) as an ensemble and as
    one BLS model calling the three steps in turn: latency at concurrency 1 and throughput at concurrency 16 (h2load,
    gRPC unary).

Both servers serve the same generated repository (Python models only: real Triton here has only the Python backend),
one instance per model, and are measured one after the other at each point. Prints a table with Nereid's ratio to
Triton (higher is better for Nereid: rates as Nereid/Triton, latencies as Triton/Nereid) and writes
benchmarks/out/streaming.json.

    .venv/bin/python benchmarks/bench_streaming.py                   # 10 s per point
    .venv/bin/python benchmarks/bench_streaming.py --duration 2 --warmup 0.5     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

from benchmarks.loadgen import grpc_body, http_binary_body, run_h2load, run_wrk  # noqa: E402

STREAM_MODEL = "stream_decoupled"
STEPS = (("step_pre", "x + 1.0"), ("step_mid", "x * 2.0"), ("step_post", "x - 3.0"))
WIDTH = 16

# -- the repository ------------------------------------------------------------------------------------------------
_STREAM_CONFIG = """
name: "stream_decoupled"
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
_STREAM_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                out = pb_utils.Tensor("OUT", np.array([index], np.int32))
                sender.send(pb_utils.InferenceResponse([out]), flags=final if index == count - 1 else 0)
            if count == 0:
                sender.send(flags=final)
        return None
'''
_STEP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
_STEP_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", {expression})]))
        return responses
'''
_ENSEMBLE_CONFIG = """
name: "pipeline_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "step_pre" model_version: -1 input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "a" }} }},
    {{ model_name: "step_mid" model_version: -1 input_map {{ key: "IN" value: "a" }} output_map {{ key: "OUT" value: "b" }} }},
    {{ model_name: "step_post" model_version: -1 input_map {{ key: "IN" value: "b" }} output_map {{ key: "OUT" value: "OUT" }} }}
  ]
}}
"""
_BLS_CONFIG = """
name: "pipeline_bls"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
_BLS_MODEL = '''
import triton_python_backend_utils as pb_utils

STEPS = ("step_pre", "step_mid", "step_post")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            error = None
            for step in STEPS:
                reply = pb_utils.InferenceRequest(
                    model_name=step, requested_output_names=["OUT"], inputs=[pb_utils.Tensor("IN", tensor.as_numpy())]
                ).exec()
                if reply.has_error():
                    error = reply.error()
                    break
                tensor = pb_utils.get_output_tensor_by_name(reply, "OUT")
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message())))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", tensor.as_numpy())]))
        return responses
'''


def build_repository(directory: Path) -> Path:
    def model(name: str, config: str, source: str | None) -> None:
        (directory / name / "1").mkdir(parents=True)
        (directory / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
        if source is not None:
            (directory / name / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())

    model(STREAM_MODEL, _STREAM_CONFIG, _STREAM_MODEL)
    for name, expression in STEPS:
        model(name, _STEP_CONFIG.format(name=name, width=WIDTH), _STEP_MODEL.format(expression=expression))
    model("pipeline_ensemble", _ENSEMBLE_CONFIG.format(width=WIDTH), None)
    model("pipeline_bls", _BLS_CONFIG.format(width=WIDTH), _BLS_MODEL)
    return directory


# -- (a) streaming through tritonclient.grpc --------------------------------------------------------------------------
def _stream_process(
    url: str, streams: int, responses: int, warmup: float, duration: float, results: Any, ready: Any, go: Any
) -> None:
    """One client process: `streams` gRPC streams, each sending a request as soon as the previous one finished."""
    import tritonclient.grpc as grpcclient

    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([responses], np.int32))
    lock = threading.Lock()
    first_ms: list[float] = []
    totals = {"responses": 0, "errors": 0}
    window = {"start": float("inf"), "end": float("inf")}
    clients = []

    def make_callback(client: Any, state: dict[str, Any]) -> Any:
        def callback(result: Any, error: Any) -> None:
            now = time.perf_counter()
            in_window = window["start"] <= now < window["end"]
            if error is not None:
                if in_window:  # stop_stream cancels what is still streaming at the end: not an error
                    with lock:
                        totals["errors"] += 1
                return
            if state["first"] is None:
                state["first"] = now
                if state["sent"] >= window["start"] and now < window["end"]:
                    with lock:
                        first_ms.append((now - state["sent"]) * 1000)
            state["received"] += 1
            if in_window:
                with lock:
                    totals["responses"] += 1
            if state["received"] == responses and now < window["end"]:
                send(client, state)

        return callback

    def send(client: Any, state: dict[str, Any]) -> None:
        state["first"] = None
        state["received"] = 0
        state["sent"] = time.perf_counter()
        client.async_stream_infer(STREAM_MODEL, [count])

    states = []
    for _ in range(streams):
        client = grpcclient.InferenceServerClient(url)
        state: dict[str, Any] = {"first": None, "received": 0, "sent": 0.0}
        client.start_stream(callback=make_callback(client, state))
        clients.append(client)
        states.append(state)
    ready.put(True)
    go.wait()
    begin = time.perf_counter()
    window["start"] = begin + warmup
    window["end"] = begin + warmup + duration
    for client, state in zip(clients, states, strict=True):
        send(client, state)
    time.sleep(warmup + duration + 0.5)
    for client in clients:
        client.stop_stream(cancel_requests=True)
        client.close()
    results.put({"first_ms": first_ms, **totals})


@dataclass
class StreamPoint:
    server: str
    responses_per_s: float
    first_p50_ms: float
    first_p99_ms: float
    requests: int
    errors: int


def measure_streaming(
    server: str, url: str, streams: int, processes: int, responses: int, warmup: float, duration: float
) -> StreamPoint:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ready = context.Queue()
    go = context.Event()
    per_process = [streams // processes + (1 if i < streams % processes else 0) for i in range(processes)]
    workers = [
        context.Process(target=_stream_process, args=(url, n, responses, warmup, duration, results, ready, go))
        for n in per_process
        if n
    ]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    go.set()
    gathered = [results.get(timeout=warmup + duration + 120) for _ in workers]
    for worker in workers:
        worker.join(30)
    first = np.array([ms for g in gathered for ms in g["first_ms"]], dtype=np.float64)
    total = sum(g["responses"] for g in gathered)
    return StreamPoint(
        server,
        total / duration,
        float(np.percentile(first, 50)) if first.size else float("nan"),
        float(np.percentile(first, 99)) if first.size else float("nan"),
        int(first.size),
        sum(g["errors"] for g in gathered),
    )


# -- (b) ensemble against BLS through h2load ----------------------------------------------------------------------------
@dataclass
class PipelinePoint:
    server: str
    model: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def check_pipeline(url: str, model: str) -> None:
    """One request through tritonclient: the answer must be (x + 1) * 2 - 3 (h2load does not read gRPC statuses)."""
    import tritonclient.grpc as grpcclient

    x = np.arange(WIDTH, dtype=np.float32)
    tensor = grpcclient.InferInput("IN", [WIDTH], "FP32")
    tensor.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(url).infer(model, [tensor], client_timeout=60)
    np.testing.assert_array_equal(result.as_numpy("OUT"), (x + 1) * 2 - 3)


def measure_pipeline(
    server: str, running: RunningServer, model: str, concurrency: int, warmup: float, duration: float, transport: str
) -> PipelinePoint:
    inputs = {"IN": np.arange(WIDTH, dtype=np.float32)}
    if transport == "http":
        # wrk over HTTP/1.1 with binary tensors: the core's share of the cost, without the gRPC frontend's.
        url = f"http://{running.http_url}/v2/models/{model}/infer"
        http_body, headers = http_binary_body(inputs, ["OUT"])
        if warmup > 0:
            run_wrk(url, http_body, headers, concurrency, warmup)
        result = run_wrk(url, http_body, headers, concurrency, duration)
    else:
        body = grpc_body(model, inputs)
        path = "/inference.GRPCInferenceService/ModelInfer"
        if warmup > 0:
            run_h2load(running.grpc_url, path, body, concurrency, warmup)
        result = run_h2load(running.grpc_url, path, body, concurrency, duration)
    return PipelinePoint(server, model, concurrency, result.requests_per_s, result.p50_ms, result.p99_ms, result.errors)


# -- the run --------------------------------------------------------------------------------------------------------------
def _ratio(nereid: float, triton: float, higher_is_better: bool) -> str:
    if not triton or not nereid or np.isnan(triton) or np.isnan(nereid):
        return "   n/a"
    return f"{(nereid / triton if higher_is_better else triton / nereid):6.2f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measurement")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--processes", type=int, default=4, help="client processes for the streams")
    parser.add_argument("--responses", type=int, default=64, help="responses per streamed request")
    parser.add_argument("--concurrency", type=int, default=16, help="the throughput point of the pipelines")
    parser.add_argument("--no-triton", action="store_true", help="measure Nereid only")
    parser.add_argument(
        "--transport", choices=("grpc", "http"), default="grpc", help="(b) over h2load gRPC or wrk HTTP/1.1 (binary tensors)"
    )
    parser.add_argument("--only", choices=("all", "stream", "pipeline"), default="all", help="which part to run")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "out" / "streaming.json")
    args = parser.parse_args(argv)

    servers: dict[str, RunningServer] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = build_repository(Path(tmp) / "repository")
        try:
            if not args.no_triton:
                if not reference_ready():
                    raise SystemExit("the real Triton reference cannot be set up; use --no-triton")
                servers["triton"] = start_real_triton(repository)
            servers["nereid"] = start_nereid(repository, log_dir=Path(tmp))
            for running in servers.values():
                for model in ("pipeline_ensemble", "pipeline_bls"):
                    check_pipeline(running.grpc_url, model)

            streams = []
            for name, running in servers.items():
                if args.only == "pipeline":
                    break
                streams.append(
                    measure_streaming(
                        name, running.grpc_url, args.streams, args.processes, args.responses, args.warmup, args.duration
                    )
                )
            pipelines = []
            for model in ("pipeline_ensemble", "pipeline_bls") if args.only != "stream" else ():
                for concurrency in (1, args.concurrency):
                    for name, running in servers.items():
                        pipelines.append(
                            measure_pipeline(
                                name, running, model, concurrency, args.warmup, args.duration, args.transport
                            )
                        )
        finally:
            for running in servers.values():
                running.stop()

    if streams:
        _print_streams(args, streams)
    if pipelines:
        _print_pipelines(args, pipelines)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "streaming": [asdict(p) for p in streams],
                "pipelines": [asdict(p) for p in pipelines],
            },
            indent=1,
        )
    )
    print(f"\nwrote {args.output}")
    return 0


def _print_streams(args: argparse.Namespace, streams: list[StreamPoint]) -> None:
    print(
        f"\n(a) decoupled Python model, {args.responses} responses per request, {args.streams} gRPC streams "
        f"({args.processes} client processes), {args.duration:g} s"
    )
    print(f"{'server':8} {'responses/s':>12} {'first p50 ms':>13} {'first p99 ms':>13} {'requests':>9} {'errors':>7}")
    for point in streams:
        print(
            f"{point.server:8} {point.responses_per_s:12.0f} {point.first_p50_ms:13.2f} {point.first_p99_ms:13.2f} "
            f"{point.requests:9d} {point.errors:7d}"
        )
    by_server = {p.server: p for p in streams}
    if "triton" in by_server:
        n, t = by_server["nereid"], by_server["triton"]
        print(
            f"{'ratio':8} {_ratio(n.responses_per_s, t.responses_per_s, True):>12} "
            f"{_ratio(n.first_p50_ms, t.first_p50_ms, False):>13} {_ratio(n.first_p99_ms, t.first_p99_ms, False):>13}"
        )


def _print_pipelines(args: argparse.Namespace, pipelines: list[PipelinePoint]) -> None:
    tool = "wrk HTTP/1.1" if args.transport == "http" else "h2load gRPC"
    print(f"\n(b) three Python steps as an ensemble and as one BLS model, FP32 [{WIDTH}], {tool}, {args.duration:g} s")
    print(f"{'model':18} {'c':>3} {'server':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}  ratio (req/s, p50)")
    table: dict[tuple[str, int], dict[str, PipelinePoint]] = {}
    for point in pipelines:
        table.setdefault((point.model, point.concurrency), {})[point.server] = point
    for (model, concurrency), row in table.items():
        for name, point in row.items():
            ratio = ""
            if name == "nereid" and "triton" in row:
                t = row["triton"]
                ratio = f"  {_ratio(point.requests_per_s, t.requests_per_s, True)} {_ratio(point.p50_ms, t.p50_ms, False)}"
            print(
                f"{model:18} {concurrency:3d} {name:8} {point.requests_per_s:9.0f} {point.p50_ms:8.2f} "
                f"{point.p99_ms:8.2f} {point.errors:7d}{ratio}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
