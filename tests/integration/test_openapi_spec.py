"""docs/openapi.yaml is true: every operation in it is a route of the HTTP port and every route answers only where
the spec says, and schemathesis, generating requests from it against a real server, gets no 5xx but a
well-formed model error and always an answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import strategies as st

from tests.fuzz_support import DERANDOMIZE, FUZZ_MODELS, assert_well_formed, fuzz_repository, load_spec, spec_operations
from tests.servers import RunningServer, start_nereid

_ROUTE_MISS_BODIES = (b'{"error":"Not Found"}',)
_METHODS = ("GET", "POST", "PUT", "DELETE")
# Every path segment the routes know, plus a model, a version and names that exist nowhere.
_VOCABULARY = [
    "v2", "models", "simple", "versions", "1", "x1", "ready", "config", "stats", "infer", "generate",
    "generate_stream", "trace", "setting", "health", "live", "repository", "index", "load", "unload", "logging",
    "systemsharedmemory", "cudasharedmemory", "region", "r0", "status", "register", "unregister", "v1",
    "completions", "chat", "nosuch",
]
_SAMPLE_VALUES = {"model_name": "simple", "model_version": "1", "region_name": "r0", "model_id": "simple"}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = fuzz_repository(tmp_path_factory.mktemp("fuzz_repo"))
    server = start_nereid(repo, "--log-verbose=0", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0, server.log()


def _routed(response: requests.Response) -> bool:
    """False for the answer to a path or method no route takes (404 Not Found, 405, the OpenAI API's 404)."""
    if response.status_code == 405:
        return False
    if response.status_code == 404:
        return response.content not in _ROUTE_MISS_BODIES and b"no OpenAI route" not in response.content
    return True


def _send(session: requests.Session, base: str, method: str, path: str) -> requests.Response:
    # A body no operation accepts, so that nothing changes the server's state (no load, no region, no setting).
    return session.request(method, base + path, data=b"\x00", timeout=30)


def test_openapi_spec_is_valid_openapi() -> None:
    schema = schemathesis.openapi.from_dict(load_spec())
    operations = [op for op in schema.get_all_operations()]
    assert len(operations) == len(spec_operations(load_spec()))
    assert all(result.ok() for result in operations), [r for r in operations if not r.ok()]


def test_every_operation_in_the_spec_is_a_route(fuzz_server: RunningServer) -> None:
    session = requests.Session()
    missing = []
    for method, template, _ in spec_operations(load_spec()):
        path = re.sub(r"\{(\w+)\}", lambda m: _SAMPLE_VALUES[m.group(1)], template)
        response = _send(session, fuzz_server.base, method, path)
        if not _routed(response):
            missing.append(f"{method} {template}: {response.status_code} {response.content[:80]!r}")
    assert not missing, "operations in docs/openapi.yaml that the server does not route:\n" + "\n".join(missing)


def _in_spec(operations: list[tuple[str, str, re.Pattern[str]]], method: str, path: str) -> bool:
    return any(m == method and pattern.match(path) for m, _, pattern in operations)


def _neighbours(operations: list[tuple[str, str, re.Pattern[str]]]) -> set[str]:
    """Every spec path with one segment dropped, one appended or the last one replaced: where a route table
    that matches loosely (a prefix, extra segments) would answer outside the spec."""
    paths = set()
    for _, template, _ in operations:
        parts = re.sub(r"\{(\w+)\}", lambda m: _SAMPLE_VALUES[m.group(1)], template).strip("/").split("/")
        for i in range(len(parts)):
            paths.add("/" + "/".join(parts[:i] + parts[i + 1 :]))
            paths.add("/" + "/".join(parts[:i] + ["nosuch"] + parts[i + 1 :]))
        for word in _VOCABULARY:
            paths.add("/" + "/".join(parts + [word]))
    return paths


def test_every_route_the_server_answers_is_in_the_spec(fuzz_server: RunningServer) -> None:
    operations = spec_operations(load_spec())
    session = requests.Session()
    stray = []
    for path in sorted(_neighbours(operations)):
        for method in ("GET", "POST"):
            response = _send(session, fuzz_server.base, method, path)
            if _routed(response) and not _in_spec(operations, method, path):
                stray.append(f"{method} {path}: {response.status_code} {response.content[:80]!r}")
    assert not stray, "routes the server answers that docs/openapi.yaml does not describe:\n" + "\n".join(stray)


@hypothesis.settings(max_examples=300, deadline=None, suppress_health_check=list(hypothesis.HealthCheck), derandomize=DERANDOMIZE)
@hypothesis.given(
    segments=st.lists(st.sampled_from(_VOCABULARY), min_size=0, max_size=7),
    method=st.sampled_from(_METHODS),
)
def test_random_paths_route_only_where_the_spec_says(fuzz_server: RunningServer, segments: list[str], method: str) -> None:
    path = "/" + "/".join(segments)
    response = _send(_SESSION, fuzz_server.base, method, path)
    assert_well_formed(response.status_code, response.content, response.headers.get("content-type", ""), path)
    if _routed(response):
        assert _in_spec(spec_operations(_SPEC), method, path), f"{method} {path} answered {response.status_code}"


_SESSION = requests.Session()
_SPEC = load_spec()


def _schema_for_fuzzing() -> Any:
    """The spec, with the path parameters drawn from real names as well as random ones so that requests reach
    the models (and the load/unload operations only ever name a model that is not there)."""
    spec = load_spec()
    names = FUZZ_MODELS + ["no_such_model"]
    spec["components"]["parameters"]["ModelName"]["schema"] = {"type": "string", "enum": names}
    for path in ("/v2/repository/models/{model_name}/load", "/v2/repository/models/{model_name}/unload"):
        spec["paths"][path]["parameters"] = [
            {"name": "model_name", "in": "path", "required": True, "schema": {"type": "string", "enum": ["no_such_model"]}}
        ]
    spec["components"]["parameters"]["ModelVersion"]["schema"] = {"type": "string", "enum": ["1", "2", "0"]}
    return schemathesis.openapi.from_dict(spec)


schema = _schema_for_fuzzing()


@pytest.fixture(scope="module")
def fuzz_base(fuzz_server: RunningServer) -> str:
    return fuzz_server.base


# One test per operation, each with an id of its own: schemathesis' own parametrize gives every operation the same
# test id, and pytest-xdist (which the suite runs under) keeps one item per id, so only one operation would run.
_OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", _OPERATIONS, ids=[operation.label for operation in _OPERATIONS])
def test_schemathesis_finds_no_server_error(operation: Any, fuzz_base: str) -> None:
    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(max_examples=25, deadline=None, suppress_health_check=list(hypothesis.HealthCheck), derandomize=DERANDOMIZE)
    def fuzz(case: schemathesis.Case) -> None:
        if case.path == "/v2/logging" and case.method == "POST" and isinstance(case.body, dict):
            case.body.pop("log_file", None)  # a random log file would be refused anyway; keep the log readable
        response = case.call(base_url=fuzz_base, session=_SESSION, timeout=30)
        content_type = response.headers.get("content-type") or [""]
        assert_well_formed(response.status_code, response.content, content_type[0], f"{case.method} {case.path}")

    fuzz()


def test_server_still_serves_after_the_fuzzing(fuzz_server: RunningServer, tmp_path: Path) -> None:
    assert fuzz_server.process.poll() is None, fuzz_server.log()
    body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]}
    response = requests.post(fuzz_server.base + "/v2/models/simple/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
