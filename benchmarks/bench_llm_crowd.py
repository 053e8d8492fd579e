"""Issue 41 benchmark: a crowd of concurrent streaming chat users through the OpenAI API, against a real
`nereid serve`, with the engine's paged KV cache, prefix cache, preemption and waiting-queue bound at work.

    .venv/bin/python benchmarks/bench_llm_crowd.py                       # 2,000 users at once, tiny model
    .venv/bin/python benchmarks/bench_llm_crowd.py --no-shared-prefix    # every prompt different from its start
    .venv/bin/python benchmarks/bench_llm_crowd.py --heavy               # 100 users x 20 requests beside single users
    .venv/bin/python benchmarks/bench_llm_crowd.py --model large --users 64   # a ~0.4B Llama with random weights
    .venv/bin/python benchmarks/bench_llm_crowd.py --smoke               # 20 users, a quick check that all runs

Each user sends one streaming chat completion of `--tokens` new tokens (32), its prompt a shared system prompt
of about 200 tokens plus its own question. Printed: TTFT and inter-token p50/p99, tokens/s, completed /
refused (429) / failed counts, the prefix-cache hit rate and preemptions (from /metrics), the peak RSS of the
server's process tree, and the reference: the engine's own forward pass in-process over static batches of the
crowd's first prompts (prefill, the blocks all of them share once, then every decode step; tokens/s), so the
served tokens/s can be read as a ratio to the best batch size (serving adds scheduling, sampling, streaming
and queueing; the static batch has none of them). Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, free_port, start_nereid  # noqa: E402

from nereid.backends.llm.tiny_model import cached_tiny_model  # noqa: E402

MODEL = "llm"
# The larger model: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864) with the tiny
# model's tokenizer and vocabulary, random weights, built here once (a ~1.5 GB folder under the temp folder).
LARGE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864}
_LARGE_VERSION = 1


@dataclass
class Result:
    kind: str  # "single" | "heavy"
    start: float
    first: float = 0.0
    end: float = 0.0
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0
    status: int = 0
    error: str = ""


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def build_large_model(layers: int | None = None) -> Path:
    """The ~0.4B Llama (or a shallower one for a smoke run), built once per machine and reused."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(LARGE)
    if layers:
        shape["num_hidden_layers"] = layers
    target = Path(tempfile.gettempdir()) / f"nereid-llama-large-v{_LARGE_VERSION}-l{shape['num_hidden_layers']}"
    if (target / "model.safetensors").is_file() or (target / "model.safetensors.index.json").is_file():
        return target
    tiny = cached_tiny_model()
    staging = Path(tempfile.mkdtemp(prefix=".llama-large-", dir=target.parent))
    for name in tiny.iterdir():
        if name.name.startswith("tokenizer") or name.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(name, staging / name.name)
    tiny_config = json.loads((tiny / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=tiny_config["vocab_size"],
        max_position_embeddings=2048,
        bos_token_id=tiny_config.get("bos_token_id"),
        eos_token_id=tiny_config.get("eos_token_id"),
        pad_token_id=tiny_config.get("pad_token_id"),
        tie_word_embeddings=False,
        initializer_range=0.02,
        **shape,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(staging, safe_serialization=True)
    try:
        staging.rename(target)
    except OSError:  # built by another run meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def system_prompt(tokenizer: Any, tokens: int) -> str:
    """A system prompt of about `tokens` tokens."""
    words = "You are the assistant of a busy inference server. Answer politely, briefly and with care for the facts. "
    text = words
    while len(tokenizer(text)["input_ids"]) < tokens:
        text += words
    ids = tokenizer(text)["input_ids"][:tokens]
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def chat(i: int, system: str, shared: bool) -> list[dict[str, str]]:
    # Without sharing, the system prompt starts with the user's own number: no two prompts share a block.
    head = system if shared else f"Session {i}. {system}"
    return [{"role": "system", "content": head}, {"role": "user", "content": f"Question {i}: what does the queue do in step {i % 7}?"}]


async def one_chat(client: Any, url: str, kind: str, user: str, messages: list[dict[str, str]], tokens: int) -> Result:
    body = {
        "model": MODEL, "messages": messages, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
        "stream": True, "user": user,
    }
    result = Result(kind, time.perf_counter())
    try:
        async with client.post(url, json=body) as reply:
            result.status = reply.status
            if reply.status != 200:
                result.error = (await reply.read()).decode()[:200]
                return result
            async for raw in reply.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if not choices or "role" in choices[0].get("delta", {}):
                    continue
                if choices[0].get("finish_reason") is not None and not choices[0].get("delta"):
                    continue
                now = time.perf_counter()
                result.first = result.first or now
                result.token_times.append(now)
                result.tokens += 1
    except Exception as exc:  # a dropped connection is a failure to count, not a crash of the benchmark
        result.error = f"{type(exc).__name__}: {exc}"
    result.end = time.perf_counter()
    return result


async def crowd(base: str, plan: list[tuple[str, str, list[dict[str, str]]]], tokens: int) -> tuple[list[Result], float]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_chat(client, f"{base}/v1/chat/completions", k, u, m, tokens) for k, u, m in plan))
        return list(results), time.perf_counter() - start


class PeakRss:
    """Samples the RSS of a process and its children every 0.2 s on a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.2):
            try:
                total = self._process.memory_info().rss
                for child in self._process.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                return
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _server_cpu(pid: int) -> float:
    """User + system CPU seconds of the server's process tree so far."""
    import psutil

    root = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])


def scrape(server: RunningServer) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).read().decode()
    wanted = (
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
        "nereid_llm_requests_refused_total", "vllm:generation_tokens_total",
    )
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(name + "{") and f'model="{MODEL}"' in line:
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


def static_reference(folder: Path, prompts: list[list[int]], tokens: int, threads: int) -> tuple[float, float]:
    """The engine's own forward pass in-process over one static batch of the crowd's own prompts (token ids),
    with no scheduler, sampler or server: prefill every prompt (many rows per forward, the full blocks that all
    the prompts share once, as prefix-cached sequences do), then `tokens` decode steps of every row at once.
    Returns generated tokens per second over the whole batch (prefill included: the same work serving does)
    and over the decode steps alone (the decode ceiling)."""
    import torch

    from nereid.backends.llm.llama_model import DecodeGroup, LlamaModel, StepBatch

    if threads:
        torch.set_num_threads(threads)
    model = LlamaModel(folder)
    bs = 16
    batch = len(prompts)
    common = 0
    while common < min(len(p) for p in prompts) and all(p[common] == prompts[0][common] for p in prompts):
        common += 1
    full = common // bs if batch > 1 else 0  # blocks every row shares (prefix caching shares full blocks only)
    own = max(-(-(len(p) + tokens + 1) // bs) for p in prompts) - full  # blocks each row has to itself
    model.allocate_cache(full + batch * own, bs)
    model.zero_blocks_below(full + batch * own)
    shared_blocks = torch.arange(full, dtype=torch.long)
    tables = full + torch.arange(batch * own, dtype=torch.long).view(batch, own)
    ids = [torch.tensor(p, dtype=torch.long) for p in prompts]
    empty = torch.empty(0, dtype=torch.long)

    def prefill(rows: list[int], start: int) -> None:
        """Prompt positions from `start` to each prompt's end, for several rows, in one forward pass."""
        spans = [torch.arange(start, len(prompts[row])) for row in rows]
        slots = torch.cat([torch.cat([shared_blocks, tables[row]])[span // bs] * bs + span % bs for row, span in zip(rows, spans)])
        ends = torch.tensor([span.shape[0] for span in spans]).cumsum(0) - 1
        model.forward(StepBatch(torch.cat([ids[row][start:] for row in rows]), torch.cat(spans), slots, 0, empty, [],
                                [(torch.cat([shared_blocks, tables[row]]), start, span.shape[0]) for row, span in zip(rows, spans)],
                                ends))  # fmt: skip

    prefill([0], 0)  # warm-up (overwritten below)
    began = time.perf_counter()
    if full:
        model.forward(StepBatch(ids[0][: full * bs], torch.arange(full * bs), torch.arange(full * bs), 0, empty, [],
                                [(shared_blocks, 0, full * bs)],
                                torch.tensor([full * bs - 1])))  # fmt: skip
    rows: list[int] = []
    for row in range(batch):  # about 2,048 prompt tokens per forward
        rows.append(row)
        if sum(len(prompts[r]) - full * bs for r in rows) >= 2048 or row == batch - 1:
            prefill(rows, full * bs)
            rows = []
    groups = [DecodeGroup(0, batch, shared_blocks, tables)]
    last = torch.full((batch,), 5, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    rows_index = torch.arange(batch)
    decode_began = time.perf_counter()
    for step in range(tokens):
        positions = lengths + step
        slots = tables[rows_index, positions // bs - full] * bs + positions % bs
        logits = model.forward(StepBatch(last, positions, slots, batch, positions + 1, groups, [], rows_index))
        last = logits.argmax(-1)
    ended = time.perf_counter()
    return batch * tokens / (ended - began), batch * tokens / (ended - decode_began)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=None, help="single-request users (default 2000; 64 with --model large)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--system-tokens", type=int, default=200)
    parser.add_argument("--no-shared-prefix", action="store_true", help="make every prompt differ from its first token")
    parser.add_argument("--heavy", action="store_true", help="add 100 heavy users sending 20 requests each at once")
    parser.add_argument("--heavy-users", type=int, default=100)
    parser.add_argument("--heavy-requests", type=int, default=20)
    parser.add_argument("--model", choices=("tiny", "large"), default="tiny")
    parser.add_argument("--large-layers", type=int, default=0, help="fewer layers for the large model (a smoke run)")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--step-tokens", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--queued-reqs", type=int, default=4096, help="max_num_queued_reqs")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the engine and the reference (0: default)")
    parser.add_argument("--no-reference", action="store_true", help="skip the in-process static batch")
    parser.add_argument("--reference-batches", type=int, nargs="+", default=[64, 256, 1024, 2048], help="static batch sizes to try")
    parser.add_argument(
        "--server-src", type=Path, default=None,
        help="serve with the nereid package of this source tree (say an older checkout's src/), for a before/after; "
        "model.json then gets only the keys every engine version reads",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="20 users (with --heavy: 2 heavy users of 5 requests)")
    args = parser.parse_args()
    if args.smoke:
        args.users = args.users or 20
        args.heavy_users, args.heavy_requests = 2, 5
    users = args.users if args.users is not None else (64 if args.model == "large" else 2000)

    # Every stream is a socket at each end: lift the open-file limit for this process and the server it starts.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    from transformers import AutoTokenizer

    from nereid.backends.llm.tiny_model import write_vllm_model

    folder = build_large_model(args.large_layers or None) if args.model == "large" else cached_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    system = system_prompt(tokenizer, args.system_tokens)
    shared = not args.no_shared_prefix
    plan = [("single", f"user-{i}", chat(i, system, shared)) for i in range(users)]
    if args.heavy:
        for h in range(args.heavy_users):
            for r in range(args.heavy_requests):
                plan.append(("heavy", f"heavy-{h}", chat(users + h * args.heavy_requests + r, system, shared)))
    prompt_ids = [
        tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
        for _kind, _user, messages in plan
    ]
    prompt_tokens = len(prompt_ids[0])

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        engine = {
            "max_model_len": 1024, "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.step_tokens,
            "cpu_threads": args.threads, **({} if args.server_src else {"max_num_queued_reqs": args.queued_reqs}),
        }
        if args.model == "large":
            model_dir = repo / MODEL
            (model_dir / "1").mkdir(parents=True)
            for item in folder.iterdir():
                (model_dir / "1" / item.name).symlink_to(item)
            (model_dir / "1" / "model.json").write_text(json.dumps({"model": ".", **engine}))
            (model_dir / "config.pbtxt").write_text(f'name: "{MODEL}"\nbackend: "vllm"\ninstance_group [{{ count: 1 kind: KIND_MODEL }}]\n')
        else:
            write_vllm_model(repo, MODEL, engine, cached=True)
        port = free_port()
        env = {"PYTHONPATH": str(args.server_src.resolve())} if args.server_src else None
        server = start_nereid(repo, f"--openai-port={port}", "--openai-address=127.0.0.1", log_dir=Path(tmp), timeout=600, env=env)
        try:
            rss = PeakRss(server.process.pid)
            server_cpu, client_cpu = _server_cpu(server.process.pid), time.process_time()
            results, wall = asyncio.run(crowd(f"http://127.0.0.1:{port}", plan, args.tokens))
            server_cpu, client_cpu = _server_cpu(server.process.pid) - server_cpu, time.process_time() - client_cpu
            peak = rss.stop()
            figures = scrape(server)
        finally:
            server.stop()

    done = [r for r in results if r.status == 200 and not r.error and r.tokens]
    refused = [r for r in results if r.status == 429]
    failed = [r for r in results if r not in done and r.status != 429]
    generated = sum(r.tokens for r in done)
    tok_s = generated / wall if wall else 0.0
    ttft = {kind: [r.first - r.start for r in done if r.kind == kind] for kind in ("single", "heavy")}
    itl = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    queries = figures.get("vllm:prefix_cache_queries_total", 0.0)
    hits = figures.get("vllm:prefix_cache_hits_total", 0.0)
    print(f"\n{args.model} model, {users} single users" + (f" + {args.heavy_users} heavy users x {args.heavy_requests}" if args.heavy else "")
          + f", {args.tokens} tokens each, prompt ~{prompt_tokens} tokens, shared prefix: {shared}\n")
    print("| figure | value |\n|---|---|")
    rows = [
        ("requests", f"{len(results)}"),
        ("completed / refused (429) / failed", f"{len(done)} / {len(refused)} / {len(failed)}"),
        ("TTFT p50 / p99 (s), single users", f"{_pct(ttft['single'], 50):.2f} / {_pct(ttft['single'], 99):.2f}"),
    ]
    if args.heavy:
        rows.append(("TTFT p50 / p99 (s), heavy users", f"{_pct(ttft['heavy'], 50):.2f} / {_pct(ttft['heavy'], 99):.2f}"))
    rows += [
        ("inter-token p50 / p99 (ms)", f"{_pct(itl, 50) * 1000:.1f} / {_pct(itl, 99) * 1000:.1f}"),
        ("tokens/s (served)", f"{tok_s:.0f}"),
        ("wall (s)", f"{wall:.1f}"),
        ("prefix cache hit rate", f"{hits / queries:.1%}" if queries else "n/a"),
        ("preemptions", f"{figures.get('vllm:num_preemptions_total', 0):.0f}"),
        ("refused (server count)", f"{figures.get('nereid_llm_requests_refused_total', 0):.0f}"),
        ("peak RSS, server process tree (MiB)", f"{peak / 2**20:.0f}"),
        # The crowd's client runs on the same cores: its CPU is time the engine's threads did not get.
        ("CPU seconds: server / this client", f"{server_cpu:.0f} / {client_cpu:.0f}"),
    ]
    if not args.no_reference:
        # The static batch at its best size: each size's whole-batch rate (prefill included, the work serving does).
        best = 0.0
        for batch in sorted({min(b, users) for b in args.reference_batches}):
            whole, decode = static_reference(folder, prompt_ids[:batch], args.tokens, args.threads)
            rows.append((f"static batch of {batch}, in-process: whole batch / decode only (tokens/s)", f"{whole:.0f} / {decode:.0f}"))
            best = max(best, whole)
        rows.append(("served / best static batch", f"{tok_s / best:.2f}x" if best else "n/a"))
    for name, value in rows:
        print(f"| {name} | {value} |")
    if failed:
        print(f"\nfirst failure: {failed[0].status} {failed[0].error}")


if __name__ == "__main__":
    main()
