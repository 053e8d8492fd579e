"""Residency against a fake lifecycle (`FakeLifecycle` hands it `ResidencyCalls`): admission under the memory budget,
the eviction order of the frequency-aware and LRU policies, pins, groups and busy models, the single flight of loads
on demand with their timeout and failure back-off, and the footprints it charges."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from nereid.core.errors import NereidError, Status
from nereid.repository import residency as residency_module
from nereid.repository.footprints import Footprint
from tests.unit.repository.fakes import FakeLifecycle, FakeProbe, MiB, budget, model_config, settings

NO_FOLDER = Path("/nonexistent")  # the fake models have no files: their footprints are declared


@pytest.fixture(autouse=True)
def fake_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads are probed without reading this process's memory; by default they overlap (no delta to measure)."""
    monkeypatch.setattr(residency_module, "LoadProbe", FakeProbe)
    monkeypatch.setattr(FakeProbe, "delta", None)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def _models(sizes: dict[str, int], **flags: Any) -> FakeLifecycle:
    """A lifecycle whose repository holds fake-backend models of the given declared sizes in MiB."""
    lifecycle = FakeLifecycle(settings(**flags))
    for name, size in sizes.items():
        lifecycle.configs[name] = model_config(name, footprint=f"{size}MiB")
    return lifecycle


async def _refusal(awaitable: Awaitable[object]) -> NereidError:
    with pytest.raises(NereidError) as caught:
        await awaitable
    return caught.value


def _use(lifecycle: FakeLifecycle, name: str, requests: int = 1) -> None:
    """`requests` more requests of `name`, the last one now (what the Server counts per request)."""
    mv = lifecycle.version(name)
    mv.requests += requests
    mv.last_used = time.monotonic()


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.01)


# -- admission under the budget --------------------------------------------------------------------------------
def test_a_load_that_fits_the_budget_is_admitted_and_charged_its_declared_footprint() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 50}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        await lifecycle.load("b")
        assert lifecycle.evicted == []
        assert lifecycle.residency.charged_host() == 90 * MiB
        assert lifecycle.residency.resident_bytes() == {"a": 40 * MiB, "b": 50 * MiB}
        assert lifecycle.residency.footprint("a") == Footprint(40 * MiB, {}, "declared")
        assert lifecycle.residency.loads == {("a", "explicit"): 1, ("b", "explicit"): 1}

    _run(scenario)


def test_a_load_past_the_budget_evicts_an_idle_model_and_stops_charging_it() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 60, "b": 60}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        await lifecycle.load("b")
        assert lifecycle.resident() == ["b"]
        assert lifecycle.evicted == [("a", "evicted: budget")]
        assert lifecycle.residency.evictions == {("a", "budget"): 1}
        assert lifecycle.residency.charged_host() == 60 * MiB
        assert lifecycle.residency.footprint("a") is None

    _run(scenario)


def test_a_model_bigger_than_the_whole_budget_is_refused_unavailable_naming_the_budget() -> None:
    async def scenario() -> None:
        lifecycle = _models({"huge": 200}, model_memory_budget=budget(100 * MiB))
        refusal = await _refusal(lifecycle.load("huge"))
        assert refusal.status is Status.UNAVAILABLE
        assert "[model 'huge'] cannot load: it needs 200.0 MiB (declared) of the host budget of 100.0 MiB" in refusal.message
        assert lifecycle.residency.charged_host() == 0

    _run(scenario)


def test_a_reservation_counts_against_the_budget_until_its_load_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(residency_module, "TURN_WAIT_SECS", 0.01)  # "b" goes ahead without waiting for a's turn

    async def scenario() -> None:
        lifecycle = _models({"a": 60, "b": 60}, model_memory_budget=budget(100 * MiB))
        residency = lifecycle.residency
        admission = await residency.admit("a", lifecycle.configs["a"], NO_FOLDER, 1, "explicit")
        assert residency.charged_host() == 60 * MiB
        assert residency.footprint("a") == Footprint(60 * MiB, {}, "declared")
        # While "a" loads, "b" does not fit and nothing can be evicted: the refusal names what holds the memory.
        refusal = await _refusal(residency.admit("b", lifecycle.configs["b"], NO_FOLDER, 1, "explicit"))
        assert refusal.status is Status.UNAVAILABLE
        assert "nothing can be evicted: 'a' 60.0 MiB" in refusal.message
        residency.load_failed(admission)
        assert residency.charged_host() == 0
        assert residency.footprint("a") is None
        await lifecycle.load("b")
        assert lifecycle.resident() == ["b"]

    _run(scenario)


def test_budgeted_loads_take_turns_from_admission_until_the_load_ends() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10, "b": 10}, model_memory_budget=budget(100 * MiB))
        residency = lifecycle.residency
        first = await residency.admit("a", lifecycle.configs["a"], NO_FOLDER, 1, "explicit")
        second = asyncio.ensure_future(residency.admit("b", lifecycle.configs["b"], NO_FOLDER, 1, "explicit"))
        await asyncio.sleep(0.05)
        assert not second.done()  # room enough, but "a" is still loading
        residency.load_succeeded(first, "a", [], "explicit")
        admission = await asyncio.wait_for(second, 1.0)
        assert residency.charged_host() == 20 * MiB
        residency.load_failed(admission)

    _run(scenario)


def test_evicting_for_room_takes_only_as_many_models_as_the_load_needs() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 30, "b": 30, "c": 30, "d": 50}, model_memory_budget=budget(100 * MiB))
        for name in "abc":
            await lifecycle.load(name)
        await lifecycle.load("d")  # 90 + 50 MiB: 40 MiB over, so the two least recently used go
        assert sorted(name for name, _ in lifecycle.evicted) == ["a", "b"]
        assert lifecycle.resident() == ["c", "d"]

    _run(scenario)


def test_a_small_model_ahead_in_the_eviction_order_is_kept_when_evicting_it_would_not_make_the_room() -> None:
    async def scenario() -> None:
        lifecycle = _models({"small": 10, "big": 80, "new": 80}, model_memory_budget=budget(100 * MiB))
        lifecycle.settings.model_eviction_policy = "lru"
        await lifecycle.load("small")
        await lifecycle.load("big")  # used after "small": "small" comes first in the order
        await lifecycle.load("new")  # 70 MiB over: "big" alone makes the room
        assert lifecycle.evicted == [("big", "evicted: budget")]
        assert lifecycle.resident() == ["new", "small"]

    _run(scenario)


# -- the eviction order ---------------------------------------------------------------------------------------
def test_lru_evicts_the_least_recently_used_idle_model() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 40, "c": 40, "d": 40}, model_memory_budget=budget(130 * MiB))
        lifecycle.settings.model_eviction_policy = "lru"
        for name in "abc":
            await lifecycle.load(name)
        _use(lifecycle, "a", requests=1)  # loaded first, but used last
        await lifecycle.load("d")
        assert lifecycle.evicted == [("b", "evicted: budget")]

    _run(scenario)


def test_the_frequency_policy_evicts_the_model_with_the_fewest_recent_requests_not_the_least_recently_used() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 40, "c": 40, "d": 40}, model_memory_budget=budget(130 * MiB))
        for name in "abc":
            await lifecycle.load(name)
        _use(lifecycle, "c", requests=3)
        _use(lifecycle, "a", requests=5)
        _use(lifecycle, "b", requests=1)  # the most recently used, and the least used
        await lifecycle.load("d")
        assert lifecycle.evicted == [("b", "evicted: budget")]

    _run(scenario)


@pytest.mark.parametrize(("policy", "evicted"), [("frequency", "big"), ("lru", "small")])
def test_under_a_budget_the_frequency_policy_counts_requests_per_byte_held(policy: str, evicted: str) -> None:
    async def scenario() -> None:
        lifecycle = _models({"small": 10, "big": 80, "new": 15}, model_memory_budget=budget(100 * MiB))
        lifecycle.settings.model_eviction_policy = policy
        await lifecycle.load("small")
        await lifecycle.load("big")
        _use(lifecycle, "small", requests=1)  # 1 request per 10 MiB
        _use(lifecycle, "big", requests=3)  # more requests, but 3 per 80 MiB; and used last
        await lifecycle.load("new")
        assert lifecycle.evicted == [(evicted, "evicted: budget")]

    _run(scenario)


def test_the_frequency_policy_remembers_a_models_requests_across_its_unload() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 50, "b": 50, "c": 50}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        _use(lifecycle, "a", requests=10)
        await lifecycle.load("b")
        _use(lifecycle, "b", requests=2)
        assert await lifecycle.evict("a", "test", lambda: True)  # unloaded with its 10 requests
        await lifecycle.load("a")  # evicts... nothing: b and a fit
        await lifecycle.load("c")  # one must go: b, with 2 requests, against a's remembered 10
        assert lifecycle.evicted[-1] == ("b", "evicted: budget")

    _run(scenario)


# -- what is never evicted --------------------------------------------------------------------------------------
def test_a_pinned_model_is_never_evicted_and_the_refusal_says_so() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 60}, model_memory_budget=budget(100 * MiB))
        lifecycle.configs["p"] = model_config("p", footprint="60MiB", pinned=True)
        await lifecycle.load("p")
        refusal = await _refusal(lifecycle.load("a"))
        assert refusal.status is Status.UNAVAILABLE
        assert "'p' 60.0 MiB (pinned)" in refusal.message
        assert lifecycle.resident() == ["p"]

    _run(scenario)


def test_a_model_under_a_rollout_is_pinned_until_the_rollout_lets_go() -> None:
    async def scenario() -> None:
        lifecycle = _models({"m": 60, "a": 60}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("m")
        lifecycle.residency.pin_for_rollout("m", True)
        refusal = await _refusal(lifecycle.load("a"))
        assert "'m' 60.0 MiB (pinned by its rollout)" in refusal.message
        assert lifecycle.resident() == ["m"]
        lifecycle.residency.pin_for_rollout("m", False)
        await lifecycle.load("a")
        assert lifecycle.resident() == ["a"]

    _run(scenario)


@pytest.mark.parametrize("busy", ["inflight", "queued"])
def test_a_model_with_a_request_in_flight_or_queued_is_not_evicted(busy: str) -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 40, "c": 40}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")  # the least recently used, but busy
        await lifecycle.load("b")
        if busy == "inflight":
            lifecycle.version("a").inflight = 1
        else:
            lifecycle.version("a").stats.pending = 1
        await lifecycle.load("c")
        assert lifecycle.evicted == [("b", "evicted: budget")]

    _run(scenario)


def test_an_explicit_load_does_not_wait_for_a_busy_model_and_names_why_it_stays() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 60, "b": 60}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        lifecycle.version("a").inflight = 1
        refusal = await _refusal(lifecycle.load("b"))
        assert "'a' 60.0 MiB (requests in flight)" in refusal.message
        assert lifecycle.resident() == ["a"]

    _run(scenario)


def test_a_composing_model_of_an_ensemble_in_flight_is_not_evicted_and_the_ensemble_holds_no_memory() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 40, "c": 40}, model_memory_budget=budget(100 * MiB))
        lifecycle.configs["e"] = model_config("e", steps=["a"])
        lifecycle.ensembles = {"a": ["e"]}
        await lifecycle.load("a")  # the least recently used
        await lifecycle.load("e")
        await lifecycle.load("b")
        lifecycle.version("e").inflight = 1
        assert lifecycle.residency.footprint("e") == Footprint(0, {}, "measured")
        await lifecycle.load("c")
        assert lifecycle.evicted == [("b", "evicted: budget")]

    _run(scenario)


def test_an_ensembles_recent_use_counts_as_a_use_of_its_composing_models() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 40, "b": 40, "c": 40}, model_memory_budget=budget(100 * MiB))
        lifecycle.settings.model_eviction_policy = "lru"
        lifecycle.configs["e"] = model_config("e", steps=["a"])
        lifecycle.ensembles = {"a": ["e"]}
        await lifecycle.load("a")
        await lifecycle.load("e")
        await lifecycle.load("b")
        _use(lifecycle, "e")  # "a" itself was used before "b", its ensemble after
        await lifecycle.load("c")
        assert lifecycle.evicted == [("b", "evicted: budget")]

    _run(scenario)


# -- group limits -----------------------------------------------------------------------------------------------
def test_a_group_at_its_limit_evicts_a_member_of_that_group_and_no_other_model() -> None:
    async def scenario() -> None:
        lifecycle = _models({"solo": 10}, model_group_limits={"g": 1})
        for name in ("g1", "g2"):
            lifecycle.configs[name] = model_config(name, footprint="10MiB", group="g")
        await lifecycle.load("solo")  # the least recently used, but in no group
        await lifecycle.load("g1")
        await lifecycle.load("g2")
        assert lifecycle.evicted == [("g1", "evicted: group")]
        assert lifecycle.resident() == ["g2", "solo"]
        assert lifecycle.residency.evictions == {("g1", "group"): 1}

    _run(scenario)


def test_a_group_at_its_limit_whose_members_are_busy_refuses_naming_them() -> None:
    async def scenario() -> None:
        lifecycle = _models({}, model_group_limits={"g": 1})
        for name in ("g1", "g2"):
            lifecycle.configs[name] = model_config(name, footprint="10MiB", group="g")
        await lifecycle.load("g1")
        lifecycle.version("g1").inflight = 1
        refusal = await _refusal(lifecycle.load("g2"))
        assert refusal.status is Status.UNAVAILABLE
        assert "group 'g' already has its limit of 1 resident models" in refusal.message
        assert "'g1' (requests in flight)" in refusal.message

    _run(scenario)


# -- loading on demand ------------------------------------------------------------------------------------------
def test_requests_for_a_serving_model_resolve_without_a_load() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_load_on_demand=True)
        mv = await lifecycle.load("a")
        assert await lifecycle.residency.acquire("a", "") is mv
        assert await lifecycle.residency.acquire("a", "1") is mv
        assert lifecycle.on_demand_loads == []

    _run(scenario)


def test_concurrent_requests_for_an_unloaded_model_share_one_load() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_load_on_demand=True)
        lifecycle.gate = asyncio.Event()
        waiters = [asyncio.ensure_future(lifecycle.residency.acquire("a", "")) for _ in range(5)]
        await _until(lambda: lifecycle.on_demand_loads == ["a"])
        for _ in range(10):
            await asyncio.sleep(0)
        assert lifecycle.on_demand_loads == ["a"]  # five waiters, one load
        lifecycle.gate.set()
        versions = await asyncio.gather(*waiters)
        assert all(mv is lifecycle.version("a") for mv in versions)
        assert lifecycle.on_demand_loads == ["a"]
        assert lifecycle.residency.loads == {("a", "on_demand"): 1}
        assert lifecycle.residency.cold_waits.count == 5

    _run(scenario)


def test_a_name_no_repository_holds_is_not_found_without_a_load() -> None:
    async def scenario() -> None:
        lifecycle = _models({}, model_load_on_demand=True)
        refusal = await _refusal(lifecycle.residency.acquire("nope", ""))
        assert refusal.status is Status.NOT_FOUND
        assert lifecycle.on_demand_loads == []

    _run(scenario)


def test_a_failed_load_on_demand_fails_its_callers_during_the_back_off_without_loading_again() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_load_on_demand=True, model_load_failure_backoff_secs=60.0)
        lifecycle.errors["a"] = NereidError.invalid("failed to load 'a': broken")
        first = await _refusal(lifecycle.residency.acquire("a", ""))
        assert first.message == "failed to load 'a': broken"
        again = await _refusal(lifecycle.residency.acquire("a", ""))
        assert again.status is Status.INVALID_ARG
        assert again.message.startswith("failed to load 'a': broken (loading on demand is retried after ")
        assert lifecycle.on_demand_loads == ["a"]
        # An explicit load forgets the failure: the next request loads again.
        lifecycle.residency.forget_failure("a")
        del lifecycle.errors["a"]
        assert await lifecycle.residency.acquire("a", "") is lifecycle.version("a")
        assert lifecycle.on_demand_loads == ["a", "a"]

    _run(scenario)


def test_a_refusal_for_lack_of_room_is_not_backed_off() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_load_on_demand=True, model_load_failure_backoff_secs=60.0)
        lifecycle.errors["a"] = NereidError.unavailable("[model 'a'] cannot load: no room")
        await _refusal(lifecycle.residency.acquire("a", ""))
        await _refusal(lifecycle.residency.acquire("a", ""))
        assert lifecycle.on_demand_loads == ["a", "a"]

    _run(scenario)


def test_a_waiter_gives_up_at_the_on_demand_timeout_while_the_load_goes_on() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_load_on_demand=True, model_load_on_demand_timeout_secs=0.05)
        lifecycle.gate = asyncio.Event()
        refusal = await _refusal(lifecycle.residency.acquire("a", ""))
        assert refusal.status is Status.UNAVAILABLE
        assert refusal.message == (
            "[model 'a'] not ready: its load on demand did not finish within 0.05 s "
            "(--model-load-on-demand-timeout-secs); the load goes on"
        )
        lifecycle.settings.model_load_on_demand_timeout_secs = 5.0
        later = asyncio.ensure_future(lifecycle.residency.acquire("a", ""))
        await asyncio.sleep(0.01)
        lifecycle.gate.set()
        assert await later is lifecycle.version("a")
        assert lifecycle.on_demand_loads == ["a"]  # the second request joined the load the first left running

    _run(scenario)


def test_a_load_on_demand_waits_for_a_busy_model_to_turn_idle_and_then_evicts_it() -> None:
    async def scenario() -> None:
        lifecycle = _models(
            {"a": 60, "b": 60}, model_memory_budget=budget(100 * MiB), model_load_on_demand=True
        )
        await lifecycle.load("a")
        lifecycle.version("a").inflight = 1
        waiting = asyncio.ensure_future(lifecycle.residency.acquire("b", ""))
        await asyncio.sleep(0.05)
        assert not waiting.done() and lifecycle.evicted == []
        lifecycle.version("a").inflight = 0  # its request finished
        assert await waiting is lifecycle.version("b")
        assert lifecycle.evicted == [("a", "evicted: budget")]

    _run(scenario)


def test_a_model_that_requests_wait_for_is_not_evicted_before_they_get_it() -> None:
    async def scenario() -> None:
        lifecycle = _models(
            {"a": 40, "b": 40, "c": 40}, model_memory_budget=budget(100 * MiB), model_load_on_demand=True
        )
        await lifecycle.load("c")
        _use(lifecycle, "c", requests=10)  # "a", with none yet, comes first in the eviction order

        async def load_b(name: str) -> None:
            await lifecycle.load("b")  # "a" serves now, but its waiters have not resumed yet

        lifecycle.after_load_on_demand = load_b
        assert await lifecycle.residency.acquire("a", "") is lifecycle.version("a")
        assert lifecycle.evicted == [("c", "evicted: budget")]

    _run(scenario)


# -- footprints ---------------------------------------------------------------------------------------------------
def test_a_load_done_alone_is_charged_what_it_measured_instead_of_its_declared_size() -> None:
    async def scenario() -> None:
        FakeProbe.delta = (30 * MiB, {})
        lifecycle = _models({"a": 60}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        assert lifecycle.residency.footprint("a") == Footprint(30 * MiB, {}, "measured")
        assert lifecycle.residency.charged_host() == 30 * MiB

    _run(scenario)


def test_a_worker_process_model_is_charged_its_workers_memory_and_measured_again_as_it_unloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker_bytes = {101: 20 * MiB, 102: 20 * MiB}
    monkeypatch.setattr(residency_module, "process_memory", lambda pid: worker_bytes[pid])

    async def scenario() -> None:
        FakeProbe.delta = (5 * MiB, {})
        lifecycle = _models({"a": 60}, model_memory_budget=budget(200 * MiB))
        await lifecycle.load("a", pids=[101, 102])
        assert lifecycle.residency.footprint("a") == Footprint(45 * MiB, {}, "measured")
        worker_bytes.update({101: 30 * MiB, 102: 30 * MiB})  # their arenas grew while serving
        assert await lifecycle.evict("a", "test", lambda: True)
        assert lifecycle.residency.footprint("a") is None  # not charged once unloaded
        # The next load is admitted with the size the model had as it left.
        residency = lifecycle.residency
        admission = await residency.admit("a", lifecycle.configs["a"], NO_FOLDER, 1, "on_demand")
        assert residency.footprint("a") == Footprint(65 * MiB, {}, "remembered")
        residency.load_failed(admission)

    _run(scenario)


def test_a_load_that_overlapped_another_keeps_its_expected_footprint() -> None:
    async def scenario() -> None:
        FakeProbe.delta = None
        lifecycle = _models({"a": 60}, model_memory_budget=budget(100 * MiB))
        await lifecycle.load("a")
        assert lifecycle.residency.footprint("a") == Footprint(60 * MiB, {}, "declared")

    _run(scenario)


# -- the background upkeep ------------------------------------------------------------------------------------------
def test_an_idle_model_is_unloaded_after_the_idle_time_but_a_pinned_one_stays() -> None:
    async def scenario() -> None:
        lifecycle = _models({"a": 10}, model_idle_unload_secs=0.01)
        lifecycle.configs["p"] = model_config("p", footprint="10MiB", pinned=True)
        await lifecycle.load("a")
        await lifecycle.load("p")
        lifecycle.residency.start()
        try:
            await _until(lambda: bool(lifecycle.evicted))
        finally:
            await lifecycle.residency.stop()
        assert lifecycle.evicted == [("a", "idle")]
        assert lifecycle.resident() == ["p"]
        assert lifecycle.residency.evictions == {("a", "idle"): 1}

    _run(scenario)
