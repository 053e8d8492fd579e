"""Differential tests: Nereid and real Triton 2.51 give the same model-independent answers.

Both servers index the same repository of Python-backend models (the only kind real Triton runs here) and
are asked the same questions over HTTP and gRPC: status codes, gRPC codes, messages and JSON shapes must
match. Where Nereid differs on purpose, the test says so next to the assertion that encodes it.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.differential.pair import Pair, start_pair

pytestmark = pytest.mark.differential



_ADD_SUB_CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_ADD_SUB_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def _model(repo: Path, name: str, *, backend: str = "python", config: str | None = None, versions: bool = True) -> None:
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config if config is not None else _ADD_SUB_CONFIG.format(name=name, backend=backend))
    if versions:
        (folder / "1").mkdir()
        (folder / "1" / "model.py").write_text(_ADD_SUB_MODEL)


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Both servers in explicit mode over one repository; nothing is loaded at start."""
    repo = tmp_path_factory.mktemp("differential") / "repo"
    repo.mkdir()
    _model(repo, "add_sub")
    _model(repo, "idle")  # never loaded by any test
    _model(repo, "bad_backend", backend="nosuch")
    # No version folder (and a backend nobody has, so the answer does not depend on installed backends).
    _model(repo, "no_versions", backend="nosuch", versions=False)
    _model(repo, "broken_config", config='name: "broken_config" backend: "python" max_batch_size: oops\n')
    pair = start_pair(repo, "--model-control-mode=explicit")
    yield pair
    pair.close()


@pytest.fixture(scope="module", params=["none", "poll"])
def quiet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Both servers over an empty repository, in a control mode other than explicit; nothing ever fails."""
    repo = tmp_path_factory.mktemp(f"quiet-{request.param}") / "repo"
    repo.mkdir()
    pair = start_pair(repo, f"--model-control-mode={request.param}")
    yield pair
    pair.close()


@pytest.fixture
def shm_key() -> Iterator[str]:
    """A 64-byte POSIX shared-memory object both servers can map."""
    key = f"nereid_difftest_{os.getpid()}"
    path = Path("/dev/shm") / key
    path.write_bytes(bytes(64))
    yield key
    path.unlink(missing_ok=True)


# -- server metadata and health --------------------------------------------------------------------


def test_server_metadata_has_tritons_keys_name_and_extensions(quiet: Pair) -> None:
    triton, nereid = quiet.http("GET", "/v2")
    assert triton.status == nereid.status == 200
    assert triton.content_type == nereid.content_type
    t, n = triton.json(), nereid.json()
    assert set(t) == set(n) == {"name", "version", "extensions"}
    assert n["name"] == t["name"] == "triton"
    assert n["extensions"] == t["extensions"]
    # Deliberate: Nereid reports its own version, not Triton's.
    assert isinstance(n["version"], str) and n["version"]

    t_rpc, n_rpc = quiet.rpc("ServerMetadata", pb.ServerMetadataRequest())
    assert t_rpc.code == n_rpc.code == "OK"
    assert n_rpc.response.name == t_rpc.response.name
    assert list(n_rpc.response.extensions) == list(t_rpc.response.extensions) == t["extensions"]


def test_health_endpoints_answer_alike(quiet: Pair) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        triton, nereid = quiet.http("GET", path)
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert triton.status == 200
    for method, request in (("ServerLive", pb.ServerLiveRequest()), ("ServerReady", pb.ServerReadyRequest())):
        t_rpc, n_rpc = quiet.rpc(method, request)
        assert t_rpc.code == n_rpc.code == "OK"
        assert n_rpc.response == t_rpc.response
    for service in ("", "inference"):
        assert quiet.health(service) == ("SERVING", "SERVING")


def test_statistics_of_all_models_is_empty_alike(quiet: Pair) -> None:
    triton, nereid = quiet.http("GET", "/v2/models/stats")
    assert (nereid.status, nereid.content_type, nereid.json()) == (triton.status, triton.content_type, triton.json())
    assert triton.json() == {"model_stats": []}
    t_rpc, n_rpc = quiet.rpc("ModelStatistics", pb.ModelStatisticsRequest())
    assert t_rpc.code == n_rpc.code == "OK"
    assert n_rpc.response == t_rpc.response


# -- routes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("GET", "/v2/nope"),
        ("GET", "/v2/"),
        ("GET", "/v2/health"),
        ("GET", "/v2/models"),
        ("GET", "/v2/models/idle/"),
        ("GET", "/v2/models//config"),
        ("GET", "/v2/models/idle/bogus"),
        ("GET", "/v2/models/idle/versions"),
        ("GET", "/v2/models/idle/versions/abc"),
        ("GET", "/v2/models/idle/versions/-1/config"),
        ("GET", "/v2/models/idle/versions//config"),
        ("GET", "/v2/models/idle/versions/1/trace/setting"),
        ("POST", "/v2/repository/nope"),
        ("GET", "/v2/systemsharedmemory/bogus"),
    ],
)
def test_unknown_routes_are_404_alike(explicit: Pair, method: str, path: str) -> None:
    triton, nereid = explicit.http(method, path)
    assert triton.status == 404
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2"),
        ("PUT", "/v2"),
        ("POST", "/v2/health/live"),
        ("DELETE", "/v2/health/ready"),
        ("POST", "/v2/models/idle"),
        ("PUT", "/v2/models/idle/versions/1"),
        ("POST", "/v2/models/idle/ready"),
        ("PUT", "/v2/models/idle/config"),
        ("POST", "/v2/models/idle/stats"),
        ("POST", "/v2/models/stats"),
        ("GET", "/v2/models/idle/infer"),
        ("GET", "/v2/models/idle/versions/1/infer"),
        ("GET", "/v2/models/idle/generate"),
        ("PUT", "/v2/models/idle/versions/1/generate_stream"),
        ("GET", "/v2/repository/index"),
        ("GET", "/v2/repository/models/idle/load"),
        ("GET", "/v2/repository/models/idle/unload"),
        ("DELETE", "/v2/logging"),
        ("PUT", "/v2/trace/setting"),
        ("PUT", "/v2/models/idle/trace/setting"),
        ("POST", "/v2/systemsharedmemory/status"),
        ("GET", "/v2/systemsharedmemory/region/r/register"),
        ("GET", "/v2/cudasharedmemory/region/r/unregister"),
    ],
)
def test_wrong_method_on_a_known_route_is_405_alike(explicit: Pair, method: str, path: str) -> None:
    triton, nereid = explicit.http(method, path)
    assert triton.status == 405
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)


# -- unknown models and versions -------------------------------------------------------------------

_MODEL_PATHS = ["", "/versions/1", "/config", "/versions/1/config"]


@pytest.mark.parametrize("suffix", [*_MODEL_PATHS[1:], "/ready", "/stats"])
def test_a_model_named_stats_is_a_model_past_the_statistics_route_alike(explicit: Pair, suffix: str) -> None:
    triton, nereid = explicit.http("GET", f"/v2/models/stats{suffix}")
    assert triton.status in (400, 404)
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)


@pytest.mark.parametrize("model", ["nope", "idle"])
@pytest.mark.parametrize("suffix", _MODEL_PATHS)
def test_metadata_and_config_of_an_unknown_or_unloaded_model_are_404_alike(explicit: Pair, model: str, suffix: str) -> None:
    triton, nereid = explicit.http("GET", f"/v2/models/{model}{suffix}")
    assert triton.status == 404
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
    assert nereid.error == f"Request for unknown model: '{model}' is not found"


@pytest.mark.parametrize("model", ["nope", "idle"])
@pytest.mark.parametrize("version", ["", "1"])
def test_ready_and_stats_of_an_unknown_or_unloaded_model_fail_alike(explicit: Pair, model: str, version: str) -> None:
    prefix = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    triton, nereid = explicit.http("GET", prefix + "/ready")
    assert triton.status == 400
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
    triton, nereid = explicit.http("GET", prefix + "/stats")
    assert triton.status == 400
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
    assert nereid.error == f"requested model '{model}' is not available"

    t_rpc, n_rpc = explicit.rpc("ModelReady", pb.ModelReadyRequest(name=model, version=version))
    assert t_rpc.code == n_rpc.code == "OK"
    assert t_rpc.response.ready is n_rpc.response.ready is False
    t_rpc, n_rpc = explicit.rpc("ModelStatistics", pb.ModelStatisticsRequest(name=model, version=version))
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details) == ("INVALID_ARGUMENT", nereid.error)


@pytest.mark.parametrize("model", ["nope", "idle"])
@pytest.mark.parametrize("version", ["", "1"])
def test_metadata_config_and_infer_of_an_unknown_model_over_grpc_are_not_found_alike(
    explicit: Pair, model: str, version: str
) -> None:
    for method, request in (
        ("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version)),
        ("ModelConfig", pb.ModelConfigRequest(name=model, version=version)),
        ("ModelInfer", pb.ModelInferRequest(model_name=model, model_version=version)),
    ):
        t_rpc, n_rpc = explicit.rpc(method, request)
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details), method
        assert t_rpc.code == "NOT_FOUND"


@pytest.mark.parametrize("model", ["nope", "idle"])
@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (json.dumps({"inputs": []}).encode(), {}),
        (b"{not json", {}),
        (b"{}", {"Inference-Header-Content-Length": "50"}),
        (b"{}", {"Inference-Header-Content-Length": "x"}),
    ],
)
def test_infer_on_an_unknown_model_is_404_before_the_body_is_read(
    explicit: Pair, model: str, body: bytes, headers: dict[str, str]
) -> None:
    for path in (f"/v2/models/{model}/infer", f"/v2/models/{model}/versions/1/infer"):
        triton, nereid = explicit.http("POST", path, data=body, headers=headers)
        assert triton.status == 404
        assert triton.content_type == "text/plain"  # this one error; Triton's other /infer errors are JSON
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)


def test_a_version_that_is_not_a_number_is_invalid_over_grpc_alike(explicit: Pair) -> None:
    for model in ("nope", "idle"):
        for method, request in (
            ("ModelReady", pb.ModelReadyRequest(name=model, version="abc")),
            ("ModelMetadata", pb.ModelMetadataRequest(name=model, version="abc")),
            ("ModelConfig", pb.ModelConfigRequest(name=model, version="abc")),
            ("ModelStatistics", pb.ModelStatisticsRequest(name=model, version="abc")),
            ("ModelInfer", pb.ModelInferRequest(model_name=model, model_version="abc")),
        ):
            t_rpc, n_rpc = explicit.rpc(method, request)
            assert t_rpc.code == n_rpc.code == "INVALID_ARGUMENT", method
            expected = "failed to get model version from specified version string 'abc'"
            assert t_rpc.details.startswith(expected) and n_rpc.details.startswith(expected), method


# -- the repository API ----------------------------------------------------------------------------


def test_repository_index_lists_an_unloaded_model_by_name_only(explicit: Pair) -> None:
    assert explicit.index_entries("idle") == ([{"name": "idle"}], [{"name": "idle"}])
    triton, nereid = explicit.http("POST", "/v2/repository/index", {"ready": True})
    assert triton.status == nereid.status == 200
    assert [e for e in nereid.json() if e["name"] == "idle"] == [e for e in triton.json() if e["name"] == "idle"] == []
    t_rpc, n_rpc = explicit.rpc("RepositoryIndex", pb.RepositoryIndexRequest())
    assert t_rpc.code == n_rpc.code == "OK"
    t_idle = [m for m in t_rpc.response.models if m.name == "idle"]
    n_idle = [m for m in n_rpc.response.models if m.name == "idle"]
    assert n_idle == t_idle and len(t_idle) == 1


def test_load_of_an_unknown_model_fails_alike_and_leaves_no_trace(explicit: Pair) -> None:
    for body in (None, {"parameters": {"config": json.dumps({"backend": "python"})}}):
        triton, nereid = explicit.http("POST", "/v2/repository/models/nope/load", body)
        assert triton.status == 500
        assert (nereid.status, nereid.body) == (triton.status, triton.body)
        assert nereid.error == "failed to load 'nope', failed to poll from model repository"
    t_rpc, n_rpc = explicit.rpc("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope"))
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details) == ("INTERNAL", nereid.error)
    assert explicit.index_entries("nope") == ([], [])
    triton, nereid = explicit.http("GET", "/v2/models/nope")
    assert (nereid.status, nereid.body) == (triton.status, triton.body)
    assert nereid.error == "Request for unknown model: 'nope' is not found"


def test_unload_of_an_unknown_model_succeeds_alike(explicit: Pair) -> None:
    for body in (None, {"parameters": {"unload_dependents": True}}):
        triton, nereid = explicit.http("POST", "/v2/repository/models/nope/unload", body)
        assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
    t_rpc, n_rpc = explicit.rpc("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="nope"))
    assert t_rpc.code == n_rpc.code == "OK"
    assert explicit.index_entries("nope") == ([], [])


def test_load_and_unload_are_refused_alike_outside_explicit_mode(quiet: Pair) -> None:
    for action in ("load", "unload"):
        triton, nereid = quiet.http("POST", f"/v2/repository/models/nope/{action}")
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert triton.status == 503
        assert nereid.error == "explicit model load / unload is not allowed if polling is enabled"
    for method, request in (
        ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope")),
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="nope")),
    ):
        t_rpc, n_rpc = quiet.rpc(method, request)
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
        assert t_rpc.code == "UNAVAILABLE"


def test_a_version_that_fails_to_load_is_reported_alike(explicit: Pair) -> None:
    """A config naming a backend nobody has: the version is UNAVAILABLE and requests for it are 503."""
    triton, nereid = explicit.http("POST", "/v2/repository/models/bad_backend/load")
    assert triton.status == nereid.status == 400
    expected = "load failed for model 'bad_backend': version 1 is at UNAVAILABLE state: "
    assert triton.error.startswith(expected) and nereid.error.startswith(expected)
    for answer in (triton, nereid):
        assert "unable to find backend" in answer.error and "'nosuch'" in answer.error
    t_rpc, n_rpc = explicit.rpc("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="bad_backend"))
    assert t_rpc.code == n_rpc.code == "INVALID_ARGUMENT"

    t_entries, n_entries = explicit.index_entries("bad_backend")
    assert len(t_entries) == len(n_entries) == 1
    assert set(n_entries[0]) == set(t_entries[0]) == {"name", "version", "state", "reason"}
    assert (n_entries[0]["version"], n_entries[0]["state"]) == (t_entries[0]["version"], t_entries[0]["state"]) == (
        "1",
        "UNAVAILABLE",
    )

    for path in ("/v2/models/bad_backend/versions/1", "/v2/models/bad_backend/versions/1/config"):
        triton, nereid = explicit.http("GET", path)
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert nereid.error == "Request for unknown model: 'bad_backend' version 1 is not at ready state"
        assert triton.status == 503
    triton, nereid = explicit.http("POST", "/v2/models/bad_backend/versions/1/infer", {"inputs": []})
    assert (nereid.status, nereid.body) == (triton.status, triton.body)
    for path in ("/v2/models/bad_backend", "/v2/models/bad_backend/config"):
        triton, nereid = explicit.http("GET", path)
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert nereid.error == "Request for unknown model: 'bad_backend' has no available versions"
    triton, nereid = explicit.http("GET", "/v2/models/bad_backend/versions/1/ready")
    assert (nereid.status, nereid.body) == (triton.status, triton.body)
    t_rpc, n_rpc = explicit.rpc("ModelMetadata", pb.ModelMetadataRequest(name="bad_backend", version="1"))
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
    assert t_rpc.code == "UNAVAILABLE"


def test_a_model_without_versions_fails_to_load_alike(explicit: Pair) -> None:
    triton, nereid = explicit.http("POST", "/v2/repository/models/no_versions/load")
    assert triton.status == nereid.status == 400
    expected = "at least one version must be available under the version policy of model 'no_versions'"
    assert expected in triton.error and expected in nereid.error
    t_entries, n_entries = explicit.index_entries("no_versions")
    # Deliberate: Triton drops the model from the index; Nereid shows it UNAVAILABLE with the reason.
    assert t_entries == []
    assert n_entries == [{"name": "no_versions", "state": "UNAVAILABLE", "reason": n_entries[0]["reason"]}]
    assert expected in n_entries[0]["reason"]


def test_a_config_that_does_not_parse_is_a_clear_400_in_nereid(explicit: Pair) -> None:
    triton, nereid = explicit.http("POST", "/v2/repository/models/broken_config/load")
    # Deliberate: Triton answers 500 "failed to poll" and indexes the model by name only; the issue asks
    # for bad input to be a 400 that says what is wrong, and for the index to show UNAVAILABLE with it.
    assert triton.status == 500
    assert triton.error == "failed to load 'broken_config', failed to poll from model repository"
    assert nereid.status == 400
    assert "config.pbtxt" in nereid.error and "oops" in nereid.error
    t_entries, n_entries = explicit.index_entries("broken_config")
    assert t_entries == [{"name": "broken_config"}]
    assert n_entries == [{"name": "broken_config", "state": "UNAVAILABLE", "reason": nereid.error}]


def test_index_states_before_and_after_load_and_unload_match(explicit: Pair) -> None:
    assert explicit.index_entries("add_sub") == ([{"name": "add_sub"}], [{"name": "add_sub"}])
    try:
        triton, nereid = explicit.http("POST", "/v2/repository/models/add_sub/load")
        assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
        ready = {"name": "add_sub", "version": "1", "state": "READY"}
        assert explicit.index_entries("add_sub") == ([ready], [ready])
        triton, nereid = explicit.http("POST", "/v2/repository/index", {"ready": True})
        assert ready in triton.json() and ready in nereid.json()

        triton, nereid = explicit.http("GET", "/v2/models/add_sub/ready")
        assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
        triton, nereid = explicit.http("GET", "/v2/models/add_sub")
        assert triton.status == nereid.status == 200
        assert set(nereid.json()) == set(triton.json())
        for key in ("name", "versions", "inputs", "outputs"):
            assert nereid.json()[key] == triton.json()[key], key
        for suffix, status in (("/versions/2", 404), ("/versions/2/config", 404), ("/versions/2/stats", 400)):
            triton, nereid = explicit.http("GET", "/v2/models/add_sub" + suffix)
            assert (nereid.status, nereid.body) == (triton.status, triton.body)
            assert triton.status == status
        triton, nereid = explicit.http("GET", "/v2/models/add_sub/trace/setting")
        assert (nereid.status, nereid.json()) == (triton.status, triton.json())
        triton, nereid = explicit.http("POST", "/v2/models/add_sub/infer", data=b"{not json")
        # Deliberate: Triton answers malformed JSON with 500; the issue asks for 400 for bad input.
        assert (triton.status, nereid.status) == (500, 400)
        assert nereid.error.startswith("failed to parse the request JSON buffer")

        triton, nereid = explicit.http("POST", "/v2/repository/models/add_sub/unload")
        assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
        unloaded = {"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        # Triton answers the unload before the Python stub has exited: poll its index until it says so.
        deadline = time.monotonic() + 30
        while explicit.index_entries("add_sub")[0] != [unloaded] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert explicit.index_entries("add_sub") == ([unloaded], [unloaded])
        triton, nereid = explicit.http("GET", "/v2/models/add_sub")
        assert (nereid.status, nereid.body) == (triton.status, triton.body)
        assert nereid.error == "Request for unknown model: 'add_sub' has no available versions"
        triton, nereid = explicit.http("GET", "/v2/models/add_sub/versions/1")
        assert (nereid.status, nereid.body) == (triton.status, triton.body)
        assert triton.status == 503
        triton, nereid = explicit.http("GET", "/v2/models/add_sub/trace/setting")
        assert (nereid.status, nereid.body) == (triton.status, triton.body)
    finally:
        explicit.http("POST", "/v2/repository/models/add_sub/unload")


# -- malformed requests to model-independent endpoints ---------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/idle/load",
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/systemsharedmemory/region/r/register",
    ],
)
def test_malformed_json_is_400_in_nereid_where_triton_says_500(explicit: Pair, path: str) -> None:
    triton, nereid = explicit.http("POST", path, data=b"{not json")
    # Deliberate: Triton answers malformed JSON with HTTP 500; the issue asks for 400 for bad input.
    assert (triton.status, nereid.status) == (500, 400)
    prefix = "failed to parse the request JSON buffer"
    assert triton.error.startswith(prefix) and nereid.error.startswith(prefix)
    assert explicit.index_entries("idle") == ([{"name": "idle"}], [{"name": "idle"}])


def test_malformed_json_to_unload_is_400_in_nereid_where_triton_ignores_the_body(explicit: Pair) -> None:
    triton, nereid = explicit.http("POST", "/v2/repository/models/idle/unload", data=b"{not json")
    # Deliberate: Triton does not read a malformed unload body and answers 200; bad input is a 400 here.
    assert (triton.status, nereid.status) == (200, 400)
    assert nereid.error.startswith("failed to parse the request JSON buffer")
    assert explicit.index_entries("idle") == ([{"name": "idle"}], [{"name": "idle"}])


# -- logging settings ------------------------------------------------------------------------------


def _log_settings(response: Any) -> dict[str, tuple[str, Any]]:
    return {
        key: (value.WhichOneof("parameter_choice"), getattr(value, value.WhichOneof("parameter_choice")))
        for key, value in response.settings.items()
    }


def test_logging_settings_have_the_same_shape_and_accept_the_same_changes(explicit: Pair) -> None:
    triton, nereid = explicit.http("GET", "/v2/logging")
    assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "application/json")
    defaults = triton.json()
    assert nereid.json() == defaults
    t_rpc, n_rpc = explicit.rpc("LogSettings", pb.LogSettingsRequest())
    assert t_rpc.code == n_rpc.code == "OK"
    assert _log_settings(n_rpc.response) == _log_settings(t_rpc.response)

    for change in ({}, {"no_such_setting": 1}):  # unknown keys are ignored
        triton, nereid = explicit.http("POST", "/v2/logging", change)
        assert (nereid.status, nereid.json()) == (triton.status, triton.json()) == (200, defaults)
    try:
        triton, nereid = explicit.http("POST", "/v2/logging", {"log_verbose_level": 1, "log_info": False})
        assert (nereid.status, nereid.json()) == (triton.status, triton.json())
        assert triton.json()["log_verbose_level"] == 1 and triton.json()["log_info"] is False
    finally:
        triton, nereid = explicit.http("POST", "/v2/logging", {"log_verbose_level": 0, "log_info": True})
    assert nereid.json() == triton.json() == defaults

    triton, nereid = explicit.http("POST", "/v2/logging", {"log_file": "/tmp/elsewhere.log"})
    assert triton.status == nereid.status == 501
    assert "log file" in triton.error and "log file" in nereid.error

    request = pb.LogSettingsRequest()
    request.settings["log_info"].uint32_param = 1
    t_rpc, n_rpc = explicit.rpc("LogSettings", request)
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details) == ("INVALID_ARGUMENT", "expect boolean for 'log_info'")


@pytest.mark.parametrize(
    "change", [{"log_verbose_level": -1}, {"log_info": "yes"}, {"log_warning": 1}, {"log_format": "bogus"}]
)
def test_a_logging_value_of_the_wrong_kind_is_400_in_nereid(explicit: Pair, change: dict[str, Any]) -> None:
    triton, nereid = explicit.http("POST", "/v2/logging", change)
    # Deliberate: Triton answers these with 500 (a JSON type error) or 503 (bad log format); bad input is 400 here.
    assert triton.status in (500, 503)
    assert nereid.status == 400
    assert next(iter(change)).replace("_", " ") in nereid.error.replace("_", " ")
    triton, nereid = explicit.http("GET", "/v2/logging")
    assert nereid.json() == triton.json()


# -- trace settings --------------------------------------------------------------------------------


def _trace_settings(response: Any) -> dict[str, list[str]]:
    return {key: list(value.value) for key, value in response.settings.items()}


def test_trace_settings_have_the_same_shape_and_accept_the_same_changes(explicit: Pair) -> None:
    triton, nereid = explicit.http("GET", "/v2/trace/setting")
    assert (nereid.status, nereid.content_type) == (triton.status, triton.content_type) == (200, "application/json")
    defaults = triton.json()
    assert nereid.json() == defaults
    t_rpc, n_rpc = explicit.rpc("TraceSetting", pb.TraceSettingRequest())
    assert t_rpc.code == n_rpc.code == "OK"
    assert _trace_settings(n_rpc.response) == _trace_settings(t_rpc.response)
    try:
        for change in (
            {"trace_rate": "10", "trace_count": "7", "log_frequency": "3"},
            {"no_such_setting": "1"},  # ignored
            {"trace_mode": "opentelemetry"},  # cannot be changed at run time: ignored
            {"trace_level": ["OFF"]},
            {"trace_level": []},
            {"trace_rate": None},  # back to the default
        ):
            triton, nereid = explicit.http("POST", "/v2/trace/setting", change)
            assert (nereid.status, nereid.json()) == (triton.status, triton.json()), change
            assert triton.status == 200
        request = pb.TraceSettingRequest()
        request.settings["trace_count"].value.append("5")
        t_rpc, n_rpc = explicit.rpc("TraceSetting", request)
        assert t_rpc.code == n_rpc.code == "OK"
        assert _trace_settings(n_rpc.response) == _trace_settings(t_rpc.response)
        assert _trace_settings(t_rpc.response)["trace_count"] == ["5"]
    finally:
        reset = {"trace_rate": None, "trace_count": None, "log_frequency": None, "trace_level": None}
        explicit.http("POST", "/v2/trace/setting", reset)
    triton, nereid = explicit.http("GET", "/v2/trace/setting")
    assert nereid.json() == triton.json() == defaults


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_count": "abc"}, "Unable to parse 'trace_count', got: abc"),
        ({"log_frequency": "x"}, "Unable to parse 'log_frequency', got: x"),
        ({"trace_count": "-5"}, "Unable to parse 'trace_count'. Expecting value >= -1"),
        ({"trace_level": ["TIMESTAMPS"]}, "Attempting to set invalid trace setting :trace file name is not given"),
    ],
)
def test_an_invalid_trace_setting_is_400_alike(explicit: Pair, change: dict[str, Any], message: str) -> None:
    triton, nereid = explicit.http("POST", "/v2/trace/setting", change)
    assert triton.status == nereid.status == 400
    assert triton.error.startswith(message) and nereid.error.startswith(message)
    triton, nereid = explicit.http("GET", "/v2/trace/setting")
    assert nereid.json() == triton.json()


def test_trace_file_cannot_be_changed_over_the_network_alike(explicit: Pair) -> None:
    triton, nereid = explicit.http("POST", "/v2/trace/setting", {"trace_file": "/tmp/trace.json"})
    assert (nereid.status, nereid.body) == (triton.status, triton.body)
    assert triton.status == 501


def test_grpc_trace_setting_wants_one_value_for_a_scalar_alike(explicit: Pair) -> None:
    request = pb.TraceSettingRequest()
    request.settings["trace_rate"].value.extend(["1", "2"])
    t_rpc, n_rpc = explicit.rpc("TraceSetting", request)
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
    assert t_rpc.code == "INVALID_ARGUMENT"


def test_trace_settings_of_an_unknown_or_unloaded_model_are_400_alike(explicit: Pair) -> None:
    for model in ("nope", "idle"):
        for method in ("GET", "POST"):
            triton, nereid = explicit.http(method, f"/v2/models/{model}/trace/setting", {} if method == "POST" else None)
            assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
            assert nereid.error == f"Request for unknown model : {model}"
        t_rpc, n_rpc = explicit.rpc("TraceSetting", pb.TraceSettingRequest(model_name=model))
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details) == (
            "INVALID_ARGUMENT",
            f"Request for unknown model : {model}",
        )


# -- shared memory ---------------------------------------------------------------------------------


def test_shared_memory_status_and_unknown_regions_answer_alike(explicit: Pair) -> None:
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        triton, nereid = explicit.http("GET", f"/v2/{kind}/status")
        assert (nereid.status, nereid.content_type, nereid.json()) == (triton.status, triton.content_type, triton.json())
        assert triton.json() == []
        triton, nereid = explicit.http("GET", f"/v2/{kind}/region/nope/status")
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert triton.status == 404
        for path in (f"/v2/{kind}/region/nope/unregister", f"/v2/{kind}/unregister"):
            triton, nereid = explicit.http("POST", path)
            assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
    for method, request in (
        ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="nope")),
        ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name="nope")),
    ):
        t_rpc, n_rpc = explicit.rpc(method, request)
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
        assert t_rpc.code == "NOT_FOUND"
    for method, request in (
        ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
        ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
        ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="nope")),
        ("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name="nope")),
    ):
        t_rpc, n_rpc = explicit.rpc(method, request)
        assert t_rpc.code == n_rpc.code == "OK"
        assert n_rpc.response == t_rpc.response


def test_registering_an_unknown_shared_memory_key_fails_alike(explicit: Pair) -> None:
    body = {"key": "/nereid_difftest_no_such_key", "offset": 0, "byte_size": 16}
    triton, nereid = explicit.http("POST", "/v2/systemsharedmemory/region/r/register", body)
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
    assert triton.status == 500
    request = pb.SystemSharedMemoryRegisterRequest(name="r", key=body["key"], offset=0, byte_size=16)
    t_rpc, n_rpc = explicit.rpc("SystemSharedMemoryRegister", request)
    assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
    assert t_rpc.code == "INTERNAL"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v2/systemsharedmemory/region/r/register", {"offset": 0, "byte_size": 16}),
        ("/v2/systemsharedmemory/region/r/register", {"key": "k", "offset": 0}),
        ("/v2/systemsharedmemory/register", {"key": "k", "offset": 0, "byte_size": 16}),
    ],
)
def test_an_incomplete_shared_memory_registration_is_400_alike(explicit: Pair, path: str, body: dict[str, Any]) -> None:
    triton, nereid = explicit.http("POST", path, body)
    assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
    assert triton.status == 400


def test_shared_memory_registration_conflicts_and_bounds_answer_alike(explicit: Pair, shm_key: str) -> None:
    try:
        triton, nereid = explicit.http(
            "POST", "/v2/systemsharedmemory/region/r/register", {"key": shm_key, "offset": 0, "byte_size": 1000}
        )
        assert triton.status == nereid.status == 400
        prefix = "failed to register shared memory region 'r'"
        assert triton.error.startswith(prefix) and nereid.error.startswith(prefix)

        body = {"key": shm_key, "offset": 0, "byte_size": 64}
        triton, nereid = explicit.http("POST", "/v2/systemsharedmemory/region/r/register", body)
        assert (nereid.status, nereid.body) == (triton.status, triton.body) == (200, "")
        triton, nereid = explicit.http("GET", "/v2/systemsharedmemory/status")
        assert nereid.json() == triton.json() == [{"name": "r", "key": shm_key, "offset": 0, "byte_size": 64}]
        triton, nereid = explicit.http("POST", "/v2/systemsharedmemory/region/r/register", body)
        assert (nereid.status, nereid.content_type, nereid.body) == (triton.status, triton.content_type, triton.body)
        assert triton.status == 400
        request = pb.SystemSharedMemoryRegisterRequest(name="r", key=shm_key, offset=0, byte_size=64)
        t_rpc, n_rpc = explicit.rpc("SystemSharedMemoryRegister", request)
        assert (n_rpc.code, n_rpc.details) == (t_rpc.code, t_rpc.details)
        assert t_rpc.code == "ALREADY_EXISTS"
        t_rpc, n_rpc = explicit.rpc("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
        assert n_rpc.response == t_rpc.response
    finally:
        explicit.http("POST", "/v2/systemsharedmemory/unregister")
    triton, nereid = explicit.http("GET", "/v2/systemsharedmemory/status")
    assert nereid.json() == triton.json() == []


def test_cuda_shared_memory_registration_is_refused_by_nereid_as_unsupported(explicit: Pair) -> None:
    handle = base64.b64encode(bytes(range(64))).decode()
    body = {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 16}
    triton, nereid = explicit.http("POST", "/v2/cudasharedmemory/region/r/register", body)
    # Deliberate: Triton tries the handle and calls it invalid (400); Nereid has no CUDA and says so (501).
    assert triton.status == 400
    assert nereid.status == 501 and "CUDA" in nereid.error
    request = pb.CudaSharedMemoryRegisterRequest(name="r", raw_handle=bytes(range(64)), device_id=0, byte_size=16)
    t_rpc, n_rpc = explicit.rpc("CudaSharedMemoryRegister", request)
    assert (t_rpc.code, n_rpc.code) == ("INVALID_ARGUMENT", "UNIMPLEMENTED")
    triton, nereid = explicit.http("GET", "/v2/cudasharedmemory/status")
    assert nereid.json() == triton.json() == []
