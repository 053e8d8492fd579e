"""Triton's instance update on a real server: a load whose config differs in instance_group only adds and removes
instances in place (untouched ones keep serving, requests in flight never fail, removed ones are finalized before
the load returns); a changed model file or any other setting reloads the whole model; a failed update keeps what
served; the load API's config updates too; a sequence model's removed instance lives until its sequences end.
The model writes each initialize() and finalize() to a file, as Triton's own QA model does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.servers import RunningServer, start_nereid

MODEL = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

EVENTS = os.path.join(os.environ["INSTANCE_EVENTS"], "events")


def _note(what, name, count=""):
    with open(EVENTS, "a") as f:
        f.write(f"{what} {name} {count}\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        if os.path.exists(os.path.join(os.environ["INSTANCE_EVENTS"], "fail_initialize")):
            raise RuntimeError("initialize refused")
        groups = json.loads(args["model_config"])["instance_group"]
        _note("initialize", self.name, sum(group["count"] for group in groups))

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            served = np.array([self.name.encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x), pb_utils.Tensor("SERVED_BY", served)]))
        return out

    def finalize(self):
        _note("finalize", self.name)
'''

_IO = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ] '
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "SERVED_BY" data_type: TYPE_STRING dims: [ 1 ] } ]'
)


def _config(name: str, count: int, extra: str = "") -> str:
    return (
        f'name: "{name}" backend: "python" {_IO} '
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ] {extra}\n"
    )


class Repo:
    def __init__(self, root: Path, events: Path) -> None:
        self.root = root
        self.events = events

    def write(self, name: str, config: str) -> None:
        folder = self.root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        if not (folder / "1" / "model.py").exists():
            (folder / "1" / "model.py").write_text(MODEL)
        (folder / "config.pbtxt").write_text(config)

    def counts(self, name: str) -> tuple[int, int]:
        lines = self.events.joinpath("events").read_text().splitlines() if self.events.joinpath("events").exists() else []
        mine = [line.split()[:2] for line in lines if line.split()[1].startswith(name)]
        return sum(1 for what, _ in mine if what == "initialize"), sum(1 for what, _ in mine if what == "finalize")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Repo, grpcclient.InferenceServerClient]]:
    events = tmp_path_factory.mktemp("events")
    repo = Repo(tmp_path_factory.mktemp("models"), events)
    for name in ("under_load", "reloads", "by_api", "refused", "sequences"):
        repo.write(name, _config(name, 1))
    server = start_nereid(repo.root, "--model-control-mode=explicit", env={"INSTANCE_EVENTS": str(events)})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield server, repo, client
    client.close()
    server.stop()


def _infer(client: grpcclient.InferenceServerClient, model: str, **sequence: object) -> str:
    x = grpcclient.InferInput("X", [3], "FP32")
    x.set_data_from_numpy(np.ones(3, np.float32))
    result = client.infer(model, [x], **sequence)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("Y"), np.ones(3, np.float32))
    return result.as_numpy("SERVED_BY")[0].decode()


def test_instances_added_and_removed_in_place_under_load_fail_no_request(served) -> None:
    server, repo, client = served
    client.load_model("under_load")
    repo.write("under_load", _config("under_load", 2))
    client.load_model("under_load")
    assert repo.counts("under_load") == (2, 0)  # one instance added, the first kept
    failures: list[BaseException] = []
    stop = threading.Event()

    def traffic() -> None:
        own = grpcclient.InferenceServerClient(server.grpc_url)
        while not stop.is_set():
            try:
                _infer(own, "under_load")
            except BaseException as exc:  # noqa: BLE001 - every failure is the test's finding
                failures.append(exc)
        own.close()

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        repo.write("under_load", _config("under_load", 4))
        client.load_model("under_load")
        assert repo.counts("under_load") == (4, 0)
        repo.write("under_load", _config("under_load", 1))
        client.load_model("under_load")
        assert repo.counts("under_load") == (4, 3)  # removed instances are finalized before the load returns
        repo.write("under_load", _config("under_load", 1))  # the config written again, as it was
        client.load_model("under_load")
        assert repo.counts("under_load") == (4, 3)  # an update that changes no instance
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    # An instance added by an update saw the new groups in its config.
    seen = [line.split() for line in repo.events.joinpath("events").read_text().splitlines()]
    assert [int(words[2]) for words in seen if words[:1] == ["initialize"] and words[1].startswith("under_load")] == [1, 2, 4, 4]
    config = client.get_model_config("under_load", as_json=True)["config"]
    assert [group["count"] for group in config["instance_group"]] == [1]
    client.load_model("under_load")  # nothing in the folder changed: as Triton, a load reloads the model
    assert repo.counts("under_load") == (5, 4)
    client.unload_model("under_load")
    assert repo.counts("under_load") == (5, 5)


def test_a_changed_model_file_or_another_setting_reloads_the_whole_model(served) -> None:
    _, repo, client = served
    client.load_model("reloads")
    model_file = repo.root / "reloads" / "1" / "model.py"
    model_file.write_text(model_file.read_text() + "\n# changed\n")
    repo.write("reloads", _config("reloads", 2))
    client.load_model("reloads")
    assert repo.counts("reloads") == (3, 1)  # two new instances of the new file; the old one finalized
    repo.write("reloads", _config("reloads", 2, 'parameters { key: "mode" value: { string_value: "other" } }'))
    client.load_model("reloads")
    assert repo.counts("reloads") == (5, 3)
    _infer(client, "reloads")


def test_the_load_api_config_updates_instances_in_place(served) -> None:
    _, repo, client = served
    client.load_model("by_api")
    config = client.get_model_config("by_api", as_json=True)["config"]
    config["instance_group"][0]["count"] = 3
    client.load_model("by_api", config=json.dumps(config))
    assert repo.counts("by_api") == (3, 0)
    _infer(client, "by_api")


def test_a_failed_update_keeps_the_instances_that_served(served) -> None:
    _, repo, client = served
    client.load_model("refused")
    repo.write("refused", "--- not a config ---")
    with pytest.raises(InferenceServerException):
        client.load_model("refused")
    (repo.events / "fail_initialize").touch()
    try:
        repo.write("refused", _config("refused", 3))
        with pytest.raises(InferenceServerException, match="initialize refused"):
            client.load_model("refused")
    finally:
        (repo.events / "fail_initialize").unlink()
    assert repo.counts("refused") == (1, 0)
    assert client.is_model_ready("refused")
    assert [g["count"] for g in client.get_model_config("refused", as_json=True)["config"]["instance_group"]] == [1]
    _infer(client, "refused")
    client.load_model("refused")  # the same change again, now that instances can start
    assert repo.counts("refused") == (3, 0)


def test_a_removed_instance_keeps_its_sequence_until_the_sequence_ends(served) -> None:
    _, repo, client = served
    sequence = "sequence_batching { max_sequence_idle_microseconds: 60000000 direct { } }"
    repo.write("sequences", _config("sequences", 2, sequence))
    client.load_model("sequences")
    first = _infer(client, "sequences", sequence_id=1, sequence_start=True)
    second = _infer(client, "sequences", sequence_id=2, sequence_start=True)
    assert first != second  # one sequence per instance
    repo.write("sequences", _config("sequences", 1, sequence))
    client.load_model("sequences")  # returns while the removed instance still holds its sequence
    assert repo.counts("sequences") == (2, 0)
    assert _infer(client, "sequences", sequence_id=2) == second
    assert _infer(client, "sequences", sequence_id=1, sequence_end=True) == first
    # A new sequence goes to the instance kept, never to the one leaving.
    assert _infer(client, "sequences", sequence_id=3, sequence_start=True, sequence_end=True) == first
    assert repo.counts("sequences") == (2, 0)
    assert _infer(client, "sequences", sequence_id=2, sequence_end=True) == second
    _wait_for(lambda: repo.counts("sequences") == (2, 1))


def _wait_for(condition, seconds: float = 10) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_polled_config_change_of_instance_group_updates_in_place(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "models", tmp_path)
    repo.write("polled", _config("polled", 1))
    server = start_nereid(repo.root, "--model-control-mode=poll", "--repository-poll-secs=1", env={"INSTANCE_EVENTS": str(tmp_path)})
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        repo.write("polled", _config("polled", 2))
        _wait_for(lambda: repo.counts("polled") == (2, 0))
        _infer(client, "polled")
        repo.write("polled", _config("polled", 1))
        _wait_for(lambda: repo.counts("polled") == (2, 1))
        assert [g["count"] for g in client.get_model_config("polled", as_json=True)["config"]["instance_group"]] == [1]
        client.close()
    finally:
        server.stop()
