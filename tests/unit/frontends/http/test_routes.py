"""The HTTP port's route table: a path yields its handler and parameters, or Triton's 404 or 405 (text/plain for
the health, model-ready and infer routes, JSON for the rest); a literal segment wins over a parameter."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.core.settings import ServerSettings
from nereid.frontends.http.app import HttpApp
from nereid.frontends.http.reply import JSON, NOT_ALLOWED_JSON, NOT_ALLOWED_TEXT, NOT_FOUND, TEXT
from nereid.frontends.http.routes import RouteTable
from nereid.server import Server


def _table() -> RouteTable[str]:
    table: RouteTable[str] = RouteTable()
    table.add("/v2/models/stats", {"GET": "all stats"}, NOT_ALLOWED_JSON)
    table.add("/v2/models/{model}/stats", {"GET": "model stats"}, NOT_ALLOWED_JSON)
    table.add("/v2/models/{model}/versions/{version:int}/infer", {"POST": "infer"}, NOT_ALLOWED_TEXT)
    return table


def test_a_path_yields_its_handler_and_parameters_in_pattern_order() -> None:
    table = _table()
    assert table.resolve("POST", "/v2/models/m/versions/3/infer") == ("infer", ("m", "3"))
    assert table.resolve("GET", "/v2/models/stats") == ("all stats", ())
    assert table.resolve("POST", "/v2/models/m/versions/3/infer") == ("infer", ("m", "3"))  # remembered, same answer


def test_a_literal_segment_wins_but_a_parameter_takes_what_it_cannot_route() -> None:
    # /v2/models/stats/stats has no literal route: 'stats' is then the model, as Triton reads the path.
    assert _table().resolve("GET", "/v2/models/stats/stats") == ("model stats", ("stats",))


@pytest.mark.parametrize(
    "path",
    ["/v2/models/m/versions/x/infer", "/v2/models//stats", "/v2/models/m/stats/", "/v3/models/stats", "/v2/models/m/infer"],
)
def test_a_path_no_route_takes_is_tritons_404(path: str) -> None:
    assert _table().resolve("POST", path) is NOT_FOUND


def test_a_method_the_route_does_not_serve_gets_the_routes_405() -> None:
    table = _table()
    assert table.resolve("GET", "/v2/models/m/versions/1/infer") is NOT_ALLOWED_TEXT
    assert table.resolve("DELETE", "/v2/models/stats") is NOT_ALLOWED_JSON


def test_a_route_defined_twice_or_two_kinds_of_parameter_at_one_place_are_refused() -> None:
    table = _table()
    with pytest.raises(ValueError):
        table.add("/v2/models/stats", {"GET": "again"}, NOT_ALLOWED_JSON)
    with pytest.raises(ValueError):
        table.add("/v2/models/{id:int}/x", {"GET": "x"}, NOT_ALLOWED_JSON)


def test_new_paths_past_the_bound_are_routed_without_being_remembered() -> None:
    table = _table()
    for i in range(1100):
        assert table.resolve("GET", f"/v2/models/m{i}/stats") == ("model stats", (f"m{i}",))
    assert len(table._remembered) == 1024


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> HttpApp:
    root = tmp_path_factory.mktemp("repo")
    return HttpApp(Server(ServerSettings(model_repositories=[Path(root)])))


@pytest.mark.parametrize(
    ("method", "path", "handler"),
    [
        ("GET", "/v2", "_server_metadata"),
        ("GET", "/v2/health/ready", "_ready"),
        ("GET", "/v2/models/stats", "_model_statistics"),
        ("GET", "/v2/models/m/versions/2/stats", "_model_statistics"),
        ("POST", "/v2/models/m/infer", "_infer"),
        ("POST", "/v2/models/m/versions/1/generate_stream", "_generate_route"),
        ("POST", "/v2/repository/models/m/unload", "_unload"),
        ("POST", "/v2/logging", "_update_log_settings"),
        ("GET", "/v2/models/m/trace/setting", "_trace_settings"),
        ("POST", "/v2/cudasharedmemory/region/r/register", "_register"),
        ("GET", "/v2/systemsharedmemory/status", "_shared_memory_status"),
    ],
)
def test_the_http_apps_table_routes_tritons_paths(app: HttpApp, method: str, path: str, handler: str) -> None:
    found = app.routes.resolve(method, path)
    assert isinstance(found, tuple)
    function = getattr(found[0], "func", found[0])  # the shared-memory and generate handlers are partials
    assert function.__name__ == handler


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", "/v2/health/live", TEXT),
        ("POST", "/v2/models/m/versions/1/ready", TEXT),
        ("GET", "/v2/models/m/infer", TEXT),
        ("GET", "/v2/models/m/generate", JSON),
        ("PUT", "/v2/models/m/config", JSON),
        ("GET", "/v2/repository/index", JSON),
        ("DELETE", "/v2/trace/setting", JSON),
        ("GET", "/v2/systemsharedmemory/region/r/unregister", JSON),
    ],
)
def test_the_http_apps_405s_have_tritons_content_types(app: HttpApp, method: str, path: str, content_type: tuple[bytes, bytes]) -> None:
    found = app.routes.resolve(method, path)
    assert not isinstance(found, tuple) and found.status == 405 and found.headers == [content_type]


@pytest.mark.parametrize("path", ["/v2/models/m/versions/1/trace/setting", "/v2/models/m/infer/extra", "/v2/systemsharedmemory/region/r"])
def test_the_http_apps_unrouted_paths_are_404(app: HttpApp, path: str) -> None:
    assert app.routes.resolve("GET", path) is NOT_FOUND
