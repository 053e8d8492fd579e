"""LLM serving through a real `nereid serve`: Triton's vLLM-backend conventions over generate, generate_stream
and gRPC streaming (tritonclient), the OpenAI API through the official `openai` client, cancellation,
stop strings, seeds, the context limit and the engine metrics."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from nereid.backends.llm.tiny_model import write_vllm_model  # noqa: E402
from tests.servers import RunningServer, free_port, start_nereid  # noqa: E402

MODEL = "tiny_llm"
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("llm_repo")
    # A small budget per step (32 tokens) so that prompts are prefilled in chunks next to running streams.
    write_vllm_model(repo, MODEL, {"max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 32, "cpu_threads": 1}, cached=True)
    port = free_port()
    server = start_nereid(repo, f"--openai-port={port}", "--openai-address=127.0.0.1", log_dir=tmp_path_factory.mktemp("logs"), timeout=120)
    server.extra["openai_port"] = str(port)
    yield server
    start = time.monotonic()
    assert server.stop() == 0, server.log()
    # Nothing stays in flight (refused, cancelled and finished requests all closed): the drain is quick.
    assert time.monotonic() - start < 10 and "requests in flight" not in server.log()


def _openai_base(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.extra['openai_port']}/v1"


def _client(server: RunningServer) -> Any:
    return openai.OpenAI(base_url=_openai_base(server), api_key="unused", max_retries=0, timeout=60)


def _generate(server: RunningServer, prompt: str, **sampling: Any) -> dict[str, Any]:
    body = {"text_input": prompt, "sampling_parameters": json.dumps({**GREEDY, **sampling}), "exclude_input_in_output": True}
    reply = requests.post(f"{server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def _stream_events(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with requests.post(f"{server.base}/v2/models/{MODEL}/generate_stream", json=body, stream=True, timeout=60) as reply:
        assert reply.status_code == 200, reply.text
        return [json.loads(line[len(b"data: ") :]) for line in reply.iter_lines() if line]


def _metric(server: RunningServer, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


PROMPTS = [f"The server number {i} says {'how is it ' * (i % 3)}that" for i in range(8)]


def test_llm_generate_stream_sends_tokens_in_order_then_a_final_response(llm_server: RunningServer) -> None:
    whole = _generate(llm_server, PROMPTS[0], max_tokens=12)
    body = {
        "text_input": PROMPTS[0],
        "stream": True,
        "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 12}),
        "return_num_output_tokens": True,
    }
    events = _stream_events(llm_server, body)
    assert len(events) >= 2 and all("error" not in e for e in events)
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
    assert sum(e["num_output_tokens"] for e in events) == 12
    assert [e.get("finish_reason") for e in events][-1] == "length" and "finish_reason" not in events[0]
    assert events[-1]["completion_tokens"] == 12 and events[-1]["prompt_tokens"] > 0


def test_llm_generate_follows_the_vllm_backend_tensor_conventions(llm_server: RunningServer) -> None:
    prompt = PROMPTS[1]
    excluded = _generate(llm_server, prompt, max_tokens=6)["text_output"]
    # Not streaming, the prompt is prepended unless exclude_input_in_output; request parameters stand in
    # for the sampling_parameters tensor, as in Triton's vLLM backend.
    body = {"text_input": prompt, "parameters": {**GREEDY, "max_tokens": 6}}
    reply = requests.post(f"{llm_server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"] == prompt + excluded
    # generate wants one response: a streaming request gets Triton's answer (a 200 carrying the error).
    body = {"text_input": prompt, "stream": True, "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 4})}
    reply = requests.post(f"{llm_server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert reply.json() == {
        "error": "generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses"
    }
    body = {"text_input": prompt, "stream": True, "exclude_input_in_output": False}
    reply = requests.post(f"{llm_server.base}/v2/models/{MODEL}/generate_stream", json=body, timeout=60)
    # the model's error comes first, so it is the stream's one event under 400, as Triton sends it
    assert reply.status_code == 400 and "exclude_input_in_output" in json.loads(reply.text.removeprefix("data: "))["error"]
    body = {"text_input": prompt, "sampling_parameters": json.dumps({"top_p": 7})}
    reply = requests.post(f"{llm_server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert reply.status_code == 400 and "'top_p' must be in (0, 1]" in reply.json()["error"]
    config = requests.get(f"{llm_server.base}/v2/models/{MODEL}/config", timeout=10).json()
    assert config["model_transaction_policy"]["decoupled"] is True
    assert {"text_input", "stream", "sampling_parameters", "exclude_input_in_output"} <= {i["name"] for i in config["input"]}
    assert "text_output" in {o["name"] for o in config["output"]}


def test_llm_concurrent_streams_each_get_exactly_their_own_tokens(llm_server: RunningServer) -> None:
    solo = [_generate(llm_server, p, max_tokens=16)["text_output"] for p in PROMPTS]
    client = openai.AsyncOpenAI(base_url=_openai_base(llm_server), api_key="unused", max_retries=0, timeout=60)

    async def one(prompt: str) -> tuple[str, str | None]:
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, stream=True, extra_body=GREEDY)
        pieces, reason = [], None
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        return "".join(pieces), reason

    async def all_at_once() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS + PROMPTS[:4]))
        finally:
            await client.close()

    results = asyncio.run(all_at_once())
    for (text, reason), expected in zip(results, solo + solo[:4]):
        assert text == expected
        assert reason == "length"


@pytest.mark.parametrize("route", ["openai", "generate_stream"])
def test_llm_cancelled_stream_frees_its_slot(llm_server: RunningServer, route: str) -> None:
    if route == "openai":
        body: dict[str, Any] = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 200, "stream": True, **GREEDY}
        url = f"{_openai_base(llm_server)}/completions"
    else:
        body = {"text_input": PROMPTS[2], "stream": True, "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 200})}
        url = f"{llm_server.base}/v2/models/{MODEL}/generate_stream"
    reply = requests.post(url, json=body, stream=True, timeout=60)
    lines = reply.iter_lines()
    received = 0
    for line in lines:
        if line.startswith(b"data: "):
            received += 1
            if received == 3:
                break
    assert _metric(llm_server, "vllm:num_requests_running") == 1
    reply.close()  # the client goes away
    deadline = time.monotonic() + 15
    while _metric(llm_server, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the cancelled sequence kept its slot"
        time.sleep(0.05)
    generated = _metric(llm_server, "vllm:generation_tokens_total")
    time.sleep(0.3)
    assert _metric(llm_server, "vllm:generation_tokens_total") == generated  # nothing runs on for it


def test_llm_stop_strings_end_the_text_before_the_stop(llm_server: RunningServer) -> None:
    client = _client(llm_server)
    free = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=24, extra_body=GREEDY).choices[0].text
    stop = free[8:11]
    cut = free.index(stop)
    stopped = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=24, stop=[stop], extra_body=GREEDY)
    assert stopped.choices[0].text == free[:cut]
    assert stopped.choices[0].finish_reason == "stop"
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=24, stop=stop, stream=True, extra_body=GREEDY)
    assert "".join(chunk.choices[0].text for chunk in stream) == free[:cut]


def test_llm_seed_and_temperature_zero_are_deterministic(llm_server: RunningServer) -> None:
    client = _client(llm_server)

    def text(**kwargs: Any) -> str:
        extra = {"ignore_eos": True}
        return str(client.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=16, extra_body=extra, **kwargs).choices[0].text)

    assert text(temperature=0) == text(temperature=0)
    assert text(temperature=1.0, seed=11) == text(temperature=1.0, seed=11)
    assert text(temperature=1.0, seed=11) != text(temperature=1.0, seed=12)


def test_llm_prompt_longer_than_the_context_is_a_clear_400(llm_server: RunningServer) -> None:
    long_prompt = "the server and the model " * 120
    client = _client(llm_server)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4)
    assert "max_model_len" in str(info.value) and "256 tokens" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1000)
    assert "maximum context length is 256 tokens" in str(info.value)
    for route in ("generate", "generate_stream"):
        reply = requests.post(f"{llm_server.base}/v2/models/{MODEL}/{route}", json={"text_input": long_prompt, "stream": route.endswith("stream")}, timeout=30)
        assert reply.status_code == 400, reply.text
        # generate_stream: the error is the stream's one event, as Triton sends an error that comes first
        error = json.loads(reply.text.removeprefix("data: "))["error"] if route.endswith("stream") else reply.json()["error"]
        assert "the model's context (max_model_len) is 256 tokens" in error
    reply = requests.post(f"{_openai_base(llm_server)}/completions", json={"model": "nope", "prompt": "x"}, timeout=10)
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_llm_openai_client_round_trips_sync(llm_server: RunningServer) -> None:
    client = _client(llm_server)
    assert [m.id for m in client.models.list().data] == [MODEL]
    completion = client.completions.create(model=MODEL, prompt="Hello the", max_tokens=5, extra_body={"ignore_eos": True}, logprobs=2)
    choice = completion.choices[0]
    assert completion.usage is not None and completion.usage.completion_tokens == 5 and completion.usage.prompt_tokens > 0
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == 5
    assert "".join(choice.logprobs.tokens or []) == choice.text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the server?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, extra_body={"min_tokens": 6})
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("length", "stop")
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}, extra_body={"min_tokens": 6}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")


def test_llm_logprob_tokens_join_to_the_text_when_a_special_token_is_sampled(llm_server: RunningServer) -> None:
    # The tiny model samples its chat markers now and then; a seeded hot sampler finds such a completion. The text
    # skips special tokens by default, and each token's text in logprobs must follow it so the tokens join to the text.
    client = _client(llm_server)
    markers = ("<|system|>", "<|user|>", "<|assistant|>", "<s>", "</s>", "<pad>", "<unk>")
    for seed in range(40):
        sampling = {"seed": seed, "ignore_eos": True}
        kept = client.completions.create(
            model=MODEL, prompt="Hello the", max_tokens=24, temperature=3.0, logprobs=1, extra_body={**sampling, "skip_special_tokens": False}
        ).choices[0]
        if any(marker in kept.text for marker in markers):
            break
    else:
        pytest.fail("no seed in 40 sampled a special token")
    skipped = client.completions.create(model=MODEL, prompt="Hello the", max_tokens=24, temperature=3.0, logprobs=1, extra_body=sampling).choices[0]
    assert "".join(kept.logprobs.tokens or []) == kept.text
    assert "".join(skipped.logprobs.tokens or []) == skipped.text
    assert not any(marker in skipped.text for marker in markers)
    assert len(skipped.logprobs.tokens or []) == len(kept.logprobs.tokens or []) == 24


def test_llm_openai_client_round_trips_async_and_on_the_http_port(llm_server: RunningServer) -> None:
    async def run() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=f"{llm_server.base}/v1", api_key="unused", max_retries=0, timeout=60)
        try:
            messages = [{"role": "user", "content": "Tell me about the model"}]
            whole = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True, extra_body={"ignore_eos": True}
            )
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            return whole.choices[0].message.content or "", "".join(parts)
        finally:
            await client.close()

    whole, streamed = asyncio.run(run())
    assert whole and whole == streamed


def test_llm_grpc_streaming_through_tritonclient(llm_server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    expected = _generate(llm_server, PROMPTS[5], max_tokens=10)["text_output"]
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([PROMPTS[5].encode()], dtype=object))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        sampling.set_data_from_numpy(np.array([json.dumps({**GREEDY, "max_tokens": 10}).encode()], dtype=object))
        client.async_stream_infer(MODEL, [text, stream, sampling], request_id="g1", enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            out = result.as_numpy("text_output")
            if out is not None:
                pieces.append(out[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert len(pieces) > 1 and "".join(pieces) == expected


def test_llm_grpc_stream_cancel_frees_the_slot(llm_server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPTS[6].encode()], dtype=object))
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    sampling.set_data_from_numpy(np.array([json.dumps({**GREEDY, "max_tokens": 200}).encode()], dtype=object))
    client.async_stream_infer(MODEL, [text, stream, sampling], request_id="c1")
    try:
        for _ in range(2):
            _result, error = results.get(timeout=60)
            assert error is None, error
        assert _metric(llm_server, "vllm:num_requests_running") == 1
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    deadline = time.monotonic() + 15
    while _metric(llm_server, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the cancelled gRPC stream kept its slot"
        time.sleep(0.05)


def test_llm_metrics_report_latency_tokens_and_sequences(llm_server: RunningServer) -> None:
    _generate(llm_server, PROMPTS[6], max_tokens=4)
    text = requests.get(f"http://127.0.0.1:{llm_server.metrics_port}/metrics", timeout=10).text
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:generation_tokens_total",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "nereid_llm_kv_blocks_used",
        "nereid_llm_kv_blocks_free",
        "nereid_llm_requests_refused_total",
        "nv_inference_request_success",
    ):
        assert f'{name}{{model="{MODEL}",version="1"}}' in text, name
    assert _metric(llm_server, "vllm:time_to_first_token_seconds_count") >= 1
    # The same long prompt twice: the second time its full blocks come from the prefix cache.
    hits = _metric(llm_server, "vllm:prefix_cache_hits_total")
    _generate(llm_server, PROMPTS[5] * 6, max_tokens=2)
    _generate(llm_server, PROMPTS[5] * 6, max_tokens=2)
    assert _metric(llm_server, "vllm:prefix_cache_hits_total") >= hits + 32
    assert _metric(llm_server, "vllm:prefix_cache_queries_total") >= _metric(llm_server, "vllm:prefix_cache_hits_total")
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text


def test_llm_model_json_problems_fail_the_load_with_clear_reasons(tmp_path: Path) -> None:
    from nereid.backends.llm.engine_args import read_engine_args, vllm_engine_kwargs
    from nereid.core.errors import NereidError

    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.json").write_text(json.dumps({"model": "facebook/opt-125m"}))
    with pytest.raises(NereidError) as info:
        read_engine_args("m", tmp_path / "m", version)
    assert "never downloads from a model hub" in info.value.message
    (version / "model.json").write_text(json.dumps({"model": ".", "tensor_parallel_size": 2, "distributed_executor_backend": "ray"}))
    with pytest.raises(NereidError) as info:
        read_engine_args("m", tmp_path / "m", version, kind="GPU")
    assert "KIND_GPU is for single-GPU models" in info.value.message
    args = read_engine_args("m", tmp_path / "m", version, kind="MODEL")
    assert args.world_size == 2
    kwargs = vllm_engine_kwargs(args)
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "ray"
    assert kwargs["model"] == str(version.resolve())
    (version / "model.json").write_text(json.dumps({"model": ".", "max_prefill_tokens_while_decoding": 0, "cpu_threads": 2}))
    args = read_engine_args("m", tmp_path / "m", version)
    assert args.max_prefill_tokens_while_decoding == 0 and args.cpu_threads == 2
    assert "max_prefill_tokens_while_decoding" not in vllm_engine_kwargs(args)  # Nereid's own key: never given to vLLM
    (version / "model.json").write_text(json.dumps({"model": ".", "max_prefill_tokens_while_decoding": -1}))
    with pytest.raises(NereidError) as info:
        read_engine_args("m", tmp_path / "m", version)
    assert "max_prefill_tokens_while_decoding" in info.value.message
    (version / "model.json").write_text(json.dumps({"engine": "vllm"}))
    from nereid.backends.llm.vllm_engine import require_vllm

    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(NereidError) as info:
            require_vllm("[model 'm' version 1]")
        assert "`vllm` package is not installed" in info.value.message


def test_llm_threads_do_not_block_other_requests(llm_server: RunningServer) -> None:
    """While streams run, the server still answers health and metadata at once (the engine has its own thread)."""
    done = threading.Event()

    def long_stream() -> None:
        _stream_events(llm_server, {"text_input": PROMPTS[7], "stream": True, "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 60})})
        done.set()

    thread = threading.Thread(target=long_stream)
    thread.start()
    try:
        start = time.monotonic()
        for _ in range(10):
            assert requests.get(f"{llm_server.base}/v2/health/ready", timeout=5).status_code == 200
        assert time.monotonic() - start < 5
    finally:
        thread.join(60)
    assert done.is_set()


QUEUED_MODEL = "tiny_llm_small_queue"


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One sequence runs, one waits, the next is refused: the waiting queue's bound, end to end."""
    repo = tmp_path_factory.mktemp("llm_queue_repo")
    write_vllm_model(
        repo, QUEUED_MODEL, {"max_model_len": 2048, "max_num_seqs": 1, "max_num_queued_reqs": 1, "cpu_threads": 1}, cached=True
    )
    port = free_port()
    server = start_nereid(repo, f"--openai-port={port}", "--openai-address=127.0.0.1", log_dir=tmp_path_factory.mktemp("logs"), timeout=120)
    server.extra["openai_port"] = str(port)
    yield server
    assert server.stop() == 0, server.log()


def _model_metric(server: RunningServer, name: str, model: str) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


def test_llm_full_waiting_queue_answers_429_with_retry_after_and_unavailable_on_generate_and_grpc(small_queue_server: RunningServer) -> None:
    server = small_queue_server
    base = _openai_base(server)
    body = {"model": QUEUED_MODEL, "prompt": PROMPTS[1], "max_tokens": 1900, "stream": True, **GREEDY}
    running = requests.post(f"{base}/completions", json=body, stream=True, timeout=60)
    lines = running.iter_lines()
    assert next(line for line in lines if line.startswith(b"data: "))  # it runs: the one sequence allowed
    waiting_reply: dict[str, Any] = {}

    def wait_in_queue() -> None:
        with requests.post(f"{base}/completions", json={**body, "max_tokens": 3}, stream=True, timeout=60) as reply:
            waiting_reply["status"] = reply.status_code
            waiting_reply["events"] = [line for line in reply.iter_lines() if line.startswith(b"data: ")]

    waiter = threading.Thread(target=wait_in_queue)
    waiter.start()
    try:
        deadline = time.monotonic() + 15
        while _model_metric(server, "vllm:num_requests_waiting", QUEUED_MODEL) != 1:
            assert time.monotonic() < deadline, "the second request never waited"
            time.sleep(0.02)
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model=QUEUED_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True)
        assert info.value.status_code == 429
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert "max_num_queued_reqs" in str(info.value.message) and f"[model '{QUEUED_MODEL}' version 1]" in str(info.value.message)
        # Triton's generate route says the same as UNAVAILABLE (503).
        generate = {"text_input": "hi", "sampling_parameters": json.dumps({**GREEDY, "max_tokens": 2})}
        reply = requests.post(f"{server.base}/v2/models/{QUEUED_MODEL}/generate", json=generate, timeout=60)
        assert reply.status_code == 503 and "max_num_queued_reqs" in reply.text
        # gRPC streaming: the refusal comes back on the stream as an error naming the limit.
        import tritonclient.grpc as grpcclient

        results: queue.Queue[Any] = queue.Queue()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        grpc.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            text = grpcclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"hi"], dtype=object))
            grpc.async_stream_infer(QUEUED_MODEL, [text], request_id="refused")
            _result, error = results.get(timeout=60)
        finally:
            grpc.stop_stream()
            grpc.close()
        assert error is not None and "max_num_queued_reqs" in str(error)
        assert _model_metric(server, "nereid_llm_requests_refused_total", QUEUED_MODEL) == 3
    finally:
        running.close()  # the running client goes away: the waiting one gets its turn
        waiter.join(60)
    assert waiting_reply["status"] == 200 and waiting_reply["events"][-1] == b"data: [DONE]"
    deadline = time.monotonic() + 15
    while _model_metric(server, "vllm:num_requests_running", QUEUED_MODEL) != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _model_metric(server, "nereid_llm_kv_blocks_used", QUEUED_MODEL) == 0


def test_llm_priority_and_user_are_accepted_and_a_bad_priority_is_a_clear_400(llm_server: RunningServer) -> None:
    client = _client(llm_server)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="alice", extra_body={"priority": -3}
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body={"priority": 1.5})
    assert "'priority' must be an integer" in str(info.value.message)
    # Triton's generate route: priority beside the sampling parameters, or as a request parameter.
    body = {"text_input": "hi", "parameters": {"priority": "x", "max_tokens": 2}}
    bad = requests.post(f"{llm_server.base}/v2/models/{MODEL}/generate", json=body, timeout=60)
    assert bad.status_code == 400 and "priority" in bad.text
    assert _generate(llm_server, "hi", max_tokens=2, priority=2)["text_output"] is not None
