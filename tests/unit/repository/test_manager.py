"""The model lifecycle on a folder of fake-backend models (instances that log when they start and close): the order
of load, reload, unload and evict steps, what the manager tells the residency and when, and what the index and
routing show after each. A spy stands in the residency's place to log the manager's reports."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

import pytest

from nereid.backends import base as backends_base
from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError, Status
from nereid.repository.manager import ModelRepositoryManager
from nereid.repository.model_version import ModelState, ModelVersion
from nereid.repository.residency import Admission, Residency
from tests.unit.repository import fakes
from tests.unit.repository.fakes import EVENTS, settings, write_model

SRC = Path(__file__).resolve().parents[3] / "src" / "nereid" / "repository"


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends_base.BACKEND_MODULES, "fake", (fakes.__name__, None))
    EVENTS.clear()


class ResidencySpy:
    """The manager's residency, with each report the manager makes logged into the same timeline as the instances'
    starts and closes (whether the model was still routed is logged with the unload reports)."""

    def __init__(self, manager: ModelRepositoryManager) -> None:
        self._real: Residency = manager.residency
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _routed(self, name: str) -> str:
        return "routed" if self._manager.routes.has_ready(name) else "unrouted"

    async def admit(self, name: str, config: ModelConfig, model_path: Path, instances: int, cause: str) -> Admission:
        EVENTS.append(f"admit {name} {cause}")
        return await self._real.admit(name, config, model_path, instances, cause)

    def load_succeeded(self, admission: Admission | None, name: str, versions: Iterable[ModelVersion], cause: str) -> None:
        EVENTS.append(f"load_succeeded {name}")
        self._real.load_succeeded(admission, name, versions, cause)

    def load_failed(self, admission: Admission | None) -> None:
        EVENTS.append(f"load_failed {admission.name if admission is not None else '-'}")
        self._real.load_failed(admission)

    def before_unload(self, name: str, versions: Iterable[ModelVersion]) -> None:
        EVENTS.append(f"before_unload {name} {self._routed(name)}")
        self._real.before_unload(name, versions)

    def unloaded(self, name: str, versions: Iterable[ModelVersion]) -> None:
        EVENTS.append(f"unloaded {name}")
        self._real.unloaded(name, versions)


def _run(root: Path, body: Callable[[ModelRepositoryManager], Coroutine[Any, Any, None]], **flags: Any) -> None:
    async def main() -> None:
        manager = ModelRepositoryManager(settings(model_repositories=[root], model_control_mode="explicit", **flags))
        manager.residency = ResidencySpy(manager)  # type: ignore[assignment]
        manager.server = object()  # type: ignore[assignment]  # ensembles hold a server handle; no request runs here
        try:
            await body(manager)
        finally:
            await manager.unload_all(None)

    asyncio.run(main())


async def _refusal(awaitable: Coroutine[Any, Any, object]) -> NereidError:
    with pytest.raises(NereidError) as caught:
        await awaitable
    return caught.value


def _index_row(manager: ModelRepositoryManager, name: str) -> dict[str, Any]:
    rows = [row for row in manager.index() if row["name"] == name]
    assert len(rows) == 1, rows
    return rows[0]


# -- load and reload -------------------------------------------------------------------------------------------
def test_a_load_is_admitted_before_any_instance_starts_and_reported_once_its_instances_are_up(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        assert EVENTS == ["admit a explicit", "create a v", "load_succeeded a"]
        assert manager.resolve("a", "").state is ModelState.READY
        assert _index_row(manager, "a")["state"] == "READY"

    _run(tmp_path, body)


def test_a_reload_brings_the_new_version_up_before_the_old_one_closes(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="old")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        old = manager.resolve("a", "1")
        write_model(tmp_path, "a", tag="new")
        EVENTS.clear()
        await manager.load("a")
        assert EVENTS == ["admit a explicit", "create a new", "load_succeeded a", "close a old"]
        new = manager.resolve("a", "1")
        assert new is not old and new.state is ModelState.READY
        assert old.state is ModelState.UNAVAILABLE

    _run(tmp_path, body)


def test_a_failed_reload_keeps_the_old_version_serving_and_releases_its_admission(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="old")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        old = manager.resolve("a", "")
        write_model(tmp_path, "a", tag="new", fail=True)
        EVENTS.clear()
        refusal = await _refusal(manager.load("a"))
        assert refusal.message == (
            "load failed for model 'a': version 1 is at UNAVAILABLE state: instance of 'a' failed to start"
        )
        assert EVENTS == ["admit a explicit", "load_failed a"]  # "old" was never closed
        assert manager.resolve("a", "") is old
        assert manager.all_ready()

    _run(tmp_path, body)


def test_a_failed_first_load_shows_the_version_unavailable_with_its_reason(tmp_path: Path) -> None:
    write_model(tmp_path, "a", fail=True)

    async def body(manager: ModelRepositoryManager) -> None:
        await _refusal(manager.load("a"))
        row = _index_row(manager, "a")
        assert row["state"] == "UNAVAILABLE"
        assert row["reason"] == "instance of 'a' failed to start"
        assert not manager.all_ready()
        assert (await _refusal(_resolve(manager, "a", "1"))).status is Status.UNAVAILABLE

    _run(tmp_path, body)


async def _resolve(manager: ModelRepositoryManager, name: str, version: str) -> ModelVersion:
    return manager.resolve(name, version)


def test_a_config_that_cannot_be_read_is_a_model_level_failure_in_the_index(tmp_path: Path) -> None:
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "config.pbtxt").write_text("this is not a config")

    async def body(manager: ModelRepositoryManager) -> None:
        refusal = await _refusal(manager.load("bad"))
        row = _index_row(manager, "bad")
        assert row["state"] == "UNAVAILABLE" and row["reason"] == refusal.message
        assert EVENTS == []  # nothing was admitted or created

    _run(tmp_path, body)


def test_a_name_no_repository_holds_fails_and_leaves_no_record(tmp_path: Path) -> None:
    write_model(tmp_path, "a")

    async def body(manager: ModelRepositoryManager) -> None:
        refusal = await _refusal(manager.load("ghost"))
        assert refusal.message == "failed to load 'ghost', failed to poll from model repository"
        assert "ghost" not in manager.records
        assert [row["name"] for row in manager.index()] == ["a"]

    _run(tmp_path, body)


def test_a_blank_name_or_one_that_leaves_the_repository_is_refused_in_triton_s_words(tmp_path: Path) -> None:
    write_model(tmp_path, "a")

    async def body(manager: ModelRepositoryManager) -> None:
        for name in ("", " \t\n"):
            refusal = await _refusal(manager.load(name))
            assert refusal.status is Status.INVALID_ARG
            assert refusal.message == "Model name cannot be empty. Please enter a valid name to deploy."
        for name in ("../a", "a/../a", "..", " ..", "a/", "/etc/passwd"):
            assert "model name must not contain path traversal characters" in (await _refusal(manager.load(name))).message
        for name in ("...", "..a", "a..1"):  # names, not paths: only missing
            assert (await _refusal(manager.load(name))).message.endswith("failed to poll from model repository")
        assert [row["name"] for row in manager.index()] == ["a"]

    _run(tmp_path, body)


def test_a_load_on_demand_of_a_model_that_serves_by_then_leaves_it_as_it_is(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        mv = manager.resolve("a", "")
        EVENTS.clear()
        await manager.load("a", explicit=False, cause="on_demand", if_absent=True)
        assert EVENTS == []
        assert manager.resolve("a", "") is mv

    _run(tmp_path, body)


# -- unload and evict ---------------------------------------------------------------------------------------------
def test_unload_takes_the_routes_away_then_reports_before_and_after_the_versions_close(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        EVENTS.clear()
        await manager.unload("a")
        assert EVENTS == ["before_unload a unrouted", "close a v", "unloaded a"]
        assert _index_row(manager, "a") == {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}

    _run(tmp_path, body)


def test_evict_refuses_a_model_the_idleness_check_finds_busy_and_keeps_it_serving(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        mv = manager.resolve("a", "")
        EVENTS.clear()
        assert not await manager.evict("a", "evicted: budget", lambda: False)
        assert EVENTS == []
        assert manager.resolve("a", "") is mv

    _run(tmp_path, body)


def test_evict_unloads_an_idle_model_with_the_reason_the_index_shows(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("a")
        EVENTS.clear()
        checked: list[bool] = []

        def still_idle() -> bool:
            checked.append(manager.routes.has_ready("a"))  # checked while still routed, in the same step
            return True

        assert await manager.evict("a", "evicted: budget", still_idle)
        assert checked == [True]
        assert EVENTS == ["before_unload a unrouted", "close a v", "unloaded a"]
        row = _index_row(manager, "a")
        assert (row["state"], row["reason"]) == ("UNAVAILABLE", "evicted: budget")
        assert not await manager.evict("a", "evicted: budget", still_idle)  # nothing left to evict

    _run(tmp_path, body)


def test_unloading_a_composing_model_first_unloads_the_ensembles_that_use_it(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")
    write_model(tmp_path, "e", steps=["a"])

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("e")
        assert manager.resolve("a", "").state is ModelState.READY  # loaded with its ensemble
        EVENTS.clear()
        await manager.unload("a")
        unloads = [event for event in EVENTS if event.startswith(("before_unload", "unloaded"))]
        assert unloads == ["before_unload e unrouted", "unloaded e", "before_unload a unrouted", "unloaded a"]

    _run(tmp_path, body)


def test_unload_dependents_also_unloads_composing_models_loaded_only_for_that_ensemble(tmp_path: Path) -> None:
    write_model(tmp_path, "only_for_e", tag="v")
    write_model(tmp_path, "asked_for", tag="v")
    write_model(tmp_path, "e", steps=["only_for_e", "asked_for"])

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("asked_for")
        await manager.load("e")
        await manager.unload("e", unload_dependents=True)
        assert not manager.routes.has_ready("e")
        assert not manager.routes.has_ready("only_for_e")
        assert manager.routes.has_ready("asked_for")

    _run(tmp_path, body)


# -- ensembles ------------------------------------------------------------------------------------------------
def test_an_ensemble_that_cannot_load_names_why_in_the_error_and_in_the_index(tmp_path: Path) -> None:
    write_model(tmp_path, "e", steps=["ghost"])

    async def body(manager: ModelRepositoryManager) -> None:
        refusal = await _refusal(manager.load("e"))
        reason = "ensemble e contains models that are not available or ambiguous: ghost"
        assert refusal.status is Status.INVALID_ARG
        assert refusal.message == f"load failed for model 'e': {reason}"
        assert _index_row(manager, "e") == {"name": "e", "state": "UNAVAILABLE", "reason": reason}

    _run(tmp_path, body)


def test_an_ensemble_loads_its_composing_models_and_counts_as_their_dependent(tmp_path: Path) -> None:
    write_model(tmp_path, "a", tag="v")
    write_model(tmp_path, "e", steps=["a"])

    async def body(manager: ModelRepositoryManager) -> None:
        await manager.load("e")
        assert EVENTS[:3] == ["admit a explicit", "create a v", "load_succeeded a"]
        assert EVENTS[-1] == "load_succeeded e"  # an ensemble creates no instance, so it is not admitted
        assert manager.ensembles.dependents("a") == ["e"]
        assert not manager.records["a"].explicit and manager.records["e"].explicit

    _run(tmp_path, body)


# -- the seams --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("child", ["residency.py", "polling.py", "ensemble_dependencies.py", "routing.py"])
def test_the_managers_children_reach_it_only_through_the_calls_it_hands_down(child: str) -> None:
    source = (SRC / child).read_text()
    assert not re.search(r"^\s*(from|import) nereid\.repository\.manager\b", source, re.MULTILINE)
