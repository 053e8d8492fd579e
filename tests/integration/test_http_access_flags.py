"""--http-restricted-api, --http-header-forward-pattern and --reuse-http-port.

Where real Triton 2.51 can answer (it runs Python-backend models only), both servers start with the same
flags and must give the same status, content type and body, and a model must see the same forwarded
parameters. Nereid-only: the OpenAI routes under /v1, a server without the flags, and two servers sharing
one HTTP port.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.params_model import write_params_model
from tests.reference_triton import ReferenceTriton
from tests.servers import ROOT, RunningServer, free_port, start_nereid, start_real_triton

CATEGORIES = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging",
)  # fmt: skip
# Each category needs its own header, so a 403 names the category that refused the request.
RESTRICT_FLAGS = tuple(f"--http-restricted-api={category}:k-{category}=v" for category in CATEGORIES)
FORWARD_FLAG = "--http-header-forward-pattern=x-f|^priority$"

INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


def _repository(root: Path) -> Path:
    return write_params_model(root / "repo")


@contextmanager
def _probes_carry(headers: dict[str, str]) -> Iterator[None]:
    """tests.servers waits on /v2/health/ready without headers; with health restricted its probe needs the key."""
    real_get = requests.get

    def get(url: str, **kwargs: Any) -> requests.Response:
        return real_get(url, headers=headers, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(requests, "get", get)
        yield


Answer = tuple[int, str, str]  # status, content type, body


class Pair:
    def __init__(self, triton: RunningServer, nereid: RunningServer) -> None:
        self.servers = (triton, nereid)

    def http(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[Answer, Answer]:
        answers = []
        for server in self.servers:
            r = requests.request(method, server.base + path, json=body, headers=headers, timeout=60)
            answers.append((r.status_code, r.headers.get("content-type", ""), r.text))
        return answers[0], answers[1]

    def seen_parameters(self, path: str, body: Any, headers: dict[str, str]) -> tuple[str, str]:
        """The request.parameters() text the model got, from each server."""
        (t_status, _, t_body), (n_status, _, n_body) = self.http("POST", path, body, {"k-inference": "v", **headers})
        assert t_status == n_status == 200, (t_body, n_body)
        return json.loads(t_body)["outputs"][0]["data"][0], json.loads(n_body)["outputs"][0]["data"][0]


@pytest.fixture(scope="module")
def pair(reference_triton: ReferenceTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("access_flags")
    repo = _repository(root)
    with _probes_carry({"k-health": "v"}):
        triton = start_real_triton(repo, *RESTRICT_FLAGS, FORWARD_FLAG)
        try:
            nereid = start_nereid(repo, *RESTRICT_FLAGS, FORWARD_FLAG, "--allow-client-shm=true", log_dir=root)
        except BaseException:
            triton.stop()
            raise
    yield Pair(triton, nereid)
    triton.stop()
    assert nereid.stop() == 0, nereid.log()


# -- --http-restricted-api -----------------------------------------------------------------------------

# Every HTTP route and the category Triton 2.51 files it under (None: no route, a 404 whatever is restricted).
# The restriction is checked once the path names a route, before its method or model is looked at.
ROUTES: list[tuple[str, str, str | None]] = [
    ("GET", "/v2", "metadata"),
    ("GET", "/v2/health/live", "health"),
    ("GET", "/v2/health/ready", "health"),
    ("POST", "/v2/health/ready", "health"),
    ("GET", "/v2/models/params", "metadata"),
    ("GET", "/v2/models/params/versions/1", "metadata"),
    ("GET", "/v2/models/params/ready", "health"),
    ("GET", "/v2/models/nosuch/versions/3/ready", "health"),
    ("POST", "/v2/models/params/infer", "inference"),
    ("GET", "/v2/models/params/infer", "inference"),
    ("POST", "/v2/models/params/versions/1/infer", "inference"),
    ("POST", "/v2/models/params/generate", "inference"),
    ("POST", "/v2/models/params/generate_stream", "inference"),
    ("GET", "/v2/models/params/config", "model-config"),
    ("GET", "/v2/models/params/versions/1/config", "model-config"),
    ("GET", "/v2/models/params/stats", "statistics"),
    ("GET", "/v2/models/stats", "statistics"),
    ("GET", "/v2/models/stats/ready", "health"),  # the readiness of a model named "stats"
    ("GET", "/v2/models/params/trace/setting", "trace"),
    ("GET", "/v2/trace/setting", "trace"),
    ("POST", "/v2/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/logging", "logging"),
    ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("GET", "/v2/systemsharedmemory/region/r/status", "shared-memory"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("POST", "/v2/systemsharedmemory/unregister", "shared-memory"),
    ("GET", "/v2/cudasharedmemory/status", "shared-memory"),
    ("POST", "/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
    ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/other/index", "model-repository"),
    ("POST", "/v2/repository/models/params/load", "model-repository"),
    ("POST", "/v2/repository/models/params/unload", "model-repository"),
    ("GET", "/v2/", None),
    ("GET", "/v2/health/bogus", None),
    ("GET", "/v2/models", None),
    ("GET", "/v2/models/params/bogus", None),
    ("GET", "/v2/models/params/versions/x", None),
    ("GET", "/v2/models/params/versions/1/trace/setting", None),  # a model's trace setting has no version
    ("GET", "/v2/systemsharedmemory/bogus", None),
]


def _forbidden(category: str) -> Answer:
    return 403, "text/plain", f'{{"error":"This API is restricted, expecting header \'k-{category}\'"}}'


@pytest.mark.parametrize(("method", "path", "category"), ROUTES)
def test_each_route_is_refused_under_its_category_like_triton(pair: Pair, method: str, path: str, category: str | None) -> None:
    triton, nereid = pair.http(method, path)
    assert nereid == triton
    assert triton == (_forbidden(category) if category else (404, "text/plain", '{"error":"Not Found"}'))


# Routes that answer 200 on both servers once their category's header is sent (nothing here changes state).
OPEN_ROUTES = [
    ("GET", "/v2", None),
    ("GET", "/v2/health/live", None),
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2/models/params", None),
    ("GET", "/v2/models/params/ready", None),
    ("POST", "/v2/models/params/infer", INFER_BODY),
    ("POST", "/v2/models/params/generate", {"INPUT0": [1.0]}),
    ("GET", "/v2/models/params/config", None),
    ("GET", "/v2/models/params/stats", None),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/models/params/trace/setting", None),
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/repository/index", None),
]
_CATEGORY_OF = {(method, path): category for method, path, category in ROUTES}


@pytest.mark.parametrize(("method", "path", "body"), OPEN_ROUTES)
def test_the_categorys_header_opens_a_route_and_another_does_not(pair: Pair, method: str, path: str, body: Any) -> None:
    category = _CATEGORY_OF[(method, path)]
    assert category is not None
    (t_status, t_type, _), (n_status, n_type, _) = pair.http(method, path, body, {f"k-{category}": "v"})
    assert t_status == n_status == 200
    assert n_type == t_type
    other = "logging" if category != "logging" else "trace"
    triton, nereid = pair.http(method, path, body, {f"k-{other}": "v"})
    assert nereid == triton == _forbidden(category)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"K-Metadata": "v"}, 200),  # the header's name ignores case
        ({"K-METADATA": "v"}, 200),
        ({"k-metadata": "V"}, 403),  # its value does not
        ({"k-metadata": "vv"}, 403),
        ({"k-metadata": ""}, 403),
        ({"k-metadata-x": "v"}, 403),
    ],
)
def test_header_name_ignores_case_and_value_must_match_exactly(pair: Pair, headers: dict[str, str], status: int) -> None:
    triton, nereid = pair.http("GET", "/v2", headers=headers)
    assert triton[0] == nereid[0] == status
    if status == 403:
        assert nereid == triton


# -- --http-header-forward-pattern ---------------------------------------------------------------------


def test_matching_headers_reach_the_model_under_the_names_sent(pair: Pair) -> None:
    # The pattern is searched for, not fully matched, and ignores case; the name keeps the client's case.
    headers = {"X-Foo": "1", "x-FLAG": "two", "My-X-Fancy": "3", "X-Bar": "not forwarded", "xf": "neither"}
    triton, nereid = pair.seen_parameters("/v2/models/params/infer", INFER_BODY, headers)
    assert json.loads(nereid) == json.loads(triton) == {"X-Foo": "1", "x-FLAG": "two", "My-X-Fancy": "3"}
    # The versioned infer route forwards too.
    triton, nereid = pair.seen_parameters("/v2/models/params/versions/1/infer", INFER_BODY, {"X-Foo": "v"})
    assert json.loads(nereid) == json.loads(triton) == {"X-Foo": "v"}


def test_a_header_and_a_json_parameter_of_one_name(pair: Pair) -> None:
    body = {**INFER_BODY, "parameters": {"X-Foo": "json", "x-foo": "other case", "count": 5}}
    triton, nereid = pair.seen_parameters("/v2/models/params/infer", body, {"X-Foo": "header"})
    # Triton passes both, the header's last; a model decoding the JSON gets the header's, as from Nereid.
    assert triton.count('"X-Foo"') == 2
    assert json.loads(nereid) == json.loads(triton) == {"X-Foo": "header", "x-foo": "other case", "count": 5}


def test_generate_forwards_no_header(pair: Pair) -> None:
    headers = {"k-inference": "v", "X-Foo": "1"}
    (t_status, _, t_body), (n_status, _, n_body) = pair.http("POST", "/v2/models/params/generate", {"INPUT0": [1.0]}, headers)
    assert t_status == n_status == 200
    assert json.loads(n_body)["OUTPUT0"] == json.loads(t_body)["OUTPUT0"] == "{}"
    (t_status, _, t_body), (n_status, _, n_body) = pair.http("POST", "/v2/models/params/generate_stream", {"INPUT0": [1.0]}, headers)
    assert t_status == n_status == 200
    t_event, n_event = (json.loads(text.strip().removeprefix("data: ")) for text in (t_body, n_body))
    assert n_event["OUTPUT0"] == t_event["OUTPUT0"] == "{}"


def test_a_header_named_like_a_reserved_parameter(pair: Pair) -> None:
    (t_status, _, t_body), (n_status, _, n_body) = pair.http(
        "POST", "/v2/models/params/infer", INFER_BODY, {"k-inference": "v", "priority": "3"}
    )
    assert t_status == 200 and json.loads(json.loads(t_body)["outputs"][0]["data"][0]) == {"priority": "3"}
    # Triton 2.51 forwards it; later Triton refuses the request (qa/L0_http's header forwarding cases, 2.73), and so
    # does Nereid: a header never changes how a request is scheduled or answered.
    assert (n_status, json.loads(n_body)) == (400, {"error": "header 'priority' is a parameter name reserved for Triton usage"})


# -- Nereid only -------------------------------------------------------------------------------------------


def test_openai_routes_are_inference(pair: Pair) -> None:
    nereid = pair.servers[1]
    r = requests.get(nereid.base + "/v1/models", timeout=30)
    assert (r.status_code, r.headers["content-type"], r.text) == _forbidden("inference")
    assert requests.get(nereid.base + "/v1/models", headers={"k-inference": "v"}, timeout=30).status_code == 200


def test_without_the_flags_nothing_is_restricted_or_forwarded(tmp_path: Path) -> None:
    server = start_nereid(_repository(tmp_path), log_dir=tmp_path)
    try:
        assert requests.get(server.base + "/v2", timeout=30).status_code == 200
        r = requests.post(server.base + "/v2/models/params/infer", json=INFER_BODY, headers={"X-Foo": "1"}, timeout=60)
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"][0] == "{}"
    finally:
        assert server.stop() == 0, server.log()


def _nereid_on(port: int, repo: Path, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo), f"--http-port={port}",
               f"--grpc-port={free_port()}", f"--metrics-port={free_port()}", "--http-address=127.0.0.1",
               "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", *flags]  # fmt: skip
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def _server_name(port: int) -> str:
    # A new connection each time: SO_REUSEPORT spreads connections, not requests, over the servers.
    with requests.Session() as session:
        return str(session.get(f"http://127.0.0.1:{port}/v2", timeout=5).json()["name"])


def _empty_repository(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    return repo


def test_two_servers_share_a_port_with_reuse_http_port(tmp_path: Path) -> None:
    repo = _empty_repository(tmp_path)
    first = start_nereid(repo, "--reuse-http-port", "--id=first", log_dir=tmp_path)
    second = _nereid_on(first.http_port, repo, tmp_path / "second.log", "--reuse-http-port", "--id=second")
    try:
        names: collections.Counter[str] = collections.Counter()
        deadline = time.monotonic() + 60
        while names["second"] == 0 and time.monotonic() < deadline:
            assert second.poll() is None, (tmp_path / "second.log").read_text()
            try:
                names[_server_name(first.http_port)] += 1
            except requests.RequestException:
                pass
            time.sleep(0.05)
        assert names["second"] > 0, (tmp_path / "second.log").read_text()
        names.update(_server_name(first.http_port) for _ in range(40))
        assert set(names) == {"first", "second"}
    finally:
        second.terminate()
        assert second.wait(30) == 0
        assert first.stop() == 0, first.log()


@pytest.mark.parametrize(("first_flags", "second_flags"), [((), ()), (("--reuse-http-port",), ()), ((), ("--reuse-http-port",))])
def test_a_second_server_on_a_taken_port_fails_unless_both_reuse_it(
    tmp_path: Path, first_flags: tuple[str, ...], second_flags: tuple[str, ...]
) -> None:
    repo = _empty_repository(tmp_path)
    first = start_nereid(repo, *first_flags, log_dir=tmp_path)
    log = tmp_path / "second.log"
    second = _nereid_on(first.http_port, repo, log, *second_flags)
    try:
        assert second.wait(60) != 0, log.read_text()
        assert "address already in use" in log.read_text().lower()
        assert "Started HTTPService" not in log.read_text()  # said only once the port is bound
        assert _server_name(first.http_port) == "triton"  # the first server still serves
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
        assert first.stop() == 0, first.log()
