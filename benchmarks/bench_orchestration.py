"""Issue 13 benchmark: model orchestration (loading on demand, the memory budget, eviction), in one run:

- policy: LRU against the frequency-aware policy on the same Zipf(1.1) traces (stationary, and with the popular
  set moving), replayed through the residency's two orderings: the measurement behind the default policy;
- cold: time to first response of a model nobody loaded, on demand, against explicit preloading (load, then infer),
  for ONNX, Python, fil (XGBoost) and the tiny LLM;
- zipf: 50 models (ONNX MLPs and numpy MLPs in the Python backend) under a budget that holds about 10, Zipf(1.1)
  traffic from 64 clients: hit rate, p50/p99 of hits and of misses, evictions/s, failures, and the peak of charged
  and of real (process-tree) memory sampled at 10 Hz against the budget; then the same trace through Ray Serve's
  model multiplexing (max_num_models_per_replica=10), installed by this script into a virtualenv of its own;
- warm: the cost of a warm hit, the same model at c=16 with loading on demand on and off.

    .venv/bin/python benchmarks/bench_orchestration.py [--zipf-seconds 120] [--zipf-warmup-seconds 30]
        [--warm-seconds 20] [--only zipf,warm]
        [--no-ray] [--out benchmarks/results/orchestration.md]

The load generator is Python threads (tritonclient-free raw HTTP JSON), sharing the machine with the server.
A Nereid request is a hit when its model was READY in the last 10 Hz sample before it started and no load of
the model completed between that sample and the first one after it ended (the on-demand load counter); Ray
Serve's per-replica LRU is not visible, so a client-side LRU of the same size stands in for it.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.onnx_builders import save_model, write  # noqa: E402
from tests.servers import RunningServer, free_port, start_nereid  # noqa: E402

RAY_VENV = Path.home() / ".cache" / "nereid-bench" / "ray-venv"
WIDTH, HIDDEN, CLASSES = 64, 256, 16


# -- models ------------------------------------------------------------------------------------------------------
def onnx_mlp(folder: Path, seed: int) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32), "W2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "W1"], ["H"]),
            helper.make_node("Relu", ["H"], ["R"]),
            helper.make_node("MatMul", ["R", "W2"], ["OUTPUT0"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, CLASSES])],
        [w1, w2],
    )
    save_model(graph, folder / "1" / "model.onnx")
    write(folder / "config.pbtxt", _config("onnxruntime"))


_NUMPY_MLP = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.w1 = np.load(os.path.join(folder, "w1.npy"))
        self.w2 = np.load(os.path.join(folder, "w2.npy"))

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.maximum(x @ self.w1, 0) @ self.w2
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y.astype(np.float32))]))
        return out
'''


def python_mlp(folder: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    (folder / "1").mkdir(parents=True, exist_ok=True)
    np.save(folder / "1" / "w1.npy", rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32))
    np.save(folder / "1" / "w2.npy", rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32))
    write(folder / "1" / "model.py", _NUMPY_MLP)
    write(folder / "config.pbtxt", _config("python"))


def _config(backend: str) -> str:
    return (
        f'backend: "{backend}"\nmax_batch_size: 8\n'
        f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [{WIDTH}] }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{CLASSES}] }}]\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\n"
    )


MLP_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, WIDTH], "datatype": "FP32", "data": [0.1] * WIDTH}]}
).encode()


# -- the policy measurement --------------------------------------------------------------------------------------
def zipf_trace(models: int, length: int, s: float, seed: int, shift_every: int = 0) -> list[int]:
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** s for rank in range(models)]
    order = list(range(models))
    trace = []
    for i in range(length):
        if shift_every and i and i % shift_every == 0:
            rng.shuffle(order)
        trace.append(order[rng.choices(range(models), weights)[0]])
    return trace


def simulate(trace: list[int], sizes: list[float], budget: float, policy: str, half_life: int) -> float:
    """Hit rate of the residency's ordering over a trace, with model i taking sizes[i] of the budget. The server's
    orderings: `lru`, `frequency` (decayed uses per byte, as under a memory budget) and `count` (decayed uses
    alone, the frequency policy before it counted bytes). The scores decay per request as the server's decay per
    second (half-life in requests); victims are chosen as Residency._victims chooses them."""
    resident: dict[int, int] = {}  # model -> last used
    decay = 0.5 ** (1 / half_life)
    scores: dict[int, float] = {}
    hits = 0
    held = 0.0
    scale = 1.0  # scores are kept undecayed and scaled, so each step is O(1)
    keys: dict[str, Callable[[int], tuple[float, int]]] = {
        "lru": lambda m: (0.0, resident[m]),
        "frequency": lambda m: (scores.get(m, 0.0) / sizes[m], resident[m]),
        "count": lambda m: (scores.get(m, 0.0), resident[m]),
    }
    for t, model in enumerate(trace):
        scale /= decay
        scores[model] = scores.get(model, 0.0) + scale
        if model in resident:
            hits += 1
        elif (excess := held + sizes[model] - budget) > 0:
            victims, freed = [], 0.0
            for candidate in sorted(resident, key=keys[policy]):
                victims.append(candidate)
                freed += sizes[candidate]
                if freed >= excess:
                    break
            for candidate in victims[:-1]:  # kept when the rest make the room without it
                if freed - sizes[candidate] >= excess:
                    victims.remove(candidate)
                    freed -= sizes[candidate]
            for victim in victims:
                del resident[victim]
                held -= sizes[victim]
        if model not in resident:
            held += sizes[model]
        resident[model] = t
        if scale > 1e200:
            scores = {m: v / scale for m, v in scores.items()}
            scale = 1.0
    return hits / len(trace)


def run_policy(out: list[str]) -> None:
    out += ["## Eviction policy: LRU against frequency-aware (simulated on the server's orderings)", ""]
    out += ["50 models, Zipf(1.1), 200k requests; frequency half-life 30k requests (about 30 s at the zipf run's",
            "rate). `moving`: the popularity ranks are shuffled every N requests. `like-sized`: room for 10 models of",
            "one size. `mixed`: the zipf run's models, every other one an ONNX MLP of 0.6 MiB and the rest Python MLPs",
            "of 12.4 MiB, under its budget (5 of each); `by count` ranks by decayed uses alone, not per byte.", ""]
    out += ["| trace | sizes | LRU hit rate | frequency-aware by count | frequency-aware (per byte) |", "|---|---|---|---|---|"]
    like_sized, mixed = [1.0] * 50, [0.6 if i % 2 == 0 else 12.4 for i in range(50)]
    for label, shift in (("stationary", 0), ("moving every 50k", 50_000), ("moving every 10k", 10_000)):
        trace = zipf_trace(50, 200_000, 1.1, seed=13, shift_every=shift)
        for kind, sizes in (("like-sized", like_sized), ("mixed", mixed)):
            budget = sum(sizes) / 5  # room for a fifth of the models' bytes: 10 of them, or 5 of each kind
            rates = [simulate(trace, sizes, budget, policy, 30_000) for policy in ("lru", "count", "frequency")]
            out.append(f"| {label} | {kind} | " + " | ".join(f"{r:.3f}" for r in rates) + " |")
    out.append("")


# -- load generation ---------------------------------------------------------------------------------------------
@dataclass
class Sample:
    start: float
    model: str
    latency: float
    ok: bool
    hit: bool


@dataclass
class RunResult:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def drive(
    url_of: Callable[[str], str],
    headers_of: Callable[[str], dict[str, str]],
    body: bytes,
    names: list[str],
    weights: list[float],
    clients: int,
    seconds: float,
    is_hit: Callable[[str], bool],
) -> RunResult:
    result = RunResult()
    stop = threading.Event()
    lock = threading.Lock()

    def client(seed: int) -> None:
        # A keep-alive connection per server address on http.client: 650 µs of client CPU per request against
        # 1,670 with `requests` (one thread, measured here), CPU the 64 client threads take from the server on
        # the same two cores.
        rng = random.Random(seed)
        connections: dict[str, http.client.HTTPConnection] = {}
        local: list[Sample] = []
        while not stop.is_set():
            name = rng.choices(names, weights)[0]
            hit = is_hit(name)
            url = urllib.parse.urlsplit(url_of(name))
            start = time.monotonic()
            try:
                connection = connections.get(url.netloc)
                if connection is None:
                    connection = connections[url.netloc] = http.client.HTTPConnection(url.netloc, timeout=120)
                connection.request("POST", url.path, body, headers_of(name))
                reply = connection.getresponse()
                text = reply.read()
                ok = reply.status == 200
                if not ok:
                    with lock:
                        result.errors.append(text[:200].decode(errors="replace"))
            except (OSError, http.client.HTTPException) as exc:
                ok = False
                broken = connections.pop(url.netloc, None)
                if broken is not None:
                    broken.close()
                with lock:
                    result.errors.append(str(exc)[:200])
            local.append(Sample(start, name, time.monotonic() - start, ok, hit))
        for connection in connections.values():
            connection.close()
        with lock:
            result.samples.extend(local)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # the run's length
    stop.set()
    for thread in threads:
        thread.join(180)
    result.seconds = time.monotonic() - began
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def summarize(label: str, run: RunResult, evictions: float | None) -> str:
    ok = [s for s in run.samples if s.ok]
    hits = [s.latency for s in ok if s.hit]
    misses = [s.latency for s in ok if not s.hit]
    failed = len(run.samples) - len(ok)
    rate = len(ok) / run.seconds if run.seconds else 0.0
    hit_rate = len(hits) / len(ok) if ok else 0.0
    ev = f"{evictions / run.seconds:.2f}" if evictions is not None else "n/a"
    return (
        f"| {label} | {rate:.0f} | {hit_rate:.3f} | {percentile(hits, 0.5):.1f} | {percentile(hits, 0.99):.1f} | "
        f"{percentile(misses, 0.5):.1f} | {percentile(misses, 0.99):.1f} | {ev} | {failed} |"
    )


def scrape(server: RunningServer) -> str:
    # Uncompressed: the 10 Hz sampler's scrapes are the benchmark's cost, not the server's (a Prometheus scrapes
    # every 15 s), and gzip-compressing each cost the server 3-4% of its CPU in this benchmark.
    return requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", headers={"Accept-Encoding": "identity"},
                        timeout=10).text  # fmt: skip


def metric(server: RunningServer, name: str, text: str | None = None) -> float:
    text = scrape(server) if text is None else text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def on_demand_loads(text: str) -> dict[str, float]:
    """nereid_model_loads_total{cause="on_demand"} by model."""
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("nereid_model_loads_total{") and 'cause="on_demand"' in line:
            model = line.split('model="', 1)[1].split('"', 1)[0]
            counts[model] = counts.get(model, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


@dataclass
class Snapshot:
    """What the sampler saw between `asked` and `answered`: the READY models and each one's on-demand loads."""

    asked: float
    answered: float
    ready: set[str]
    loads: dict[str, float]


def classify_by_snapshots(run: RunResult, snapshots: list[Snapshot]) -> None:
    """A request is a hit when its model was READY in the last snapshot answered before it started, and no load of
    that model completed between that snapshot and the first one asked after it ended. A request that waited for a
    load always sees a load complete in that span, so no miss is counted as a hit, however stale the snapshot;
    the rare hit on a model that was evicted and loaded again just before it started counts as a miss."""
    answered = [s.answered for s in snapshots]
    asked = [s.asked for s in snapshots]
    for sample in run.samples:
        before = bisect.bisect_right(answered, sample.start) - 1
        after = bisect.bisect_left(asked, sample.start + sample.latency)
        if before < 0 or after >= len(snapshots):
            continue  # at the run's edges: keep the classification taken as it started
        first, last = snapshots[before], snapshots[after]
        sample.hit = sample.model in first.ready and first.loads.get(sample.model, 0) == last.loads.get(sample.model, 0)


def tree_memory(pid: int) -> int:
    """The real memory of the server and its worker processes: the sum of their PSS (pages shared between them, such
    as the shared-memory arenas, counted once in all)."""
    try:
        process = psutil.Process(pid)
        total = 0
        for member in [process, *process.children(recursive=True)]:
            try:
                total += member.memory_full_info().pss
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


def settled_memory(pid: int, timeout: float = 30.0) -> int:
    """tree_memory once four samples half a second apart agree within 1 MiB (spare workers finish their imports)."""
    samples: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.append(tree_memory(pid))
        if len(samples) > 3 and max(samples[-4:]) - min(samples[-4:]) < (1 << 20):
            break
        time.sleep(0.5)
    return max(samples[-4:])


# -- zipf over 50 models -----------------------------------------------------------------------------------------
def build_fifty(repository: Path, count: int) -> list[str]:
    names = []
    for i in range(count):
        name = f"onnx_{i:02d}" if i % 2 == 0 else f"py_{i:02d}"
        (onnx_mlp if i % 2 == 0 else python_mlp)(repository / name, i)
        names.append(name)
    return names


def ok_rate(run: RunResult) -> float:
    return sum(1 for s in run.samples if s.ok) / run.seconds if run.seconds else 0.0


def _zipf_nereid(repository: Path, ranked: list[str], weights: list[float], state: Path, budget: int, clients: int,
                 seconds: float, warmup: float, logs: Path) -> tuple[RunResult, float, dict[str, float], int, str]:  # fmt: skip
    """One Zipf run through Nereid: the run, evictions counted over it, the peaks (charged, real), the idle base, and
    the churn it survived (loads and evictions over the whole server life, how the server ended)."""
    server = start_nereid(repository, "--model-control-mode=explicit", "--model-load-on-demand=true",
                          f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}",
                          log_dir=logs)  # fmt: skip
    try:
        # The idle base with both frameworks imported and the spare workers started: paid once per server.
        for name in ("onnx_00", "py_01"):
            requests.post(f"{server.base}/v2/models/{name}/infer", data=MLP_BODY, timeout=120).raise_for_status()
            requests.post(f"{server.base}/v2/repository/models/{name}/unload", timeout=60).raise_for_status()
        base_memory = settled_memory(server.process.pid)
        snapshot: dict[str, set[str]] = {"ready": set()}
        snapshots: list[Snapshot] = []
        peaks = {"charged": 0.0, "tree": 0.0}
        stop = threading.Event()

        def sampler() -> None:
            while not stop.is_set():
                try:
                    asked = time.monotonic()
                    rows = requests.post(server.base + "/v2/repository/index", timeout=5).json()
                    text = scrape(server)
                    snapshot["ready"] = {r["name"] for r in rows if r.get("state") == "READY"}
                    snapshots.append(Snapshot(asked, time.monotonic(), snapshot["ready"], on_demand_loads(text)))
                    peaks["charged"] = max(peaks["charged"], metric(server, "nereid_models_resident_bytes", text))
                    peaks["tree"] = max(peaks["tree"], tree_memory(server.process.pid))
                except requests.RequestException:
                    pass
                stop.wait(0.1)

        watcher = threading.Thread(target=sampler)
        watcher.start()
        url = f"{server.base}/v2/models/{{}}/infer"
        headers = {"Content-Type": "application/json"}
        try:
            if warmup > 0:  # untimed: the first request of every model is a miss; a steady state needs time
                drive(url.format, lambda n: headers, MLP_BODY, ranked, weights, clients, warmup, lambda n: True)
            evicted_before = metric(server, "nereid_model_evictions_total")
            run = drive(url.format, lambda n: headers, MLP_BODY, ranked, weights, clients, seconds,
                        lambda n: n in snapshot["ready"])  # fmt: skip
        finally:
            stop.set()
            watcher.join(10)
        classify_by_snapshots(run, snapshots)
        evictions = metric(server, "nereid_model_evictions_total") - evicted_before
        life = scrape(server)
        churn = (f"{metric(server, 'nereid_model_loads_total', life):.0f} loads and "
                 f"{metric(server, 'nereid_model_evictions_total', life):.0f} evictions over the server's life")  # fmt: skip
    finally:
        alive = server.process.poll() is None
        status = server.stop()
    # faulthandler is on in `nereid serve`: a native crash prints "Fatal Python error" and ends the process.
    crashed = not alive or "Fatal Python error" in server.log()
    ending = f"the server crashed (exit status {status}; log {server.log_path})" if crashed else f"exit status {status}"
    return run, evictions, peaks, base_memory, f"{churn}; {ending}"


def run_zipf(out: list[str], seconds: float, warmup: float, clients: int, count: int, resident: int, use_ray: bool,
             logs: Path, rounds: int = 1) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "models"
        names = build_fifty(repository, count)
        rng = random.Random(11)
        ranked = names[:]
        rng.shuffle(ranked)  # popularity independent of the backend
        weights = [1.0 / (r + 1) ** 1.1 for r in range(len(ranked))]
        state = Path(tmp) / "footprints.json"
        # Measure one model of each kind alone; the rest are estimated from them (same backend, same files).
        probe = start_nereid(repository, "--model-control-mode=explicit", "--model-load-on-demand=true",
                             f"--model-footprint-state-file={state}", log_dir=logs)  # fmt: skip
        try:
            for name in ("onnx_00", "py_01"):
                requests.post(f"{probe.base}/v2/models/{name}/infer", data=MLP_BODY, timeout=120).raise_for_status()
        finally:
            probe.stop()  # footprints are measured once more as the models unload, after serving
        remembered = json.loads(state.read_text())["models"]
        sizes = {name: int(remembered[name]["host_bytes"]) for name in ("onnx_00", "py_01")}
        budget = int(resident / 2 * (sizes["onnx_00"] + sizes["py_01"]))
        out += [f"## {count} models, budget for about {resident}, Zipf(1.1), {clients} clients, {seconds:g} s "
                f"(after {warmup:g} s of untimed warm-up), {rounds} round(s) of Nereid then Ray Serve", ""]  # fmt: skip
        out += [f"Footprints measured alone: ONNX MLP {sizes['onnx_00'] / 2**20:.1f} MiB, Python MLP "
                f"{sizes['py_01'] / 2**20:.1f} MiB; budget {budget / 2**20:.1f} MiB.", ""]  # fmt: skip
        out += ["| round | server | ok req/s | hit rate | hit p50 ms | hit p99 ms | miss p50 ms | miss p99 ms | evictions/s | failed |",
                "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        ratios, memory, errors, churns = [], [], [], []
        for number in range(1, rounds + 1):
            run, evictions, peaks, base, churn = _zipf_nereid(repository, ranked, weights, state, budget, clients,
                                                              seconds, warmup, logs)  # fmt: skip
            out.append(f"| {number} " + summarize("Nereid (on demand + budget)", run, evictions))
            memory.append((peaks, base))
            churns.append(churn)
            errors += run.errors[:3]
            if use_ray:
                ray = run_ray(repository, ranked, weights, clients, seconds, warmup, resident, logs)
                out.append(f"| {number} " + ray[0])
                if ray[1]:
                    ratios.append(ok_rate(run) / ray[1])
        out.append("")
        if errors:
            out += [f"First Nereid errors: {errors[:3]}", ""]
        if ratios:
            out += ["Nereid / Ray Serve ok req/s, per round: " + ", ".join(f"{r:.2f}" for r in ratios), ""]
        for number, (peaks, base) in enumerate(memory, 1):
            out += [f"Round {number}: peak charged bytes {peaks['charged'] / 2**20:.1f} MiB against the budget of "
                    f"{budget / 2**20:.1f} MiB; peak real memory (PSS of the server and its workers) "
                    f"{peaks['tree'] / 2**20:.1f} MiB, of which the idle base (frameworks imported, spare workers "
                    f"started) {base / 2**20:.1f} MiB (real - base = {(peaks['tree'] - base) / 2**20:.1f} MiB).", ""]  # fmt: skip
        out += [f"Round {number}: {churn}." for number, churn in enumerate(churns, 1)] + [""]
        if not use_ray:
            out += ["Ray Serve was not run (--no-ray).", ""]


_RAY_APP = '''
import os
import sys

import numpy as np
import onnxruntime
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

REPOSITORY = os.environ["NEREID_BENCH_REPOSITORY"]
LIMIT = int(os.environ["NEREID_BENCH_LIMIT"])


@serve.deployment(num_replicas=1, max_ongoing_requests=256)
class Multiplexed:
    @serve.multiplexed(max_num_models_per_replica=LIMIT)
    async def get_model(self, model_id: str):
        folder = os.path.join(REPOSITORY, model_id, "1")
        if model_id.startswith("onnx_"):
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = 1
            session = onnxruntime.InferenceSession(os.path.join(folder, "model.onnx"), options)
            return lambda x: session.run(None, {"INPUT0": x})[0]
        w1 = np.load(os.path.join(folder, "w1.npy"))
        w2 = np.load(os.path.join(folder, "w2.npy"))
        return lambda x: np.maximum(x @ w1, 0) @ w2

    async def __call__(self, request: Request):
        model = await self.get_model(serve.get_multiplexed_model_id())
        body = await request.json()
        x = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(body["inputs"][0]["shape"])
        y = model(x)
        return JSONResponse({"outputs": [{"name": "OUTPUT0", "shape": list(y.shape), "data": y.ravel().tolist()}]})


app = Multiplexed.bind()
'''


def ensure_ray() -> Path | None:
    """Ray Serve in a virtualenv of its own, so its dependencies never touch the project's."""
    python = RAY_VENV / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import ray.serve, onnxruntime"], capture_output=True).returncode == 0:
        return python
    RAY_VENV.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(RAY_VENV)], check=True)
        subprocess.run([str(RAY_VENV / "bin" / "pip"), "install", "-q", "ray[serve]", "onnxruntime", "numpy"], check=True)
    except subprocess.CalledProcessError as exc:
        print(f"could not install Ray Serve: {exc}", file=sys.stderr)
        return None
    return python


def run_ray(repository: Path, names: list[str], weights: list[float], clients: int, seconds: float, warmup: float,
            limit: int, logs: Path) -> tuple[str, float | None]:  # fmt: skip
    python = ensure_ray()
    if python is None:
        return "| Ray Serve multiplexing | not run: Ray Serve could not be installed here | | | | | | | |", None
    port = free_port()
    app_dir = Path(tempfile.mkdtemp())
    (app_dir / "ray_app.py").write_text(_RAY_APP)
    env = {**os.environ, "NEREID_BENCH_REPOSITORY": str(repository), "NEREID_BENCH_LIMIT": str(limit),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(app_dir)}  # fmt: skip
    script = (
        "import ray, time, sys\nfrom ray import serve\n"
        "ray.init(num_cpus=2, include_dashboard=False)\n"
        f"serve.start(http_options={{'host': '127.0.0.1', 'port': {port}}})\n"
        "import ray_app\nserve.run(ray_app.app, route_prefix='/')\nprint('READY', flush=True)\n"
        "sys.stdin.read()\n"
    )
    log = open(logs / "ray.log", "w")
    process = subprocess.Popen([str(python), "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=log, text=True, start_new_session=True)  # fmt: skip
    try:
        ready = False
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline() if process.stdout else ""
            if line.startswith("READY"):
                ready = True
                break
        if not ready:
            return "| Ray Serve multiplexing | did not start (see ray.log) | | | | | | | |", None
        # Ray's per-replica LRU is not visible from outside: a client-side LRU of the last `limit` models stands in.
        shadow: OrderedDict[str, None] = OrderedDict()
        shadow_lock = threading.Lock()

        def is_hit(name: str) -> bool:
            with shadow_lock:
                hit = name in shadow
                shadow[name] = None
                shadow.move_to_end(name)
                while len(shadow) > limit:
                    shadow.popitem(last=False)
                return hit

        def headers(name: str) -> dict[str, str]:
            return {"serve_multiplexed_model_id": name, "Content-Type": "application/json"}

        if warmup > 0:
            drive(lambda n: f"http://127.0.0.1:{port}/", headers, MLP_BODY, names, weights, clients, warmup, is_hit)
        run = drive(lambda n: f"http://127.0.0.1:{port}/", headers, MLP_BODY, names, weights, clients, seconds, is_hit)
        return summarize(f"Ray Serve {_ray_version(python)} multiplexing ({limit}/replica)", run, None), ok_rate(run)
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
        subprocess.run([str(python), "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
        shutil.rmtree(app_dir, ignore_errors=True)


def _ray_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True).stdout.strip()


# -- cold start ------------------------------------------------------------------------------------------------------
def build_cold(repository: Path) -> dict[str, tuple[str, bytes]]:
    """One model per backend, with its endpoint and body."""
    from tests.integration.framework_models import fil_config, xgboost_model

    onnx_mlp(repository / "onnx", 0)
    python_mlp(repository / "python", 1)
    xgboost_model(repository / "fil" / "1" / "xgboost.json", "binary", features=6, trees=50)
    write(repository / "fil" / "config.pbtxt", fil_config("fil", 6, [("output__0", [1])], model_type="xgboost_json"))
    shutil.copytree(ROOT / "examples" / "model_repository" / "tiny_llm", repository / "tiny_llm")
    tree_body = json.dumps({"inputs": [{"name": "input__0", "shape": [1, 6], "datatype": "FP32", "data": [0.5] * 6}]})
    llm_body = json.dumps({"text_input": "hello", "parameters": {"max_tokens": 4}})
    return {
        "onnx": ("infer", MLP_BODY),
        "python": ("infer", MLP_BODY),
        "fil": ("infer", tree_body.encode()),
        "tiny_llm": ("generate", llm_body.encode()),
    }


def _cold_times(server: RunningServer, name: str, endpoint: str, body: bytes, repeats: int) -> tuple[float, float]:
    """Median seconds to a first response: on demand (unloaded, then a request) and explicit (load, then a request)."""
    # Untimed first: the framework's import and first-session costs are paid once per process, and would otherwise
    # all land on whichever mode runs first.
    requests.post(f"{server.base}/v2/models/{name}/{endpoint}", data=body, timeout=300).raise_for_status()
    lazy, eager = [], []
    for _ in range(repeats):
        requests.post(f"{server.base}/v2/repository/models/{name}/unload", timeout=60)
        time.sleep(0.5)  # let the pool of spare workers fill again, as it does between a real server's cold starts
        start = time.monotonic()
        reply = requests.post(f"{server.base}/v2/models/{name}/{endpoint}", data=body, timeout=300)
        lazy.append(time.monotonic() - start)
        reply.raise_for_status()
        requests.post(f"{server.base}/v2/repository/models/{name}/unload", timeout=60)
        time.sleep(0.5)
        start = time.monotonic()
        requests.post(f"{server.base}/v2/repository/models/{name}/load", timeout=300).raise_for_status()
        requests.post(f"{server.base}/v2/models/{name}/{endpoint}", data=body, timeout=300).raise_for_status()
        eager.append(time.monotonic() - start)
    return statistics.median(lazy), statistics.median(eager)


def _process_start(code: str, repeats: int) -> float:
    """Median seconds for the server's Python to start and run `code` (a worker's start without its model)."""
    times = []
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for _ in range(max(3, repeats)):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        times.append(time.monotonic() - start)
    return statistics.median(times)


def run_cold(out: list[str], repeats: int, logs: Path) -> None:
    out += ["## Cold start to first response", ""]
    out += ["Each model is used once untimed first (framework imports), then unloaded before each timed run. With "
            "loading on demand a Python model's worker is a spare (2 by default) forked from the fork server (on by "
            "default); the last two columns start each worker at the load, forked "
            "(`--backend-config=python,spare-workers=0`) and as a fresh process (`... fork-server=false` too).", ""]  # fmt: skip
    out += ["| backend | on demand: first request (ms, median) | explicit: load + first request (ms, median) "
            "| on demand, no spares, forked (ms) | on demand, no spares, fresh process (ms) |", "|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "models"
        models = build_cold(repository)
        rows = {}
        server = start_nereid(repository, "--model-control-mode=explicit", "--model-load-on-demand=true", log_dir=logs)
        try:
            for name, (endpoint, body) in models.items():
                rows[name] = _cold_times(server, name, endpoint, body, repeats)
        finally:
            server.stop()
        python_only: dict[str, float] = {}
        for label, flags in (("forked", ["--backend-config=python,spare-workers=0"]),
                             ("fresh", ["--backend-config=python,spare-workers=0",
                                        "--backend-config=python,fork-server=false"])):  # fmt: skip
            server = start_nereid(repository, "--model-control-mode=explicit", "--model-load-on-demand=true", *flags,
                                  log_dir=logs)  # fmt: skip
            try:
                endpoint, body = models["python"]
                python_only[label] = _cold_times(server, "python", endpoint, body, repeats)[0]
            finally:
                server.stop()
        for name, (lazy, eager) in rows.items():
            last = "- | -"
            if name == "python":
                last = f"{python_only['forked'] * 1000:.0f} | {python_only['fresh'] * 1000:.0f}"
            out.append(f"| {name} | {lazy * 1000:.0f} | {eager * 1000:.0f} | {last} |")
    interpreter = _process_start("pass", repeats)
    imports = _process_start("import nereid.backends.python.worker", repeats)
    out += ["", "Where a Python worker's own start goes (median of separate runs of the server's Python):", "",
            "| phase | ms |", "|---|---|",
            f"| interpreter start (`python -c pass`) | {interpreter * 1000:.0f} |",
            f"| + the worker's imports (numpy, pb_utils, protocol, asyncio) | {(imports - interpreter) * 1000:.0f} |",
            f"| a Python model's cold start with a spare worker (INIT, initialize(), first request) "
            f"| {rows['python'][0] * 1000:.0f} |", ""]  # fmt: skip


# -- warm hits ---------------------------------------------------------------------------------------------------------
def run_warm(out: list[str], seconds: float, logs: Path) -> None:
    out += ["## The cost of a warm hit (ONNX MLP, c=16, HTTP JSON)", "", "| mode | req/s | p50 ms | p99 ms |", "|---|---|---|---|"]
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "models"
        onnx_mlp(repository / "warm", 3)
        for label, flags in (("explicit (preloaded)", ["--load-model=warm"]),
                             ("on demand (preloaded, then hits)", ["--load-model=warm", "--model-load-on-demand=true"]),
                             ("explicit, second run", ["--load-model=warm"]),
                             ("on demand, second run", ["--load-model=warm", "--model-load-on-demand=true"])):  # fmt: skip
            server = start_nereid(repository, "--model-control-mode=explicit", *flags, log_dir=logs)
            url = f"{server.base}/v2/models/warm/infer"
            try:
                run = drive(lambda n, u=url: u, lambda n: {"Content-Type": "application/json"},  # type: ignore[misc]
                            MLP_BODY, ["warm"], [1.0], 16, seconds, lambda n: True)  # fmt: skip
            finally:
                server.stop()
            ok = [s.latency for s in run.samples if s.ok]
            rates[label] = len(ok) / run.seconds
            out.append(f"| {label} | {rates[label]:.0f} | {percentile(ok, 0.5):.2f} | {percentile(ok, 0.99):.2f} |")
    explicit = (rates["explicit (preloaded)"] + rates["explicit, second run"]) / 2
    lazy = (rates["on demand (preloaded, then hits)"] + rates["on demand, second run"]) / 2
    out += ["", f"On demand / explicit throughput (mean of two alternating runs each): {lazy / explicit:.3f}", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zipf-seconds", type=float, default=120.0)
    parser.add_argument("--zipf-warmup-seconds", type=float, default=30.0)
    parser.add_argument("--zipf-rounds", type=int, default=1, help="alternate Nereid and Ray Serve this many times")
    parser.add_argument("--warm-seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--resident", type=int, default=10)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--only", default="policy,cold,zipf,warm")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--note", default="", help="a line for the results file (the machine, its load)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "orchestration.md")
    args = parser.parse_args()
    only = set(args.only.split(","))
    logs = Path(tempfile.mkdtemp(prefix="nereid-bench-orch-"))
    out = ["# Model orchestration benchmark (issue 13)", "",
           f"`{' '.join(['benchmarks/bench_orchestration.py', *sys.argv[1:]])}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
           ""]  # fmt: skip
    if args.note:
        out += [args.note, ""]
    if "policy" in only:
        run_policy(out)
    if "cold" in only:
        run_cold(out, args.cold_repeats, logs)
    if "zipf" in only:
        run_zipf(out, args.zipf_seconds, args.zipf_warmup_seconds, args.clients, args.models, args.resident,
                 not args.no_ray, logs, args.zipf_rounds)  # fmt: skip
    if "warm" in only:
        run_warm(out, args.warm_seconds, logs)
    text = "\n".join(out) + "\n"
    print(text)
    args.out.write_text(text)
    print(f"(server logs in {logs})", file=sys.stderr)


if __name__ == "__main__":
    main()
