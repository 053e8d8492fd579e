"""Which models stay resident: loading on demand (one load per model however many ask, a timeout, a back-off after
a failure), admission against the memory budget and group limits, eviction of idle models, pins and idle unloads.

It decides, and asks its owner (the manager, through the `ResidencyCalls` it hands down) to load or unload; it never
routes a request, and it evicts only a model that has no request in flight or queued, no load running and no waiter,
checked in the same step that takes its routes away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nereid.config.model_config import ModelConfig
from nereid.core.await_all import await_all
from nereid.core.errors import NereidError, Status
from nereid.core.settings import ServerSettings
from nereid.repository.footprints import Footprint, FootprintBook, LoadProbe, Nvml, files_bytes, process_memory
from nereid.repository.memory_sizes import format_bytes, parse_memory_size
from nereid.repository.model_version import ModelVersion
from nereid.repository.records import ModelRecord
from nereid.repository.routing import VersionRoutes, check_version_string

__all__ = ["Residency", "ResidencyCalls", "Admission", "PIN_KEY", "GROUP_KEY", "FOOTPRINT_KEY", "COLD_WAIT_BUCKETS"]

log = logging.getLogger("nereid.repository")

# config.pbtxt `parameters` keys (string values) that the residency policy reads.
PIN_KEY = "nereid.pin"  # "true": never evicted or unloaded for idleness
GROUP_KEY = "nereid.group"  # a group name that --model-group-limit NAME:N limits
FOOTPRINT_KEY = "nereid.memory_footprint"  # a declared size ("512MiB"), used until a measurement exists

COLD_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The frequency-aware policy's request counts decay by half every this many seconds.
_HALF_LIFE_SECS = 30.0
_TICK_SECS = 0.5
# How often a load on demand that found no idle model to evict looks again.
_ROOM_POLL_SECS = 0.005
# Budgeted loads admitted at once (see Residency._turns), and how long a load waits for its turn before it goes
# ahead anyway (for the load a model's initialize() asks for, which would otherwise wait on its own caller).
LOADS_AT_ONCE = 1
TURN_WAIT_SECS = 5.0


def _parameter(config: ModelConfig, key: str) -> str:
    entry = config.parameters.get(key)
    return entry.string_value.strip() if entry is not None else ""


@dataclass(frozen=True, slots=True)
class ResidencyCalls:
    """What Residency reads of the models and asks of their lifecycle; its owner hands these down, so residency
    never holds the owner itself. Residency reads `records` and `routes` and never changes them."""

    records: Mapping[str, ModelRecord]
    routes: VersionRoutes
    in_repository: Callable[[str], bool]  # whether a repository holds a model of that name
    # Load a model on demand, leaving it as it is if it is serving once its lock is taken; raises NereidError.
    load_on_demand: Callable[[str], Awaitable[None]]
    # Unload an idle model (name, the reason the index shows, a check made in the step that takes its routes
    # away): False when the check said it was busy.
    evict: Callable[[str, str, Callable[[], bool]], Awaitable[bool]]
    # Each model that a serving ensemble's step uses, with those ensembles.
    ensembles_by_model: Callable[[], Mapping[str, list[str]]]


@dataclass(slots=True)
class _Usage:
    """What the policy knows of one model name across its loads and unloads."""

    last_used: float = 0.0
    score: float = 0.0  # decayed request count (the frequency-aware policy)
    seen_requests: int = 0
    pinned: bool = False
    group: str = ""
    backend: str = ""
    files: int = 0
    footprint: Footprint | None = None  # charged while resident
    measured_in_process: int | None = None  # the server-side part of a measured footprint


@dataclass(slots=True)
class Admission:
    """A load that the budget admitted: its footprint is reserved, and it holds the budget's turn (when it took
    one), until the load succeeds or fails."""

    name: str
    footprint: Footprint
    probe: LoadProbe | None = None
    turn: asyncio.Semaphore | None = None

    def finish(self) -> None:
        if self.turn is not None:
            self.turn.release()
            self.turn = None


@dataclass(slots=True)
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1


class Residency:
    def __init__(self, settings: ServerSettings, calls: ResidencyCalls) -> None:
        self._calls = calls
        self.settings = settings
        self.on_demand = settings.model_load_on_demand
        budget = settings.model_memory_budget
        self.host_budget = budget.host_bytes if budget is not None else 0
        self.gpu_budget = dict(budget.gpu_bytes) if budget is not None else {}
        # Anything to orchestrate: otherwise the index keeps Triton's exact shape (no footprints).
        self.active = bool(
            self.on_demand or budget is not None or settings.model_group_limits or settings.model_idle_unload_secs
        )
        self.nvml = Nvml()
        self.book = FootprintBook(settings.model_footprint_state_file)
        self._usage: dict[str, _Usage] = {}
        self._reserved: dict[str, Footprint] = {}
        self._flights: dict[str, asyncio.Future[None]] = {}
        self._waiters: dict[str, int] = {}
        self._failures: dict[str, tuple[float, NereidError]] = {}
        self._rollout_pins: set[str] = set()
        self._admission = asyncio.Lock()
        # Budgeted loads take turns, from admission until the model is ready. A loading model holds its share of
        # the budget and serves nothing, so each load admitted beside another leaves one model fewer serving: with
        # fast evictions, overlapping loads would keep several models' shares idle and lower the hit rate.
        self._turns = asyncio.Semaphore(LOADS_AT_ONCE)
        self._task: asyncio.Task[None] | None = None
        # Metrics: (model, cause) -> count; the cold-start waits of requests that waited for a load on demand.
        self.loads: dict[tuple[str, str], int] = {}
        self.evictions: dict[tuple[str, str], int] = {}
        self.cold_waits = _Histogram(COLD_WAIT_BUCKETS)

    # -- what the metrics and the index read --------------------------------------------------------
    def footprint(self, name: str) -> Footprint | None:
        usage = self._usage.get(name)
        reserved = self._reserved.get(name)
        return reserved if reserved is not None else (usage.footprint if usage is not None else None)

    def resident_bytes(self) -> dict[str, int]:
        return {n: u.footprint.host_bytes for n, u in self._usage.items() if u.footprint is not None}

    def charged_host(self) -> int:
        return sum(self.resident_bytes().values()) + sum(f.host_bytes for f in self._reserved.values())

    def _charged_gpu(self, device: int) -> int:
        held = sum(u.footprint.gpu_bytes.get(device, 0) for u in self._usage.values() if u.footprint is not None)
        return held + sum(f.gpu_bytes.get(device, 0) for f in self._reserved.values())

    # -- loading on demand -----------------------------------------------------------------------
    async def acquire(self, name: str, version: str) -> ModelVersion:
        """The ready version of `name`, loading the model first: every caller shares one load, waits for it up
        to --model-load-on-demand-timeout-secs, and a model whose load failed fails its callers with that error
        for the back-off period instead of loading again."""
        calls = self._calls
        routes = calls.routes
        check_version_string(version)
        if routes.has_ready(name):
            return routes.resolve(name, version)
        failure = self._failures.get(name)
        if failure is not None:
            until, error = failure
            if time.monotonic() < until:
                raise NereidError(error.status, f"{error.message} (loading on demand is retried after {until - time.monotonic():.1f} s)")
            del self._failures[name]
        if name not in calls.records and not calls.in_repository(name):
            return routes.resolve(name, version)  # the unknown-model error, as without loading on demand
        self._waiters[name] = self._waiters.get(name, 0) + 1
        start = time.monotonic()
        timeout = self.settings.model_load_on_demand_timeout_secs
        deadline = start + timeout
        try:
            while True:
                flight = self._flights.get(name)
                if flight is None:
                    flight = self._flights[name] = asyncio.ensure_future(self._load_on_demand(name))
                    flight.add_done_callback(_retrieve)
                try:
                    await asyncio.wait_for(asyncio.shield(flight), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise NereidError.unavailable(
                        f"[model '{name}'] not ready: its load on demand did not finish within {timeout:g} s "
                        f"(--model-load-on-demand-timeout-secs); the load goes on"
                    ) from None
                # Resolved before this waiter stops counting, so no eviction can come between. An explicit unload
                # may have come first, though: then load again, within the same deadline.
                if routes.has_ready(name) or time.monotonic() >= deadline:
                    return routes.resolve(name, version)
        finally:
            self.cold_waits.observe(time.monotonic() - start)
            waiting = self._waiters[name] - 1
            if waiting:
                self._waiters[name] = waiting
            else:
                del self._waiters[name]

    async def _load_on_demand(self, name: str) -> None:
        try:
            await self._calls.load_on_demand(name)
        except NereidError as exc:
            backoff = self.settings.model_load_failure_backoff_secs
            # No room in the budget (UNAVAILABLE) passes as requests finish; only a model that fails to load waits.
            if backoff > 0 and exc.status is not Status.UNAVAILABLE:
                self._failures[name] = (time.monotonic() + backoff, exc)
            log.error("load on demand of '%s' failed: %s", name, exc.message)
            raise
        finally:
            self._flights.pop(name, None)

    def pin_for_rollout(self, name: str, pinned: bool) -> None:
        """While a rollout runs, neither its primary nor its candidate may be evicted or unloaded for idleness:
        the rollout's gates compare them over the same window."""
        if pinned:
            self._rollout_pins.add(name)
        else:
            self._rollout_pins.discard(name)

    def forget_failure(self, name: str) -> None:
        """An explicit load tries again at once, back-off or not."""
        self._failures.pop(name, None)

    # -- admission, before a load creates anything ---------------------------------------------------
    async def admit(self, name: str, config: ModelConfig, model_path: Path, instances: int, cause: str) -> Admission:
        """Reserve the model's footprint within the budget and its group's limit, evicting idle models as the
        policy orders them; 503 naming what holds the memory when nothing can go. A load on demand first waits
        for a model to turn idle (requests finish), up to --model-load-on-demand-timeout-secs; other loads do not
        wait."""
        usage = self._usage.setdefault(name, _Usage())
        usage.pinned = _parameter(config, PIN_KEY).lower() in ("true", "1", "yes")
        usage.group = _parameter(config, GROUP_KEY)
        usage.backend = config.backend or config.platform
        usage.files = await asyncio.to_thread(files_bytes, model_path)
        footprint = self._expected_footprint(name, config, usage, instances)
        # Its waiters give up at the on-demand timeout; giving up a little before it lets them hear why.
        patience = 0.9 * self.settings.model_load_on_demand_timeout_secs if cause == "on_demand" else 0.0
        deadline = time.monotonic() + patience
        budgeted = bool(self.host_budget or self.gpu_budget)
        while True:
            turn = await self._take_turn() if budgeted else None
            try:
                async with self._admission:
                    try:
                        if usage.group and usage.group in self.settings.model_group_limits:
                            limit = self.settings.model_group_limits[usage.group]
                            await self._make_room_in_group(name, usage.group, limit)
                        if budgeted:
                            await self._make_room(name, footprint)
                    except _NoRoom as exc:
                        if time.monotonic() >= deadline:
                            raise NereidError.unavailable(str(exc)) from None
                    else:
                        self._reserved[name] = footprint
                        admission = Admission(name, footprint, LoadProbe(self.nvml), turn)
                        turn = None  # the admission holds it until the load ends
                        return admission
            finally:
                # Neither the lock nor the turn is held while waiting for room: a load that fits (a smaller model)
                # goes ahead meanwhile.
                if turn is not None:
                    turn.release()
            await asyncio.sleep(_ROOM_POLL_SECS)  # busy models turn idle as their requests finish

    async def _take_turn(self) -> asyncio.Semaphore | None:
        """The budget's turn (see _turns), or None after TURN_WAIT_SECS: a load that a loading model's
        initialize() asked for would otherwise wait on its own caller."""
        try:
            async with asyncio.timeout(TURN_WAIT_SECS):  # not wait_for: its task costs a loop turn at each hand-off
                await self._turns.acquire()
        except TimeoutError:
            log.info("a load went ahead without waiting longer for its turn (%g s)", TURN_WAIT_SECS)
            return None
        return self._turns

    def _expected_footprint(self, name: str, config: ModelConfig, usage: _Usage, instances: int) -> Footprint:
        if usage.footprint is not None and usage.footprint.source == "measured":
            return Footprint(usage.footprint.host_bytes, dict(usage.footprint.gpu_bytes), "measured")
        remembered = self.book.remembered(name, usage.files)
        if remembered is not None:
            return remembered
        declared = _parameter(config, FOOTPRINT_KEY)
        if declared:
            try:
                return Footprint(parse_memory_size(declared, f"model '{name}' parameter '{FOOTPRINT_KEY}'"), {}, "declared")
            except ValueError as exc:
                raise NereidError.invalid(f"failed to load '{name}': {exc}") from None
        return self.book.estimate(usage.backend, usage.files, instances)

    def _busy_reason(self, name: str, dependents: Mapping[str, list[str]] | None = None) -> str:
        """Why `name` cannot be evicted now ("" when it can); `dependents`: the ensembles by model, when known."""
        record = self._calls.records.get(name)
        usage = self._usage.get(name)
        if record is None or not record.serving:
            return "not resident"
        if usage is not None and usage.pinned:
            return "pinned"
        if name in self._rollout_pins:
            return "pinned by its rollout"
        if record.loading or record.lock.locked() or name in self._reserved:
            return "loading"
        if self._waiters.get(name):
            return "requests waiting"
        if any(mv.inflight or mv.stats.pending for mv in record.serving.values()):
            return "requests in flight"
        if dependents is None:
            dependents = self._calls.ensembles_by_model()
        for ensemble in dependents.get(name, []):
            other = self._calls.records.get(ensemble)
            if other is not None and any(mv.inflight for mv in other.serving.values()):
                return f"used by ensemble '{ensemble}' in flight"
        return ""

    def _is_idle(self, name: str) -> bool:
        return not self._busy_reason(name)

    def _eviction_order(self, names: Iterable[str], per_byte: bool) -> list[str]:
        """Idle candidates, the first to go first: least recently used, or (frequency-aware) least used lately,
        counted per byte held when the limit is a memory budget (`per_byte`) and per model under a group limit."""
        dependents = self._calls.ensembles_by_model()

        def recency(name: str) -> float:
            # An ensemble's use is a use of each model its steps run.
            return max([self._last_used(name), *(self._last_used(e) for e in dependents.get(name, ()))])

        def frequency(name: str) -> float:
            uses = self._score(name) + sum(self._score(e) for e in dependents.get(name, ()))
            return uses / self._held_bytes(name) if per_byte else uses

        candidates = [n for n in names if not self._busy_reason(n, dependents)]
        if self.settings.model_eviction_policy == "frequency":
            return sorted(candidates, key=lambda n: (frequency(n), recency(n)))
        return sorted(candidates, key=recency)

    def _held_bytes(self, name: str) -> int:
        """Host and GPU bytes a resident model is charged (at least 1, as the divisor of its uses)."""
        held = self._usage[name].footprint
        if held is None:
            return 1
        return max(1, held.host_bytes + sum(held.gpu_bytes.values()))

    def _score(self, name: str) -> float:
        """The decayed request count, with the requests since the last tick added."""
        usage = self._usage.get(name)
        record = self._calls.records.get(name)
        if usage is None:
            return 0.0
        fresh = sum(mv.requests for mv in record.serving.values()) - usage.seen_requests if record is not None else 0
        return usage.score + max(0, fresh)

    def _last_used(self, name: str) -> float:
        record = self._calls.records.get(name)
        used = self._usage[name].last_used if name in self._usage else 0.0
        if record is not None:
            used = max([used, *(mv.last_used for mv in record.serving.values())])
        return used

    def _resident_names(self) -> list[str]:
        return [n for n, u in self._usage.items() if u.footprint is not None]

    def _holding_memory(self) -> list[str]:
        """Resident models whose eviction frees memory (an ensemble holds none of its own)."""
        return [n for n, u in self._usage.items() if u.footprint is not None and u.backend != "ensemble"]

    async def _make_room_in_group(self, name: str, group: str, limit: int) -> None:
        while True:
            members = [n for n in self._resident_names() if n != name and self._usage[n].group == group]
            members += [n for n in self._reserved if n != name and self._usage[n].group == group]
            if len(members) < limit:
                return
            order = self._eviction_order((n for n in members if n not in self._reserved), per_byte=False)
            if not order:
                holders = ", ".join(f"'{n}' ({self._busy_reason(n) or 'loading'})" for n in sorted(members))
                raise _NoRoom(
                    f"[model '{name}'] cannot load: group '{group}' already has its limit of {limit} resident models "
                    f"(--model-group-limit) and none can be evicted: {holders}"
                )
            await self._evict(order[0], "group", f"group '{group}' is at its limit of {limit}, loading '{name}'")

    def _shortfall(self, footprint: Footprint) -> str:
        """What does not fit ("" when the footprint fits): host bytes, then each GPU budget. A reloading model's
        old versions stay charged until they unload, since both are resident meanwhile."""
        if self.host_budget:
            used = self.charged_host()
            if used + footprint.host_bytes > self.host_budget:
                return (
                    f"needs {format_bytes(footprint.host_bytes)} ({footprint.source}) of the host budget of "
                    f"{format_bytes(self.host_budget)}, {format_bytes(used)} in use"
                )
        for device, limit in self.gpu_budget.items():
            used = self._charged_gpu(device)
            need = footprint.gpu_bytes.get(device, 0)
            if need and used + need > limit:
                return f"needs {format_bytes(need)} of GPU {device}'s budget of {format_bytes(limit)}, {format_bytes(used)} in use"
        return ""

    async def _make_room(self, name: str, footprint: Footprint) -> None:
        while True:
            short = self._shortfall(footprint)
            if not short:
                return
            order = self._eviction_order((n for n in self._holding_memory() if n != name), per_byte=True)
            if not order:
                raise _NoRoom(f"[model '{name}'] cannot load: it {short}, and nothing can be evicted: {self._holders()}")
            # Every model needed to fit goes at once (their unloads overlap); a GPU shortfall takes one per round.
            why = f"loading '{name}', which {short}"
            await await_all(self._evict(victim, "budget", why) for victim in self._victims(order, footprint))

    def _victims(self, order: list[str], footprint: Footprint) -> list[str]:
        """The first models of the eviction order whose host bytes, together, make room for `footprint`, less any
        of them the rest already make room without: a small model ahead of a big one in the order frees too
        little to matter, and evicting it would only cost its next request a cold start."""
        excess = self.charged_host() + footprint.host_bytes - self.host_budget if self.host_budget else 0
        if excess <= 0:
            return order[:1]  # a GPU shortfall: one per round

        def size(name: str) -> int:
            held = self._usage[name].footprint
            return held.host_bytes if held is not None else 0

        victims: list[str] = []
        freed = 0
        for candidate in order:
            victims.append(candidate)
            freed += size(candidate)
            if freed >= excess:
                break
        for candidate in list(victims[:-1]):  # the last one was needed to reach the excess
            if freed - size(candidate) >= excess:
                victims.remove(candidate)
                freed -= size(candidate)
        return victims

    def _holders(self) -> str:
        rows = []
        for holder in sorted(self._holding_memory() + list(self._reserved)):
            footprint = self.footprint(holder)
            size = format_bytes(footprint.host_bytes) if footprint is not None else "?"
            rows.append(f"'{holder}' {size} ({self._busy_reason(holder) or 'loading'})")
        return ", ".join(rows) or "no model is resident"

    async def _evict(self, name: str, cause: str, why: str) -> None:
        usage = self._usage[name]
        size = format_bytes(usage.footprint.host_bytes) if usage.footprint is not None else "?"
        idle = time.monotonic() - self._last_used(name)
        if not await self._calls.evict(name, f"evicted: {cause}", partial(self._is_idle, name)):
            return  # it became busy; the caller's loop looks again
        self.evictions[(name, cause)] = self.evictions.get((name, cause), 0) + 1
        log.info("evicted model '%s' (%s, unused for %.1f s, policy %s): %s", name, size, idle, self.settings.model_eviction_policy, why)

    # -- the lifecycle's reports -------------------------------------------------------------------
    def load_succeeded(self, admission: Admission | None, name: str, versions: Iterable[ModelVersion], cause: str) -> None:
        self.loads[(name, cause)] = self.loads.get((name, cause), 0) + 1
        self._failures.pop(name, None)
        usage = self._usage.setdefault(name, _Usage())
        usage.last_used = time.monotonic()
        usage.seen_requests = 0  # the new versions count their requests from 0
        versions = list(versions)
        if admission is None:  # an ensemble: no instances of its own
            usage.backend = "ensemble"
            usage.footprint = Footprint(0, {}, "measured")
            return
        admission.finish()
        self._reserved.pop(name, None)
        delta = admission.probe.finish() if admission.probe is not None else None
        pids = _worker_pids(versions)
        workers = sum(process_memory(pid) for pid in pids)
        gpu_workers = self.nvml.used_by(pids)
        if delta is None and not pids:
            # Loaded alongside another model: the server's memory cannot be split between them. Keep the estimate
            # (or what was remembered) until a load done alone measures it.
            usage.footprint = admission.footprint
            return
        in_process, gpu_in_process = delta if delta is not None else (usage.measured_in_process or 0, {})
        usage.measured_in_process = in_process
        gpu = dict(gpu_workers)
        for device, size in gpu_in_process.items():
            gpu[device] = gpu.get(device, 0) + size
        host = in_process + workers
        if pids and admission.footprint.source in ("measured", "remembered"):
            # Taken before the first requests grow the workers' arenas: the size the model had when it last
            # unloaded, after serving, says better what it will hold. Without this, models that reload would be
            # sized small (four Python models in a budget for three) and their first answers would overrun it. A
            # re-sample of the workers lowers it if the model really is smaller now (an in-process delta is never
            # re-sampled, so it is not held up this way: it would only ratchet up with the noise of its loads).
            host = max(host, admission.footprint.host_bytes)
            for device, size in admission.footprint.gpu_bytes.items():
                gpu[device] = max(gpu.get(device, 0), size)
        usage.footprint = Footprint(host, gpu, "measured")
        self.book.record(name, usage.backend, usage.files, usage.footprint)

    def load_failed(self, admission: Admission | None) -> None:
        if admission is None:
            return
        admission.finish()
        self._reserved.pop(admission.name, None)
        if admission.probe is not None:
            admission.probe.finish()

    def before_unload(self, name: str, versions: Iterable[ModelVersion]) -> None:
        """Measure a worker-process model once more as it leaves: it has served, so its arenas have grown to what
        its requests need (a footprint taken right after the load has not seen them), and the next cold load is
        admitted with that size. Reads one small /proc file per worker."""
        usage = self._usage.get(name)
        if usage is None or usage.footprint is None or usage.footprint.source != "measured":
            return
        pids = _worker_pids(versions)
        if not pids:
            return
        host = (usage.measured_in_process or 0) + _total_memory(pids)
        if host > usage.footprint.host_bytes:
            usage.footprint = Footprint(host, dict(usage.footprint.gpu_bytes), "measured")
            self.book.record(name, usage.backend, usage.files, usage.footprint)

    def unloaded(self, name: str, versions: Iterable[ModelVersion]) -> None:
        usage = self._usage.get(name)
        if usage is None:
            return
        versions = list(versions)
        usage.last_used = max([usage.last_used, *(mv.last_used for mv in versions)])
        # Requests since the last tick still count: the frequency-aware policy remembers a model across unloads.
        usage.score += max(0, sum(mv.requests for mv in versions) - usage.seen_requests)
        usage.seen_requests = 0
        usage.footprint = None

    # -- the background work: frequency decay, idle unloads, re-sampling, the state file -------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.book.save()

    async def _run(self) -> None:
        resample_at = time.monotonic() + self.settings.model_footprint_resample_secs
        decay = 0.5 ** (_TICK_SECS / _HALF_LIFE_SECS)
        while True:
            await asyncio.sleep(_TICK_SECS)
            try:
                self._decay_scores(decay)
                if self.settings.model_idle_unload_secs > 0:
                    await self._unload_idle()
                if time.monotonic() >= resample_at:
                    resample_at = time.monotonic() + self.settings.model_footprint_resample_secs
                    await self._resample()
                    self.book.save()
            except Exception:
                log.exception("model residency upkeep failed")

    def _decay_scores(self, decay: float) -> None:
        for name, record in self._calls.records.items():
            usage = self._usage.get(name)
            if usage is None:
                continue
            count = sum(mv.requests for mv in record.serving.values())
            fresh = max(0, count - usage.seen_requests)
            usage.seen_requests = count
            usage.score = usage.score * decay + fresh

    async def _unload_idle(self) -> None:
        limit = self.settings.model_idle_unload_secs
        now = time.monotonic()
        for name in self._resident_names():
            if now - self._last_used(name) >= limit and not self._busy_reason(name):
                ensembles = self._calls.ensembles_by_model().get(name, [])
                if any(now - self._last_used(e) < limit for e in ensembles):
                    continue
                idle = now - self._last_used(name)
                if await self._calls.evict(name, "idle", partial(self._is_idle, name)):
                    self.evictions[(name, "idle")] = self.evictions.get((name, "idle"), 0) + 1
                    log.info("unloaded model '%s': unused for %.1f s (--model-idle-unload-secs=%g)", name, idle, limit)

    async def _resample(self) -> None:
        """Worker processes grow after warm-up: measure them again, and evict if the budget no longer holds."""
        for name in self._resident_names():
            usage = self._usage[name]
            record = self._calls.records.get(name)
            if record is None or usage.footprint is None or usage.footprint.source != "measured":
                continue
            pids = _worker_pids(record.serving.values())
            if not pids:
                continue
            workers = await asyncio.to_thread(_total_memory, pids)
            gpu = self.nvml.used_by(pids)
            usage.footprint = Footprint((usage.measured_in_process or 0) + workers, gpu, "measured")
            self.book.record(name, usage.backend, usage.files, usage.footprint)
        if self.host_budget and self.charged_host() > self.host_budget:
            async with self._admission:
                while self.charged_host() > self.host_budget:
                    order = self._eviction_order(self._holding_memory(), per_byte=True)
                    if not order:
                        log.warning("resident models hold more than the memory budget and none can be evicted: %s", self._holders())
                        return
                    await self._evict(order[0], "budget", "re-sampled footprints exceed the budget")


class _NoRoom(Exception):
    """Nothing can be evicted now; the message lists what holds the memory."""


def _retrieve(future: asyncio.Future[None]) -> None:
    """A load's error belongs to its waiters; taking it here keeps asyncio from reporting it unretrieved."""
    if not future.cancelled():
        future.exception()


def _total_memory(pids: list[int]) -> int:
    return sum(process_memory(pid) for pid in pids)


def _worker_pids(versions: Iterable[ModelVersion]) -> list[int]:
    """The worker processes of the versions' instances (Python backend models run in their own processes)."""
    pids: list[int] = []
    for mv in versions:
        for instance in mv.instances:
            pid = getattr(instance, "pid", None)
            if isinstance(pid, int):
                pids.append(pid)
    return pids
