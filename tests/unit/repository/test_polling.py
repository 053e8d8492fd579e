"""Poll mode over a folder on disk and fake lifecycle calls (`PollingCalls`): new models load, changed ones reload,
removed ones are unloaded then forgotten, unchanged and failed ones are left alone until their folder changes, and
loading on demand leaves models nobody asked for unloaded."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError
from nereid.repository.polling import PollingCalls, RepositoryPoller
from nereid.repository.records import ModelRecord
from tests.unit.repository.fakes import FakeVersion, settings, write_model


@dataclass
class RecordingLifecycle:
    """Records every call in order; a load makes the model serve unless `failing` names it."""

    records: dict[str, ModelRecord] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    refresh_error: str = ""  # what refreshing the remote copies fails with, if anything

    async def refresh(self) -> bool:
        self.calls.append("refresh")
        if self.refresh_error:
            raise NereidError.internal(self.refresh_error)
        return False

    async def load(self, name: str) -> None:
        self.calls.append(f"load {name}")
        record = self.records.setdefault(name, ModelRecord(name))  # the manager keeps a record of a failed load
        if name in self.failing:
            raise NereidError.invalid(f"load failed for model '{name}'")
        record.serving = {1: FakeVersion(name)}

    async def unload(self, name: str) -> None:
        self.calls.append(f"unload {name}")
        self.records[name].serving = {}

    def forget(self, name: str) -> None:
        self.calls.append(f"forget {name}")
        self.records.pop(name, None)

    def polling_calls(self) -> PollingCalls:
        return PollingCalls(
            records=self.records, refresh=self.refresh, load=self.load, unload=self.unload, forget=self.forget
        )


def _poller(root: Path, **flags: Any) -> tuple[RepositoryPoller, RecordingLifecycle]:
    lifecycle = RecordingLifecycle()
    flags.setdefault("model_control_mode", "poll")
    poller = RepositoryPoller(settings(model_repositories=[root], **flags), lifecycle.polling_calls())
    return poller, lifecycle


def _poll(poller: RepositoryPoller) -> None:
    asyncio.run(poller.poll_once())


def test_a_poll_refreshes_remote_copies_first_then_loads_each_new_model(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    write_model(tmp_path, "b")
    poller, lifecycle = _poller(tmp_path)
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load a", "load b"]
    assert lifecycle.records["a"].fingerprint != ""


def test_a_poll_whose_remote_copies_cannot_be_read_is_skipped(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    poller, lifecycle = _poller(tmp_path)
    _poll(poller)
    shutil.rmtree(tmp_path / "a")
    lifecycle.refresh_error = "failed to poll from model repository 'gs://models/repo': 503 Service Unavailable"
    _poll(poller)  # no scan: 'a' keeps serving
    assert lifecycle.calls == ["refresh", "load a", "refresh"]
    lifecycle.refresh_error = ""
    _poll(poller)
    assert lifecycle.calls[-3:] == ["refresh", "unload a", "forget a"]


def test_a_model_whose_folder_is_unchanged_is_not_loaded_again(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    poller, lifecycle = _poller(tmp_path)
    _poll(poller)
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load a", "refresh"]


def test_a_model_whose_folder_changed_is_reloaded(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "a")
    poller, lifecycle = _poller(tmp_path)
    _poll(poller)
    (folder / "1" / "weights.bin").write_bytes(b"new weights")
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load a", "refresh", "load a"]


def test_a_removed_model_is_unloaded_then_forgotten(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    folder = write_model(tmp_path, "b")
    poller, lifecycle = _poller(tmp_path)
    _poll(poller)
    shutil.rmtree(folder)
    lifecycle.calls.clear()
    _poll(poller)
    assert lifecycle.calls == ["refresh", "unload b", "forget b"]
    assert sorted(lifecycle.records) == ["a"]


def test_a_model_that_failed_to_load_is_tried_again_only_when_its_folder_changes(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "a")
    poller, lifecycle = _poller(tmp_path)
    lifecycle.failing.add("a")
    _poll(poller)  # the failure is logged, not raised
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load a", "refresh"]
    lifecycle.failing.clear()
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text() + "\n# fixed\n")
    _poll(poller)
    assert lifecycle.calls[-1] == "load a"
    assert lifecycle.records["a"].serving


def test_loading_on_demand_a_poll_loads_no_model_nobody_asked_for_and_reloads_only_loaded_ones(tmp_path: Path) -> None:
    write_model(tmp_path, "idle")
    served = write_model(tmp_path, "served")
    poller, lifecycle = _poller(tmp_path, model_load_on_demand=True)
    lifecycle.records["served"] = ModelRecord("served", serving={1: FakeVersion("served")})
    lifecycle.records["evicted"] = ModelRecord("evicted")  # known, not serving: it stays unloaded
    write_model(tmp_path, "evicted")
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load served"]
    (served / "1" / "weights.bin").write_bytes(b"changed")
    lifecycle.calls.clear()
    _poll(poller)
    assert lifecycle.calls == ["refresh", "load served"]


def test_the_poller_stops_when_asked(tmp_path: Path) -> None:
    write_model(tmp_path, "a")

    async def scenario() -> None:
        poller, lifecycle = _poller(tmp_path, repository_poll_secs=0.01)
        poller.start()
        deadline = asyncio.get_running_loop().time() + 5
        while "load a" not in lifecycle.calls:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        poller.stop()
        await asyncio.sleep(0.05)
        polls = lifecycle.calls.count("refresh")
        await asyncio.sleep(0.05)
        assert lifecycle.calls.count("refresh") == polls

    asyncio.run(scenario())
