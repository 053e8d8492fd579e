"""The route table the hot path reads: the latest ready version for an empty version string, Triton's answers for
unknown models, unknown versions, versions that are known but not ready, and malformed version strings."""

from __future__ import annotations

import pytest

from nereid.core.errors import NereidError, Status
from nereid.repository.model_version import ModelState
from nereid.repository.records import ModelRecord
from nereid.repository.routing import VersionRoutes, check_version_string
from tests.unit.repository.fakes import FakeVersion


def _table(*records: ModelRecord) -> tuple[VersionRoutes, dict[str, ModelRecord]]:
    by_name = {r.name: r for r in records}
    table = VersionRoutes(by_name)
    for record in records:
        table.rebuild(record)
    return table, by_name


def _refusal(table: VersionRoutes, name: str, version: str) -> NereidError:
    with pytest.raises(NereidError) as caught:
        table.resolve(name, version)
    return caught.value


def test_an_empty_version_resolves_to_the_highest_ready_version() -> None:
    v1, v3, v2 = FakeVersion("m", 1), FakeVersion("m", 3), FakeVersion("m", 2)
    table, _ = _table(ModelRecord("m", serving={1: v1, 3: v3, 2: v2}))
    assert table.resolve("m", "") is v3
    assert table.resolve("m", "2") is v2
    assert sorted(table.versions("m")) == ["1", "2", "3"]


def test_a_version_that_is_not_ready_is_not_routed_and_the_latest_is_the_highest_ready_one() -> None:
    loading = FakeVersion("m", 2, ready=False)
    table, _ = _table(ModelRecord("m", serving={1: FakeVersion("m", 1), 2: loading}))
    assert table.resolve("m", "").version == 1
    refusal = _refusal(table, "m", "2")
    assert refusal.status is Status.UNAVAILABLE
    assert refusal.message == "Request for unknown model: 'm' version 2 is not at ready state"
    assert table.versions("m") == ["1"]


def test_a_preferred_version_takes_requests_naming_none_while_it_is_ready() -> None:
    v1, v2 = FakeVersion("m", 1), FakeVersion("m", 2)
    record = ModelRecord("m", serving={1: v1, 2: v2})
    table, _ = _table(record)
    table.prefer("m", "1")  # a rollout's primary, though version 2 is newer
    assert table.resolve("m", "") is v1 and table.resolve("m", "2") is v2
    del record.serving[1]
    table.rebuild(record)
    assert table.resolve("m", "") is v2  # not ready: the newest stands in
    record.serving[1] = v1
    table.rebuild(record)
    assert table.resolve("m", "") is v1
    table.prefer("m", "")
    assert table.resolve("m", "") is v2  # Triton's rule again
    assert table.is_ready("m", "1") and not table.is_ready("m", "7") and not table.is_ready("nope", "1")


def test_an_unknown_model_is_not_found_in_tritons_words() -> None:
    table, _ = _table()
    refusal = _refusal(table, "nope", "")
    assert refusal.status is Status.NOT_FOUND
    assert refusal.message == "Request for unknown model: 'nope' is not found"
    assert not table.has_ready("nope")


def test_a_malformed_version_string_is_an_invalid_argument_even_for_an_unknown_model() -> None:
    table, _ = _table(ModelRecord("m", serving={1: FakeVersion("m", 1)}))
    for name in ("m", "nope"):
        refusal = _refusal(table, name, "v1")
        assert refusal.status is Status.INVALID_ARG
        assert "version string 'v1'" in refusal.message
    with pytest.raises(NereidError):
        check_version_string("-1")
    check_version_string("")
    check_version_string("12")


def test_a_version_nobody_knows_is_not_found_but_a_retired_one_is_not_at_ready_state() -> None:
    record = ModelRecord("m", serving={2: FakeVersion("m", 2)}, retired={1: "failed to load"})
    table, _ = _table(record)
    assert _refusal(table, "m", "1").status is Status.UNAVAILABLE
    unknown = _refusal(table, "m", "7")
    assert unknown.status is Status.NOT_FOUND
    assert unknown.message == "Request for unknown model: 'm' version 7 is not found"


def test_a_model_that_failed_before_naming_a_version_has_no_available_versions() -> None:
    table, _ = _table(ModelRecord("m", reason="bad config"))
    refusal = _refusal(table, "m", "")
    assert refusal.status is Status.NOT_FOUND
    assert refusal.message == "Request for unknown model: 'm' has no available versions"
    assert not table.has_ready("m")


def test_a_record_that_never_served_or_failed_gets_no_route() -> None:
    table, _ = _table(ModelRecord("m"))
    assert _refusal(table, "m", "").message == "Request for unknown model: 'm' is not found"


def test_a_rebuild_after_an_unload_takes_the_versions_away_but_keeps_the_model_known() -> None:
    mv = FakeVersion("m", 1)
    record = ModelRecord("m", serving={1: mv})
    table, _ = _table(record)
    assert table.has_ready("m") and table.ready_versions() == [mv]
    record.serving = {}
    record.retired = {1: mv}
    mv.state = ModelState.UNAVAILABLE
    table.rebuild(record)
    assert not table.has_ready("m")
    assert table.ready_versions() == []
    assert _refusal(table, "m", "1").status is Status.UNAVAILABLE


def test_forget_drops_the_route_until_the_next_rebuild() -> None:
    table, _ = _table(ModelRecord("m", serving={1: FakeVersion("m", 1)}))
    table.forget("m")
    assert _refusal(table, "m", "").status is Status.NOT_FOUND
    assert table.versions("m") == []


def test_ready_versions_lists_every_ready_version_of_every_model() -> None:
    a1, a2, b1 = FakeVersion("a", 1), FakeVersion("a", 2), FakeVersion("b", 1)
    table, _ = _table(
        ModelRecord("a", serving={1: a1, 2: a2}),
        ModelRecord("b", serving={1: b1, 2: FakeVersion("b", 2, ready=False)}),
    )
    assert {(mv.name, mv.version) for mv in table.ready_versions()} == {("a", 1), ("a", 2), ("b", 1)}
