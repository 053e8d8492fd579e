"""nereid.pytriton through the official tritonclient: functions bound with PyTriton's API are ordinary models
(decorators, model-config fields, decoupled streams, errors, statistics, metrics, ensembles, BLS, cache, tokens).

One Triton object serves every model of this module (bound before run(), plus one bound while it runs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid.pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError, PyTritonValidationError
from nereid.pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from nereid.pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from tests.integration import pytriton_models as models
from tests.servers import ROOT, free_port

USER_REPOSITORY = ROOT / "tests" / "models" / "pytriton_repo"
F32 = np.float32
FAST_CALLS = models.ThreadRecorder()
SLOW_CALLS = models.ThreadRecorder()


def _t(name: str, dtype: Any, shape: tuple[int, ...], optional: bool = False) -> Tensor:
    return Tensor(name=name, dtype=dtype, shape=shape, optional=optional)


def local_config(**fields: Any) -> TritonConfig:
    return TritonConfig(
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), **fields,
    )  # fmt: skip


class Served:
    def __init__(self, triton: Triton, config: TritonConfig, counter: models.CallCounter) -> None:
        self.triton = triton
        self.config = config
        self.counter = counter
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{config.http_port}")
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{config.grpc_port}")
        self.token = {"triton-access-token": triton.get_access_token() or ""}

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"


def bind_all(triton: Triton, counter: models.CallCounter) -> None:
    vec = [_t("INPUT0", F32, (4,)), _t("INPUT1", F32, (4,))]
    triton.bind("add_sub", models.add_sub, vec, [_t("OUTPUT0", F32, (4,)), _t("OUTPUT1", F32, (4,))],
                config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=100)))
    triton.bind("scale", models.scale, [_t("x", F32, (-1,)), _t("factor", F32, (1,))], [_t("y", F32, (-1,))],
                config=ModelConfig(batching=False))
    triton.bind("echo", models.echo_parameters, [_t("x", F32, (1,))],
                [_t("params", np.bytes_, (1,)), _t("requested", np.bytes_, (1,))], config=ModelConfig(max_batch_size=4))
    triton.bind("optional_offset", models.optional_offset,
                [_t("value", np.int32, (1,)), _t("offset", np.int32, (1,), optional=True)], [_t("total", np.int32, (1,))],
                config=ModelConfig(max_batch_size=8))
    triton.bind("by_mode", models.by_mode, [_t("data", F32, (2,)), _t("mode", np.bytes_, (1,))],
                [_t("out", F32, (2,)), _t("group_size", np.int32, (1,))],
                config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=2_000_000,
                                                                            preferred_batch_size=[4])))
    triton.bind("temperature", models.with_temperature, [_t("prompt", F32, (2,)), _t("temperature", F32, (1,))],
                [_t("scaled", F32, (2,))], config=ModelConfig(max_batch_size=8))
    triton.bind("padded", models.padded, [_t("x", F32, (1,))], [_t("seen", np.int32, (1,))],
                config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[2, 4])))
    triton.bind("context", models.ContextModel(), [_t("x", F32, (1,))],
                [_t("model", np.bytes_, (1,)), _t("max_batch", np.int32, (1,))], config=ModelConfig(max_batch_size=3))
    triton.bind("parallel", [models.ParallelInstance(0).infer, models.ParallelInstance(1).infer], [_t("x", F32, (1,))],
                [_t("instance", np.int32, (1,)), _t("together", np.int32, (1,))], config=ModelConfig(max_batch_size=1))
    triton.bind("countdown", models.countdown, [_t("start", np.int32, (1,))], [_t("value", np.int32, (1,))],
                config=ModelConfig(max_batch_size=4, decoupled=True))
    triton.bind("fails", models.fails, [_t("x", F32, (1,))], [_t("y", F32, (1,))])
    triton.bind("strict", models.wrong_dtype, [_t("x", F32, (1,))], [_t("y", F32, (1,))], strict=True)
    triton.bind("lenient", models.wrong_dtype, [_t("x", F32, (1,))], [_t("y", F32, (1,))])
    triton.bind("not_a_list", models.not_a_list, [_t("x", F32, (1,))], [_t("y", F32, (1,))])
    triton.bind("texts", models.texts, [_t("text", np.bytes_, (-1,))], [_t("upper", np.bytes_, (-1,))])
    triton.bind("async_double", models.async_double, [_t("x", F32, (1,))], [_t("y", F32, (1,))])
    triton.bind("cached", counter.infer, [_t("x", F32, (1,))], [_t("y", F32, (1,))],
                config=ModelConfig(response_cache=True))
    for name, recorder in (("fast_calls", FAST_CALLS), ("slow_calls", SLOW_CALLS)):
        triton.bind(name, recorder.infer, [_t("x", F32, (1,))], [_t("y", F32, (1,))], config=ModelConfig(max_batch_size=8))
    triton.bind("policies", models.slow, [_t("x", F32, (1,))], [_t("y", F32, (1,))],
                config=ModelConfig(max_batch_size=2, batcher=DynamicBatcher(
                    priority_levels=2, default_priority_level=2, preserve_ordering=True,
                    default_queue_policy=QueuePolicy(timeout_action=TimeoutAction.REJECT, max_queue_size=1),
                    priority_queue_policy={1: QueuePolicy(max_queue_size=4, default_timeout_microseconds=5_000_000)},
                )))  # fmt: skip


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    config = local_config(
        model_repository=USER_REPOSITORY,
        http_header_forward_pattern="x-forward-.*",
        cache_config=["local,size=1048576"],
    )
    counter = models.CallCounter()
    triton = Triton(config=config)
    bind_all(triton, counter)
    triton.run()  # binds first, then runs: the user repository's ensemble and BLS model load at start with them
    try:
        yield Served(triton, config, counter)
    finally:
        assert triton.stop() is True
        assert triton.stop() is False


def infer_http(served: Served, model: str, *, own_client: bool = False, **arrays: np.ndarray) -> httpclient.InferResult:
    """One request; `own_client` for calls from several threads (a tritonclient HTTP client is not thread-safe)."""
    inputs = []
    for name, array in arrays.items():
        item = httpclient.InferInput(name, list(array.shape), _datatype(array))
        item.set_data_from_numpy(array)
        inputs.append(item)
    if own_client:
        with httpclient.InferenceServerClient(f"127.0.0.1:{served.config.http_port}") as client:
            return client.infer(model, inputs)
    return served.http.infer(model, inputs)


def infer_grpc(served: Served, model: str, **arrays: np.ndarray) -> grpcclient.InferResult:
    inputs = []
    for name, array in arrays.items():
        item = grpcclient.InferInput(name, list(array.shape), _datatype(array))
        item.set_data_from_numpy(array)
        inputs.append(item)
    return served.grpc.infer(model, inputs)


def _datatype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


# -- the basics: a bound function is a model ----------------------------------------------------------------
def test_batch_decorated_add_sub_answers_over_http_and_grpc(served: Served) -> None:
    a = np.arange(8, dtype=F32).reshape(2, 4)
    b = np.ones((2, 4), dtype=F32)
    for result in (infer_http(served, "add_sub", INPUT0=a, INPUT1=b), infer_grpc(served, "add_sub", INPUT0=a, INPUT1=b)):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bound_model_config_carries_the_model_config_fields(served: Served) -> None:
    config = served.http.get_model_config("policies")
    assert config["max_batch_size"] == 2
    assert config["instance_group"][0]["count"] == 1
    db = config["dynamic_batching"]
    assert db["priority_levels"] == 2 and db["default_priority_level"] == 2 and db["preserve_ordering"] is True
    assert db["default_queue_policy"]["max_queue_size"] == 1
    assert db["priority_queue_policy"]["1"]["max_queue_size"] == 4
    assert int(db["priority_queue_policy"]["1"]["default_timeout_microseconds"]) == 5_000_000
    assert served.http.get_model_config("countdown")["model_transaction_policy"]["decoupled"] is True
    assert served.http.get_model_config("cached")["response_cache"]["enable"] is True
    assert served.http.get_model_config("scale")["max_batch_size"] == 0
    add_sub = served.http.get_model_config("add_sub")
    assert int(add_sub["dynamic_batching"]["max_queue_delay_microseconds"]) == 100
    optional = {t["name"]: t["optional"] for t in served.http.get_model_config("optional_offset")["input"]}
    assert optional == {"value": False, "offset": True}
    metadata = served.http.get_model_metadata("add_sub")
    assert [i["shape"] for i in metadata["inputs"]] == [["-1", "4"], ["-1", "4"]] or [
        i["shape"] for i in metadata["inputs"]
    ] == [[-1, 4], [-1, 4]]


def test_bound_models_are_in_the_repository_index_statistics_and_metrics(served: Served) -> None:
    infer_http(served, "add_sub", INPUT0=np.zeros((1, 4), F32), INPUT1=np.zeros((1, 4), F32))
    index = {m["name"]: m.get("state") for m in served.http.get_model_repository_index(headers=served.token)}
    assert index["add_sub"] == "READY" and index["countdown"] == "READY"
    stats = served.http.get_inference_statistics("add_sub", headers=served.token)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    text = requests.get(f"http://127.0.0.1:{served.config.metrics_port}/metrics", timeout=10).text
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in text


def test_an_ensemble_and_a_bls_model_call_the_bound_function(served: Served) -> None:
    a = np.arange(4, dtype=F32).reshape(1, 4)
    result = infer_http(served, "ens_add_sub", A=a, B=a)
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + a)
    bls = infer_http(served, "bls_add", A=a)
    np.testing.assert_array_equal(bls.as_numpy("DIFF_PLUS_ONE"), a - 1 + 1)


def test_dynamic_batcher_gives_the_function_one_batch_of_several_requests(served: Served) -> None:
    rows = [np.full((1, 2), i, dtype=F32) for i in range(4)]
    modes = [np.array([[b"double" if i % 2 else b"same"]], dtype=np.object_) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: infer_http(served, "by_mode", own_client=True, data=rows[i], mode=modes[i]), range(4)))
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("out"), rows[i] * (2 if i % 2 else 1))
    # preferred_batch_size 4 within 2 s (a busy 2-core CI machine can start four client threads 200 ms apart):
    # one batch of 4, split by @group_by_values into groups of 2.
    assert [int(r.as_numpy("group_size")[0][0]) for r in results] == [2, 2, 2, 2]


# -- decorators ------------------------------------------------------------------------------------------------
def test_sample_passes_inputs_of_a_model_without_batching_and_outputs_are_cast(served: Served) -> None:
    result = infer_http(served, "scale", x=np.array([1, 2, 3], dtype=F32), factor=np.array([2], dtype=F32))
    assert result.as_numpy("y").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("y"), [2, 4, 6])


def test_fill_optionals_and_group_by_keys_serve_requests_with_and_without_the_optional_input(served: Served) -> None:
    with_offset = infer_http(served, "optional_offset", value=np.array([[1]], np.int32), offset=np.array([[5]], np.int32))
    without = infer_http(served, "optional_offset", value=np.array([[1], [2]], np.int32))
    assert with_offset.as_numpy("total").tolist() == [[6]]
    assert without.as_numpy("total").tolist() == [[101], [102]]


def test_first_value_squeezes_a_per_request_constant_and_strict_refuses_differing_values(served: Served) -> None:
    prompt = np.ones((2, 2), dtype=F32)
    ok = infer_http(served, "temperature", prompt=prompt, temperature=np.full((2, 1), 3, dtype=F32))
    np.testing.assert_array_equal(ok.as_numpy("scaled"), prompt * 3)
    with pytest.raises(InferenceServerException, match="The values on the 'temperature' input are not equal"):
        infer_http(served, "temperature", prompt=prompt, temperature=np.array([[1], [2]], dtype=F32))


def test_pad_batch_pads_to_the_next_preferred_batch_size(served: Served) -> None:
    rows = np.arange(3, dtype=F32).reshape(3, 1)
    assert infer_http(served, "padded", x=rows).as_numpy("seen").tolist() == [[4], [4], [4]]
    assert infer_http(served, "padded", x=np.arange(5, dtype=F32).reshape(5, 1)).as_numpy("seen")[0][0] == 8


def test_triton_context_gives_a_callable_object_its_model_config(served: Served) -> None:
    result = infer_http(served, "context", x=np.zeros((2, 1), F32))
    assert result.as_numpy("model").tolist() == [[b"context"], [b"context"]]
    assert result.as_numpy("max_batch").tolist() == [[3], [3]]


def test_request_parameters_forwarded_headers_and_requested_outputs_reach_the_function(served: Served) -> None:
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), F32))
    wanted = [httpclient.InferRequestedOutput("params"), httpclient.InferRequestedOutput("requested")]
    result = served.http.infer("echo", [x], outputs=wanted, parameters={"temperature": 0.5, "mode": "fast"},
                               headers={"x-forward-user": "ada", "x-other": "no"})  # fmt: skip
    params = result.as_numpy("params")[0][0].decode()
    assert "mode=fast" in params and "temperature=0.5" in params and "x-forward-user=ada" in params
    assert "x-other" not in params
    assert result.as_numpy("requested")[0][0] == b"params,requested"
    only = served.http.infer("echo", [x], outputs=[httpclient.InferRequestedOutput("requested")])
    assert only.as_numpy("params") is None
    assert only.as_numpy("requested")[0][0] == b"requested"


def test_a_list_of_callables_gives_instances_that_run_at_the_same_time(served: Served) -> None:
    assert served.http.get_model_config("parallel")["instance_group"][0]["count"] == 2
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: infer_http(served, "parallel", own_client=True, x=np.zeros((1, 1), F32)), range(2)))
    assert sorted(int(r.as_numpy("instance")[0][0]) for r in results) == [0, 1]
    assert all(int(r.as_numpy("together")[0][0]) == 1 for r in results)


def test_bytes_inputs_and_outputs_and_async_callables(served: Served) -> None:
    text = np.array([[b"ab", b"cd"]], dtype=np.object_)
    assert infer_grpc(served, "texts", text=text).as_numpy("upper").tolist() == [[b"AB", b"CD"]]
    # Enough calls for a fast callable to be moved onto the event loop: a coroutine must still run to its end.
    for value in range(12):
        assert infer_http(served, "async_double", x=np.array([[value]], F32)).as_numpy("y").tolist() == [[2 * value]]


def test_a_fast_function_moves_onto_the_event_loop_and_a_slow_one_keeps_its_thread(served: Served) -> None:
    """A call far shorter than the hand-off to the instance thread runs on the event loop once measured; a call
    that takes milliseconds stays on its thread, so the server answers meanwhile."""
    for _ in range(12):
        infer_http(served, "fast_calls", x=np.zeros((1, 1), F32))
        infer_http(served, "slow_calls", x=np.full((1, 1), 0.01, F32))
    assert FAST_CALLS.threads[0] != "nereid-server"  # measured on its thread first
    assert FAST_CALLS.threads[-3:] == ["nereid-server"] * 3, FAST_CALLS.threads
    assert "nereid-server" not in SLOW_CALLS.threads, SLOW_CALLS.threads
    calls = len(SLOW_CALLS.threads)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(infer_http, served, "slow_calls", own_client=True, x=np.full((1, 1), 1.5, F32))
        deadline = time.monotonic() + 10
        while len(SLOW_CALLS.threads) == calls and time.monotonic() < deadline:  # until the 1.5 s call has begun
            time.sleep(0.01)
        start = time.monotonic()
        assert requests.get(f"{served.http_url}/v2/health/ready", timeout=5).status_code == 200
        assert time.monotonic() - start < 0.5
        assert not running.done()  # the health check did not wait for the call
        assert running.result(timeout=10).as_numpy("y").tolist() == [[1.5]]


def test_response_cache_answers_a_repeated_request_without_calling_the_function(served: Served) -> None:
    x = np.array([[7]], dtype=F32)
    before = served.counter.calls
    first = infer_http(served, "cached", x=x)
    second = infer_http(served, "cached", x=x)
    assert first.as_numpy("y").tolist() == second.as_numpy("y").tolist() == [[8]]
    assert served.counter.calls == before + 1


# -- decoupled -------------------------------------------------------------------------------------------------
def test_a_generator_streams_one_response_per_yield_to_a_grpc_stream(served: Served) -> None:
    assert models.stream_countdown(served.config.grpc_port) == [3, 2, 1]


def test_http_infer_refuses_a_decoupled_bound_model_as_triton_does(served: Served) -> None:
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        infer_http(served, "countdown", start=np.array([[2]], dtype=np.int32))


# -- errors ----------------------------------------------------------------------------------------------------
def test_an_exception_in_the_function_fails_its_requests_with_tritons_words_and_the_traceback(served: Served) -> None:
    response = requests.post(
        f"{served.http_url}/v2/models/fails/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}]},
        timeout=30,
    )
    assert response.status_code == 500
    message = response.json()["error"]
    assert message.startswith("Failed to process the request(s) for model 'fails_0_0', message: TritonModelException: ")
    assert "Model execute error: Traceback" in message and "ValueError: the input was not welcome" in message
    # The server keeps serving after a failing batch.
    assert infer_http(served, "add_sub", INPUT0=np.zeros((1, 4), F32), INPUT1=np.zeros((1, 4), F32)) is not None


def test_strict_checks_output_dtypes_and_lenient_casts_them(served: Served) -> None:
    with pytest.raises(InferenceServerException, match="Returned output `y` for model `strict` has invalid type"):
        infer_http(served, "strict", x=np.ones((1, 1), F32))
    result = infer_http(served, "lenient", x=np.ones((1, 1), F32))
    assert result.as_numpy("y").dtype == np.float32 and result.as_numpy("y").tolist() == [[1.0]]
    with pytest.raises(InferenceServerException, match="must be list of response dicts with numpy arrays"):
        infer_http(served, "not_a_list", x=np.ones((1, 1), F32))


def test_restricted_endpoints_need_the_access_token_and_inference_does_not(served: Served) -> None:
    assert requests.get(f"{served.http_url}/v2/models/stats", timeout=10).status_code == 403
    assert requests.get(f"{served.http_url}/v2/models/stats", headers=served.token, timeout=10).status_code == 200
    assert requests.get(f"{served.http_url}/v2/models/add_sub/config", timeout=10).status_code == 200


# -- binding while serving, and the Triton object's lifecycle ---------------------------------------------------
def test_bind_while_running_loads_the_model_at_once_and_twice_is_refused(served: Served) -> None:
    served.triton.bind("late", models.add_sub, [_t("INPUT0", F32, (4,)), _t("INPUT1", F32, (4,))],
                       [_t("OUTPUT0", F32, (4,)), _t("OUTPUT1", F32, (4,))])  # fmt: skip
    assert served.http.is_model_ready("late")
    with pytest.raises(PyTritonInvalidOperationError, match="Cannot add model with the same name twice"):
        served.triton.bind("LATE", models.add_sub, [_t("INPUT0", F32, (4,))], [_t("OUTPUT0", F32, (4,))])


def test_bind_refuses_bad_names_optional_outputs_and_a_zero_batch_size() -> None:
    with Triton(config=local_config()) as triton:
        with pytest.raises(PyTritonValidationError, match="Model name can only contain"):
            triton.bind("bad name", models.add_sub, [], [])
        with pytest.raises(PyTritonValidationError, match="Output tensors cannot be optional"):
            triton.bind("m", models.add_sub, [], [_t("y", F32, (1,), optional=True)])
        with pytest.raises(PyTritonBadParameterError, match="max_batch_size` must be greater or equal to 1"):
            triton.bind("m", models.add_sub, [], [_t("y", F32, (1,))], config=ModelConfig(max_batch_size=0))
        assert triton.is_alive()
    assert not triton.is_alive()


def test_triton_config_fields_nereid_cannot_honour_are_refused() -> None:
    with pytest.raises(PyTritonValidationError, match="allow_vertex_ai"):
        Triton(config=local_config(allow_vertex_ai=True))
    with pytest.raises(PyTritonValidationError, match="grpc-infer-response-compression-level"):
        Triton(config=local_config(grpc_infer_response_compression_level="extreme"))
    with pytest.raises(PyTritonValidationError, match="The `http` or `grpc` endpoint has to be allowed"):
        TritonConfig(allow_http=False, allow_grpc=False)


def test_triton_config_from_env_and_an_open_security_config(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", str(port))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_GRPC", "false")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_CONFIG_0", "summary_latencies=true")
    config = TritonConfig.from_env()
    assert config.http_port == port and config.allow_grpc is False and config.metrics_config == ["summary_latencies=true"]
    with Triton(config=TritonConfig(http_address="127.0.0.1", allow_metrics=False),
                security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:  # fmt: skip
        assert triton.get_access_token() is None
        # From the environment: the HTTP port, and no gRPC; nothing restricted.
        assert requests.get(f"http://127.0.0.1:{port}/v2/models/stats", timeout=10).status_code == 200


def test_an_unrecoverable_error_fails_the_request_and_stops_serve() -> None:
    config = local_config()
    triton = Triton(config=config)
    triton.bind("doomed", models.unrecoverable, [_t("x", F32, (1,))], [_t("y", F32, (1,))])
    serving = threading.Thread(target=triton.serve, kwargs={"monitoring_period_s": 0.2}, daemon=True)
    serving.start()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{config.http_port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.is_model_ready("doomed"):
                break
        except Exception:
            pass
        time.sleep(0.05)
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), F32))
    with pytest.raises(InferenceServerException, match="PyTritonUnrecoverableError: the device is gone"):
        client.infer("doomed", [x])
    serving.join(timeout=60)
    assert not serving.is_alive()
    assert not triton.is_alive()
