"""Issue 8 benchmark: streaming chats through the OpenAI API on the tiny random-weight Llama, against the
static padded batch of the same prompts (transformers' generate) measured in the same run.

    .venv/bin/python benchmarks/bench_llm.py                      # the full run (several minutes, quiet machine)
    .venv/bin/python benchmarks/bench_llm.py --smoke              # a short check that everything runs
    .venv/bin/python benchmarks/bench_llm.py --compare-engines    # also measure transformers' continuous batching

Headline: 32 concurrent streaming chats of 128 output tokens arriving over 2 s: total tok/s, TTFT p50/p99 and
inter-token p50/p99. Targets: >= 0.8x the static batch, TTFT p99 < 1 s, inter-token p99 at 32 streams <= 3x
that of 1 stream. Then tok/s and TTFT p99 from 1 to 64 streams, as a table and a PNG chart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, free_port, start_nereid  # noqa: E402

from nereid.backends.llm.tiny_model import cached_tiny_model, write_vllm_model  # noqa: E402

MODEL = "tiny_llm"
TOPICS = ["the server", "a model", "the weather", "streaming", "batching", "the cache", "a token", "the queue"]


def chat_messages(i: int) -> list[dict[str, str]]:
    topic = TOPICS[i % len(TOPICS)]
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Question {i}: tell me about {topic} and how it is used, in {i % 5 + 2} sentences."},
    ]


@dataclass
class StreamResult:
    start: float
    first: float = 0.0
    end: float = 0.0
    token_times: list[float] = field(default_factory=list)  # every chunk that carries a token
    text_times: list[float] = field(default_factory=list)  # chunks with visible text only
    completion_tokens: int = 0
    error: str = ""


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def _one_chat(client: Any, url: str, i: int, tokens: int, delay: float) -> StreamResult:
    await asyncio.sleep(delay)
    body = {
        "model": MODEL,
        "messages": chat_messages(i),
        "max_tokens": tokens,
        "min_tokens": tokens,  # random weights may emit EOS at any step: hold it until the length is reached
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = StreamResult(start=time.perf_counter())
    async with client.post(url, json=body) as reply:
        if reply.status != 200:
            result.error = (await reply.read()).decode()
            return result
        async for raw in reply.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(payload)
            if chunk.get("usage"):
                result.completion_tokens = chunk["usage"]["completion_tokens"]
            choices = chunk.get("choices") or []
            if not choices or "role" in choices[0].get("delta", {}):
                continue  # the usage chunk, or the role chunk that precedes the first token
            # One chunk per token (a token can complete no character yet: half a UTF-8 character gives an
            # empty delta). Inter-token latency is measured per token, as vLLM's benchmark_serving does.
            if not result.first:
                result.first = now
            result.token_times.append(now)
            if choices[0].get("delta", {}).get("content"):
                result.text_times.append(now)
    result.end = time.perf_counter()
    return result


async def run_streams(base: str, streams: int, tokens: int, spread: float, repeat: int = 1) -> dict[str, float]:
    """`streams` chats arriving over `spread` seconds; with `repeat` > 1 the whole run is done that many times
    in a row and the percentiles pool all of them (a single stream gives only `tokens` samples, so its p99
    would otherwise be its second-worst gap)."""
    import aiohttp

    url = f"{base}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=streams + 4)
    results: list[StreamResult] = []
    wall = 0.0
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:
        delays = [spread * i / max(streams - 1, 1) if streams > 1 else 0.0 for i in range(streams)]
        for _ in range(repeat):
            batch = await asyncio.gather(*(_one_chat(client, url, i, tokens, d) for i, d in enumerate(delays)))
            wall += max(r.end for r in batch) - min(r.start for r in batch)
            results.extend(batch)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]}")
    total = sum(r.completion_tokens for r in results)
    ttft = [r.first - r.start for r in results]
    itl = [b - a for r in results for a, b in zip(r.token_times, r.token_times[1:])]
    text_gaps = [b - a for r in results for a, b in zip(r.text_times, r.text_times[1:])]
    return {
        "streams": streams,
        "tokens": total,
        "tok_s": total / wall,
        "ttft_p50": _pct(ttft, 50),
        "ttft_p99": _pct(ttft, 99),
        "itl_p50": _pct(itl, 50),
        "itl_p99": _pct(itl, 99),
        "text_gap_p99": _pct(text_gaps, 99),
        "wall": wall,
    }


def static_batch(folder: Path, count: int, tokens: int, threads: int, dtype: str = "float32") -> float:
    """transformers' generate on the same chat prompts as one left-padded batch: tokens per second."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.padding_side = "left"
    torch_dtype = torch.float32 if dtype in ("auto", "float32") else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch_dtype).eval()
    prompts = [tokenizer.apply_chat_template(chat_messages(i), tokenize=False, add_generation_prompt=True) for i in range(count)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        model.generate(**batch, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        out = model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        elapsed = time.perf_counter() - start
    generated = (out.shape[1] - batch["input_ids"].shape[1]) * count
    return generated / elapsed


def transformers_continuous(folder: Path, count: int, tokens: int, threads: int) -> float:
    """Candidate (a): transformers' own continuous batching (generate_batch), same prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    texts = [tokenizer.apply_chat_template(chat_messages(i), tokenize=False, add_generation_prompt=True) for i in range(count)]
    prompts = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    config = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=-1, pad_token_id=tokenizer.pad_token_id)
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=config, warmup=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.generated_tokens) for o in outputs.values()) / elapsed


def chart(rows: list[dict[str, float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: `pip install matplotlib` for the chart)")
        return False
    streams = [r["streams"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(streams, [r["tok_s"] for r in rows], marker="o")
    left.set_xscale("log", base=2)
    left.set_xlabel("concurrent streams")
    left.set_ylabel("total tokens / s")
    left.set_title("Throughput")
    left.grid(True, alpha=0.3)
    right.plot(streams, [r["ttft_p99"] * 1000 for r in rows], marker="o", color="tab:red")
    right.set_xscale("log", base=2)
    right.set_xlabel("concurrent streams")
    right.set_ylabel("TTFT p99 (ms)")
    right.set_title("Time to first token, p99")
    right.grid(True, alpha=0.3)
    fig.suptitle("Nereid LLM serving: tiny Llama, OpenAI API, streaming chats")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def start_server(
    repo: Path, threads: int, max_seqs: int, step_tokens: int, prefill_cap: int = 32, dtype: str = "auto"
) -> tuple[RunningServer, str]:
    engine = {
        "max_num_seqs": max_seqs,
        "max_model_len": 1024,
        "max_num_batched_tokens": step_tokens,
        "max_prefill_tokens_while_decoding": prefill_cap,
        "cpu_threads": threads,
        "dtype": dtype,
    }
    write_vllm_model(repo, MODEL, engine, cached=True)
    port = free_port()
    server = start_nereid(repo, f"--openai-port={port}", "--openai-address=127.0.0.1", timeout=180)
    return server, f"http://127.0.0.1:{port}"


def _row(name: str, r: dict[str, float]) -> str:
    return (
        f"| {name} | {int(r['streams'])} | {r['tok_s']:.0f} | {r['ttft_p50'] * 1000:.0f} | {r['ttft_p99'] * 1000:.0f} | "
        f"{r['itl_p50'] * 1000:.1f} | {r['itl_p99'] * 1000:.1f} | {r['text_gap_p99'] * 1000:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="a short run: 4 streams of 16 tokens, sweep 1..4")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--spread", type=float, default=2.0, help="arrivals spread over this many seconds")
    parser.add_argument("--sweep", default="1,2,4,8,16,32,64")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the engine and the static batch (0: torch's default)")
    parser.add_argument("--step-tokens", type=int, default=256, help="max_num_batched_tokens: tokens per engine step")
    parser.add_argument("--prefill-cap", type=int, default=32, help="max_prefill_tokens_while_decoding (0: off)")
    parser.add_argument("--dtype", default="auto", help="engine dtype (and the static batch's): auto (float32), bfloat16")
    parser.add_argument("--compare-engines", action="store_true", help="also measure transformers' continuous batching")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.tokens, args.sweep = 4, 16, "1,4"
    sweep = [int(s) for s in args.sweep.split(",") if s]
    folder = cached_tiny_model()
    lines = [
        "| run | streams | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | visible-text gap p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        server, base = start_server(Path(tmp), args.threads, max(64, max(sweep), args.streams), args.step_tokens, args.prefill_cap, args.dtype)
        try:
            # Warm up: every KV slot the headline uses gets its first-use zeroing and page faults here.
            asyncio.run(run_streams(base, args.streams, 8, 0.0))
            single = asyncio.run(run_streams(base, 1, args.tokens, 0.0, repeat=4))
            headline = asyncio.run(run_streams(base, args.streams, args.tokens, args.spread))
            rows = []
            for n in sweep:
                rows.append(single if n == 1 else headline if n == args.streams else asyncio.run(run_streams(base, n, args.tokens, args.spread)))
        finally:
            server.stop()
    static = static_batch(folder, args.streams, args.tokens, args.threads, args.dtype)
    lines.append(_row("1 stream alone", single))
    lines.append(_row(f"{args.streams} streams over {args.spread:g} s", headline))
    for r in rows:
        lines.append(_row("sweep", r))
    print("\n".join(lines))
    print()
    ratio = headline["tok_s"] / static
    growth = headline["itl_p99"] / single["itl_p99"]
    print(f"static padded batch of the same {args.streams} prompts (transformers generate): {static:.0f} tok/s")
    print(f"continuous batching / static batch: {ratio:.2f}x (target >= 0.8x)")
    # The arrivals alone bound the ratio: the last stream starts `spread` s in and still needs all its steps,
    # so a server whose steps take as long as the static batch's reaches at most static / (spread + static).
    static_s = args.streams * args.tokens / static
    print(f"ceiling set by the arrivals for steps as fast as the static batch's: {static_s / (args.spread + static_s):.2f}x")
    print(f"continuous batching / one stream alone: {headline['tok_s'] / single['tok_s']:.1f}x")
    print(f"TTFT p99 at {args.streams} streams: {headline['ttft_p99'] * 1000:.0f} ms (target < 1000 ms)")
    print(f"inter-token p99 growth 1 -> {args.streams} streams: {growth:.2f}x (target <= 3x)")
    if args.compare_engines:
        cb = transformers_continuous(folder, args.streams, args.tokens, args.threads)
        print(f"candidate (a) transformers continuous batching (generate_batch), in-process: {cb:.0f} tok/s")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm.json").write_text(json.dumps({"single": single, "headline": headline, "sweep": rows, "static_tok_s": static}, indent=2))
    if chart(rows, out / "llm_scaling.png"):
        print(f"chart: {out / 'llm_scaling.png'}")
    print(f"median inter-token across sweep: {statistics.median(r['itl_p50'] for r in rows) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
