"""An ensemble's composing models, over fake lifecycle calls (`EnsembleCalls`): loading them with the ensemble,
circular and missing dependencies, failed composing models, waiting for a start-up load, the step checks against
the composing configs, and naming the serving ensembles that use a model."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from nereid.config.model_config import ModelConfig, parse_pbtxt
from nereid.core.errors import NereidError
from nereid.repository.ensemble_dependencies import EnsembleCalls, EnsembleDependencies
from nereid.repository.records import ModelRecord
from tests.unit.repository.fakes import FakeVersion, ensemble_pbtxt, model_pbtxt


@dataclass
class TextRepositoryLifecycle:
    """A repository of config texts; a load makes the model serve (preparing an ensemble first, as the manager
    does), or fails when `failing` names it."""

    repository: dict[str, str] = field(default_factory=dict)
    records: dict[str, ModelRecord] = field(default_factory=dict)
    loads: list[tuple[str, str]] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    startup: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    explicit_control: bool = True

    def __post_init__(self) -> None:
        calls = EnsembleCalls(
            records=self.records,
            repository_names=lambda: set(self.repository),
            load=self.load,
            startup_load=self.startup.get,
        )
        self.dependencies = EnsembleDependencies(calls, self.explicit_control)

    async def load(self, name: str, cause: str) -> None:
        self.loads.append((name, cause))
        record = self.records.setdefault(name, ModelRecord(name))
        if name in self.failing:
            record.reason = f"failed to load '{name}': broken"
            raise NereidError.invalid(record.reason)
        config = parse_pbtxt(self.repository[name], name)
        if config.platform == "ensemble":
            try:
                await self.dependencies.prepare(name, config, cause)
            except NereidError as exc:
                raise NereidError.invalid(f"load failed for model '{name}': {exc.message}") from None
        self.serve(name, config)

    def serve(self, name: str, config: ModelConfig | None = None) -> FakeVersion:
        mv = FakeVersion(name, config=config if config is not None else parse_pbtxt(self.repository[name], name))
        self.records.setdefault(name, ModelRecord(name)).serving = {1: mv}
        return mv


def _lifecycle(explicit_control: bool = True, **texts: str) -> TextRepositoryLifecycle:
    return TextRepositoryLifecycle(repository=dict(texts), explicit_control=explicit_control)


def _prepare(lifecycle: TextRepositoryLifecycle, name: str, cause: str = "explicit") -> ModelConfig:
    config = parse_pbtxt(lifecycle.repository[name], name)
    asyncio.run(lifecycle.dependencies.prepare(name, config, cause))
    return config


def _refusal(lifecycle: TextRepositoryLifecycle, name: str) -> str:
    with pytest.raises(NereidError) as caught:
        _prepare(lifecycle, name)
    return caught.value.message


def test_preparing_an_ensemble_loads_each_composing_model_with_the_ensembles_cause() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), b=model_pbtxt("b"), e=ensemble_pbtxt("e", ["b", "a"]))
    _prepare(lifecycle, "e", cause="startup")
    assert lifecycle.loads == [("a", "startup"), ("b", "startup")]


def test_a_composing_model_that_already_serves_is_not_loaded_again() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
    lifecycle.serve("a")
    _prepare(lifecycle, "e")
    assert lifecycle.loads == []


def test_a_composing_model_no_repository_holds_is_refused_by_name_before_any_load() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a", "ghost"]))
    assert _refusal(lifecycle, "e") == "ensemble e contains models that are not available or ambiguous: ghost"
    assert lifecycle.loads == []


def test_circular_ensembles_are_refused_with_the_chain_that_closes_the_circle() -> None:
    lifecycle = _lifecycle(e1=ensemble_pbtxt("e1", ["e2"]), e2=ensemble_pbtxt("e2", ["e1"]))
    message = _refusal(lifecycle, "e1")
    assert "circular dependency between ensembles: e2 -> e1 -> e2" in message
    assert lifecycle.loads == [("e2", "explicit")]  # e1 is not loaded again from inside e2


def test_a_composing_model_whose_load_fails_fails_the_ensemble_with_that_error() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
    lifecycle.failing.add("a")
    assert _refusal(lifecycle, "e") == (
        "ensemble 'e' depends on 'a' which has no loaded version. Model 'a' loading failed with error: "
        "failed to load 'a': broken"
    )


@pytest.mark.parametrize(("explicit_control", "loads"), [(True, [("a", "explicit")]), (False, [])])
def test_only_explicit_control_loads_again_a_composing_model_that_already_failed(
    explicit_control: bool, loads: list[tuple[str, str]]
) -> None:
    lifecycle = _lifecycle(explicit_control, a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
    lifecycle.records["a"] = ModelRecord("a", reason="bad config")
    lifecycle.failing.add("a")
    message = _refusal(lifecycle, "e")
    assert message.startswith("ensemble 'e' depends on 'a' which has no loaded version. Model 'a' loading failed")
    assert lifecycle.loads == loads
    if not explicit_control:
        assert message.endswith("with error: bad config")


def test_an_ensemble_waits_for_its_composing_models_start_up_load_instead_of_loading_it() -> None:
    async def scenario() -> None:
        lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
        startup = asyncio.get_running_loop().create_future()
        lifecycle.startup["a"] = startup
        config = parse_pbtxt(lifecycle.repository["e"], "e")
        preparing = asyncio.ensure_future(lifecycle.dependencies.prepare("e", config, "startup"))
        await asyncio.sleep(0.01)
        assert not preparing.done()
        lifecycle.serve("a")  # what the start-up load did
        startup.set_result(None)
        await asyncio.wait_for(preparing, 1.0)
        assert lifecycle.loads == []

    asyncio.run(scenario())


def test_an_ensemble_is_decoupled_when_a_step_it_runs_is() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a", decoupled=True), b=model_pbtxt("b"), e=ensemble_pbtxt("e", ["a", "b"]))
    assert _prepare(lifecycle, "e").model_transaction_policy.decoupled
    plain = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
    assert not _prepare(plain, "e").model_transaction_policy.decoupled


def test_a_step_that_does_not_fit_its_composing_models_config_is_refused() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a", max_batch_size=2), e=ensemble_pbtxt("e", ["a"], max_batch_size=8))
    assert _refusal(lifecycle, "e") == (
        "ensemble e allows maximum batch size 8, but it contains model a which only allows maximum batch size to be 2"
    )


def test_a_step_pinned_to_a_version_that_is_not_loaded_is_refused() -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]).replace("model_version: -1", "model_version: 3"))
    assert _refusal(lifecycle, "e") == "ensemble 'e' depends on 'a' whose required version 3 is not loaded."


def test_dependents_name_the_serving_ensembles_that_use_a_model() -> None:
    lifecycle = _lifecycle(
        a=model_pbtxt("a"),
        b=model_pbtxt("b"),
        e1=ensemble_pbtxt("e1", ["a", "b"]),
        e2=ensemble_pbtxt("e2", ["a"]),
        gone=ensemble_pbtxt("gone", ["a"]),
    )
    for name in ("a", "b", "e1", "e2"):
        lifecycle.serve(name)
    lifecycle.records["gone"] = ModelRecord("gone")  # an ensemble that no longer serves uses nothing
    deps = lifecycle.dependencies
    assert deps.dependents("a") == ["e1", "e2"]
    assert deps.dependents("b") == ["e1"]
    assert deps.dependents("e1") == []
    assert deps.dependents_by_model() == {"a": ["e1", "e2"], "b": ["e1"]}


def test_a_reloaded_composing_model_that_no_longer_fits_its_ensemble_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = _lifecycle(a=model_pbtxt("a"), e=ensemble_pbtxt("e", ["a"]))
    lifecycle.serve("a")
    lifecycle.serve("e")
    lifecycle.serve("a", parse_pbtxt(model_pbtxt("a", max_batch_size=2), "a"))  # the reload
    with caplog.at_level(logging.ERROR, "nereid.repository"):
        lifecycle.dependencies.recheck_dependents("a")
    assert "ensemble 'e' no longer fits reloaded model 'a'" in caplog.text
    caplog.clear()
    lifecycle.serve("a", parse_pbtxt(model_pbtxt("a", decoupled=True), "a"))
    with caplog.at_level(logging.ERROR, "nereid.repository"):
        lifecycle.dependencies.recheck_dependents("a")
    assert "reloaded model 'a' changed whether the ensemble is decoupled" in caplog.text
    assert lifecycle.records["e"].serving[1].state.value == "READY"  # the ensemble keeps serving
