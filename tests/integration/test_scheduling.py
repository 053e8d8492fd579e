"""Dynamic batching, priorities, queue policies, rate limiting and the response cache, observed through
tritonclient, the statistics endpoint and the metrics endpoint of a real server."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from examples.build_models import identity
from tritonclient.utils import InferenceServerException

from tests.integration.onnx_builders import busy_loop, write
from tests.servers import RunningServer, free_port, start_nereid

from onnx import TensorProto  # isort: skip

_IDENTITY = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ {batching} }}
{extra}
"""

_BUSY = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "ITERS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "STATE" data_type: TYPE_FP32 dims: [ 1, 128 ] }}, {{ name: "ITERS_OUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
{extra}
"""


def _identity_model(repo: Path, name: str, batching: str, extra: str = "") -> None:
    identity(repo / name / "1" / "model.onnx", TensorProto.FLOAT, name)
    write(repo / name / "config.pbtxt", _IDENTITY.format(name=name, batching=batching, extra=extra))


def _busy_model(repo: Path, name: str, extra: str = "") -> None:
    busy_loop(repo / name / "1" / "model.onnx")
    write(repo / name / "config.pbtxt", _BUSY.format(name=name, extra=extra))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scheduling")
    _identity_model(root, "batched", "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000000")
    _identity_model(root, "batched_short", "max_queue_delay_microseconds: 300000")
    _identity_model(root, "cached", "", "response_cache { enable: true }")
    _busy_model(root, "prioritized", "dynamic_batching { priority_levels: 2 default_priority_level: 2 }")
    _busy_model(
        root,
        "rejecting",
        "dynamic_batching { default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 200000 } }",
    )
    _busy_model(
        root,
        "delaying",
        "dynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1 allow_timeout_override: true } }",
    )
    _busy_model(root, "bounded", "dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    _busy_model(
        root,
        "overridable",
        "dynamic_batching { default_queue_policy { allow_timeout_override: true } }",
    )
    _busy_model(root, "cancellable", "dynamic_batching { }")
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(repo, "--cache-config=local,size=1048576", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop()


@pytest.fixture()
def iters_per_second(server: RunningServer) -> float:
    """How many busy-loop iterations this machine runs per second, so delays scale to it: measured again for each
    test, since a shared machine's speed changes over a module's run (a blocker sized minutes earlier can end
    before the request it should hold back has timed out)."""
    client = httpclient.InferenceServerClient(server.http_url)
    _busy(client, "cancellable", 200)
    start = time.perf_counter()
    _busy(client, "cancellable", 4000)
    elapsed = time.perf_counter() - start
    client.close()
    return 4000 / elapsed


def _busy(client: httpclient.InferenceServerClient, model: str, iters: int, **kwargs: object) -> object:
    tensor = httpclient.InferInput("ITERS", [1], "INT64")
    tensor.set_data_from_numpy(np.array([iters], dtype=np.int64))
    return client.infer(model, [tensor], **kwargs)  # type: ignore[arg-type]


def _identity_input(module: object, rows: int, width: int, value: float = 1.0) -> list[object]:
    tensor = module.InferInput("INPUT0", [rows, width], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.full((rows, width), value, dtype=np.float32))
    return [tensor]


def _stats(server: RunningServer, model: str) -> dict:
    return requests.get(f"{server.base}/v2/models/{model}/stats", timeout=5).json()["model_stats"][0]


def _pending(server: RunningServer, model: str) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    match = re.search(rf'nv_inference_pending_request_count{{model="{model}",version="1"}} ([\d.]+)', text)
    return float(match.group(1)) if match else 0.0


def _wait_pending(server: RunningServer, model: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _pending(server, model) < count:
        assert time.monotonic() < deadline, f"{model} never had {count} pending requests"
        time.sleep(0.01)


def test_dynamic_batcher_merges_concurrent_requests_into_preferred_batch(server: RunningServer) -> None:
    async def run() -> None:
        client = httpaio.InferenceServerClient(server.http_url)
        try:
            results = await asyncio.gather(
                *(client.infer("batched", _identity_input(httpaio, 1, 4, float(i))) for i in range(8))
            )
        finally:
            await client.close()
        for i, result in enumerate(results):
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), float(i), dtype=np.float32))

    asyncio.run(run())
    stats = _stats(server, "batched")
    assert stats["inference_count"] == 8
    assert stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [8]


def test_dynamic_batcher_keeps_different_shapes_apart_and_counts_batch_sizes(server: RunningServer) -> None:
    async def run() -> None:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            shapes = [(1, 3)] * 3 + [(1, 5)] * 2 + [(3, 3)]
            results = await asyncio.gather(
                *(client.infer("batched_short", _identity_input(grpcaio, r, w)) for r, w in shapes)
            )
            assert [r.as_numpy("OUTPUT0").shape for r in results] == shapes
        finally:
            await client.close()

    asyncio.run(run())
    stats = _stats(server, "batched_short")
    assert stats["inference_count"] == 3 + 2 + 3
    sizes = sorted(b["batch_size"] for b in stats["batch_stats"])
    # Width 3: three requests of one row plus one of three rows (6 items); width 5: two rows.
    assert sizes == [2, 6], stats["batch_stats"]


def _iters(n: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("ITERS", [1], "INT64")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int64))
    return tensor


def test_priority_order_is_visible_in_completion_sequence(server: RunningServer, iters_per_second: float) -> None:
    """Completion order through one instance: every high-priority request finishes before any low one."""

    async def run() -> list[str]:
        client = httpaio.InferenceServerClient(server.http_url)
        done: list[str] = []

        async def call(label: str, iters: int, priority: int) -> None:
            await client.infer("prioritized", [_aio_iters(iters)], priority=priority)
            done.append(label)

        try:
            blocker = asyncio.ensure_future(call("blocker", int(iters_per_second * 0.6), 2))
            await asyncio.sleep(0)
            await _async_wait_pending(server, "prioritized", 0)
            lows = [asyncio.ensure_future(call(f"low{i}", 10, 2)) for i in range(3)]
            await _async_wait_pending(server, "prioritized", 3)
            highs = [asyncio.ensure_future(call(f"high{i}", 10, 1)) for i in range(3)]
            await _async_wait_pending(server, "prioritized", 6)
            await asyncio.gather(blocker, *lows, *highs)
        finally:
            await client.close()
        return done

    done = asyncio.run(run())
    assert done[0] == "blocker"
    assert sorted(done[1:4]) == ["high0", "high1", "high2"], done
    assert sorted(done[4:]) == ["low0", "low1", "low2"], done


def _aio_iters(n: int) -> httpaio.InferInput:
    tensor = httpaio.InferInput("ITERS", [1], "INT64")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int64))
    return tensor


async def _async_wait_pending(server: RunningServer, model: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while await asyncio.to_thread(_pending, server, model) < count:
        assert time.monotonic() < deadline, f"{model} never had {count} pending requests"
        await asyncio.sleep(0.01)


def test_queue_timeout_rejects_requests_that_waited_too_long(server: RunningServer, iters_per_second: float) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    blocker = client.async_infer("rejecting", [_iters(int(iters_per_second * 0.8))])
    queued = client.async_infer("rejecting", [_iters(10)])
    blocker.get_result()
    with pytest.raises(InferenceServerException, match="Request timeout expired"):
        queued.get_result()
    # A request that arrives when the instance is free still runs.
    assert _busy(client, "rejecting", 10) is not None
    client.close()


def test_delay_action_runs_timed_out_requests_after_the_others(server: RunningServer, iters_per_second: float) -> None:
    async def run() -> list[str]:
        client = httpaio.InferenceServerClient(server.http_url)
        done: list[str] = []

        async def call(label: str, iters: int, timeout_us: int | None) -> None:
            kwargs = {"timeout": timeout_us} if timeout_us is not None else {}
            await client.infer("delaying", [_aio_iters(iters)], **kwargs)
            done.append(label)

        try:
            blocker = asyncio.ensure_future(call("blocker", int(iters_per_second * 0.6), 60_000_000))
            await _async_wait_pending(server, "delaying", 0)
            late = asyncio.ensure_future(call("expired", 10, None))  # default timeout of 1 µs: DELAY
            await _async_wait_pending(server, "delaying", 1)
            punctual = [asyncio.ensure_future(call(f"ok{i}", 10, 60_000_000)) for i in range(2)]
            await _async_wait_pending(server, "delaying", 3)
            await asyncio.gather(blocker, late, *punctual)
        finally:
            await client.close()
        return done

    done = asyncio.run(run())
    assert done[-1] == "expired", done


def test_max_queue_size_rejects_the_request_over_the_limit(server: RunningServer, iters_per_second: float) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    # Long enough that the two queued requests arrive while it runs, even when the suite's load slowed the
    # calibration (0.6 s once ended before they queued).
    blocker = client.async_infer("bounded", [_iters(int(iters_per_second * 1.5))])
    _wait_pending(server, "bounded", 0)
    queued = [client.async_infer("bounded", [_iters(10)]) for _ in range(2)]
    _wait_pending(server, "bounded", 2)
    with pytest.raises(InferenceServerException, match="Exceeds maximum queue size") as excinfo:
        _busy(client, "bounded", 10)
    assert excinfo.value.status() in ("503", "StatusCode.UNAVAILABLE", None) or "503" in str(excinfo.value.status())
    blocker.get_result()
    for handle in queued:
        handle.get_result()
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    assert re.search(r'nv_inference_request_failure{model="bounded",reason="REJECTED",version="1"} 1', metrics), metrics
    client.close()


def test_per_request_timeout_overrides_the_default_when_allowed(server: RunningServer, iters_per_second: float) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    blocker = client.async_infer("overridable", [_iters(int(iters_per_second * 0.6))])
    _wait_pending(server, "overridable", 0)
    impatient = client.async_infer("overridable", [_iters(10)], timeout=50_000)
    patient = client.async_infer("overridable", [_iters(10)])
    blocker.get_result()
    with pytest.raises(InferenceServerException, match="Request timeout expired"):
        impatient.get_result()
    patient.get_result()
    client.close()


def _grpc_iters(n: int) -> grpcaio.InferInput:
    tensor = grpcaio.InferInput("ITERS", [1], "INT64")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int64))
    return tensor


_BLOCKER_HEAD_START_SECS = 0.3


async def _grpc_blocker(
    client: grpcaio.InferenceServerClient, server: RunningServer, iters_per_second: float
) -> asyncio.Future[object]:
    """A three-second request on `cancellable`, once it executes: whatever is sent next waits in the queue."""
    blocker = asyncio.ensure_future(client.infer("cancellable", [_grpc_iters(int(iters_per_second * 3.0))]))
    # Nothing the server reports tells an executing request from one not yet arrived (both leave 0 pending; the
    # wait for 0 pending this replaced returned at once, and once the next request got in first), so give the
    # blocker a tenth of its run to arrive and start.
    await asyncio.sleep(_BLOCKER_HEAD_START_SECS)
    return blocker


def test_cancelled_grpc_request_leaves_the_queue_without_executing(
    server: RunningServer, iters_per_second: float
) -> None:
    async def attempt(client: grpcaio.InferenceServerClient, seconds: float) -> int | None:
        """The execution count before a blocker, once a victim queued behind it was cancelled; None when the
        blocker ended before the victim was seen queued (the machine sped up after the rate was measured)."""
        before = (await asyncio.to_thread(_stats, server, "cancellable"))["execution_count"]
        blocker = asyncio.ensure_future(client.infer("cancellable", [_grpc_iters(int(iters_per_second * seconds))]))
        # Streams of one connection may reach the server in either order: give the blocker a head start, so the
        # victim cannot run first (it would execute, and the count below would be off).
        await asyncio.sleep(0.3)
        victim = asyncio.ensure_future(client.infer("cancellable", [_grpc_iters(10)]))
        while await asyncio.to_thread(_pending, server, "cancellable") < 1:
            if blocker.done():
                await asyncio.gather(victim, return_exceptions=True)
                return None
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        await blocker
        return int(before)

    async def run() -> int:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            for seconds in (3.0, 6.0, 12.0):
                before = await attempt(client, seconds)
                if before is not None:
                    return before
            raise AssertionError("the victim was never seen queued behind a blocker")
        finally:
            await client.close()

    before = asyncio.run(run())
    after = _stats(server, "cancellable")
    assert after["execution_count"] == before + 1, "the cancelled request must never execute"
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    assert re.search(r'nv_inference_request_failure{model="cancellable",reason="CANCELED",version="1"} 1', metrics)


def test_grpc_request_past_its_deadline_fails_and_never_executes(
    server: RunningServer, iters_per_second: float
) -> None:
    """tritonclient's client_timeout is the call's gRPC deadline: the caller gets DEADLINE_EXCEEDED and the
    request, still queued behind a long one, is dropped unexecuted."""

    async def run() -> None:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            blocker = await _grpc_blocker(client, server, iters_per_second)
            with pytest.raises(InferenceServerException, match="Deadline Exceeded") as raised:
                await client.infer("cancellable", [_grpc_iters(10)], client_timeout=0.3)
            assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            await blocker
        finally:
            await client.close()

    before = _stats(server, "cancellable")["execution_count"]
    asyncio.run(run())
    assert _stats(server, "cancellable")["execution_count"] == before + 1, "the expired request must never execute"


def test_disconnected_http_request_leaves_the_queue_without_executing(
    server: RunningServer, iters_per_second: float
) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    before = _stats(server, "cancellable")["execution_count"]
    blocker = client.async_infer("cancellable", [_iters(int(iters_per_second * 3.0))])
    time.sleep(_BLOCKER_HEAD_START_SECS)  # as in _grpc_blocker
    body = b'{"inputs":[{"name":"ITERS","datatype":"INT64","shape":[1],"data":[10]}]}'
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{server.base}/v2/models/cancellable/infer", data=body, timeout=0.3)
    blocker.get_result()
    deadline = time.monotonic() + 5
    while _pending(server, "cancellable") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _stats(server, "cancellable")["execution_count"] == before + 1
    client.close()


def test_local_response_cache_answers_identical_requests_without_executing(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    first = client.infer("cached", _identity_input(httpclient, 1, 4, 3.0))  # type: ignore[arg-type]
    second = client.infer("cached", _identity_input(httpclient, 1, 4, 3.0))  # type: ignore[arg-type]
    other = client.infer("cached", _identity_input(httpclient, 1, 4, 4.0))  # type: ignore[arg-type]
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), second.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), np.full((1, 4), 4.0, dtype=np.float32))
    stats = _stats(server, "cached")
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 3
    assert stats["execution_count"] == 2
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    assert re.search(r'nv_cache_num_hits_per_model{model="cached",version="1"} 1', metrics), metrics


@pytest.fixture()
def redis_port(tmp_path: Path) -> Iterator[int]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is installed by `make test` (apt-get install redis-server)"
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield port
    process.terminate()
    process.wait(10)


def test_redis_response_cache_is_shared_and_survives_a_server_restart(
    repo: Path, redis_port: int, tmp_path: Path
) -> None:
    flags = ("--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={redis_port}")
    import redis

    for attempt in range(2):
        running = start_nereid(repo, *flags, "--model-control-mode=explicit", "--load-model=cached", log_dir=tmp_path)
        try:
            client = httpclient.InferenceServerClient(running.http_url)
            result = client.infer("cached", _identity_input(httpclient, 1, 4, 7.0))  # type: ignore[arg-type]
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 7.0, dtype=np.float32))
            stats = _stats(running, "cached")["inference_stats"]
            # The first server fills Redis; the second, a new process, is answered from it.
            assert (stats["cache_miss"]["count"], stats["cache_hit"]["count"]) == ((1, 0) if attempt == 0 else (0, 1))
        finally:
            running.stop()
    assert len(redis.Redis(port=redis_port).keys("nereid:*")) == 1


def test_rate_limiter_never_runs_two_instances_holding_one_resource_at_once(
    tmp_path: Path, iters_per_second: float
) -> None:
    limited = 'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "core" global: true count: 1 } ] } } ]'
    for name in ("left", "right"):
        _busy_model(tmp_path, name, limited)
    iters = int(iters_per_second * 0.4)

    running = start_nereid(tmp_path, "--rate-limit=execution_count", log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(running.http_url, concurrency=2)
        handles = [client.async_infer(name, [_iters(iters)]) for name in ("left", "right")]
        for handle in handles:
            handle.get_result()
        client.close()
        stats = [_stats(running, name)["inference_stats"] for name in ("left", "right")]
    finally:
        running.stop()
    # One global unit of "core": whichever ran second waited in its queue for the other's whole execution.
    waited_ns = max(s["queue"]["ns"] for s in stats)
    other_compute_ns = min(s["compute_infer"]["ns"] for s in stats)
    assert waited_ns >= 0.8 * other_compute_ns, stats
