"""The operator dashboard under /dashboard on the HTTP port: the built page and its assets, and the small JSON
API the page polls (models table, one model's config, live counters, drift and data quality, analyze reports).
Loads, unloads, rollouts and inferences go through the ordinary repository, rollout and inference APIs, so this
module changes nothing itself."""

from __future__ import annotations

import importlib.resources
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from nereid.core.errors import NereidError, http_status
from nereid.frontends.dashboard.monitoring import monitoring_view
from nereid.frontends.dashboard.reports import find_reports, report_file
from nereid.frontends.dashboard.snapshot import DashboardState, model_detail, model_rows
from nereid.server import Server

__all__ = ["DashboardApp", "is_dashboard_path", "DASHBOARD_PREFIX"]

log = logging.getLogger("nereid.dashboard")

DASHBOARD_PREFIX = "/dashboard"

Send = Callable[[dict[str, Any]], Awaitable[None]]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".map": "application/json",
}
# The page's own files are the bundle's; it runs no inline script and loads nothing from elsewhere.
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"SAMEORIGIN"),
]
_PAGE_POLICY = (
    b"default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    b"frame-src 'self'; object-src 'none'; base-uri 'none'"
)


def is_dashboard_path(path: str) -> bool:
    return path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


def _static_files() -> dict[str, bytes]:
    """The committed bundle, read once from the package (index.html, the script, the stylesheet)."""
    folder = importlib.resources.files("nereid.frontends.dashboard") / "static"
    files: dict[str, bytes] = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.is_file() and not entry.name.startswith("."):
                files[entry.name] = entry.read_bytes()
    return files


class DashboardApp:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.reports_dir = server.settings.dashboard_reports_dir
        self.state = DashboardState(server)
        self._files = _static_files()

    async def handle(self, method: str, path: str, query: bytes, send: Send) -> None:
        rest = path[len(DASHBOARD_PREFIX):].strip("/")
        try:
            if method not in ("GET", "HEAD"):
                # Only reads here: the page's buttons use the repository API itself.
                status, body, headers = 405, b'{"error":"Method Not Allowed"}', [(b"content-type", b"application/json")]
            else:
                status, body, headers = self._route(rest, urllib.parse.parse_qs(query.decode("latin-1")))
        except NereidError as exc:
            status, body, headers = http_status(exc.status), orjson.dumps({"error": exc.message}), [(b"content-type", b"application/json")]
        except Exception as exc:  # a bug here must not cost the connection its answer
            log.exception("dashboard request %s failed", path)
            status, body, headers = 500, orjson.dumps({"error": f"{type(exc).__name__}: {exc}"}), [(b"content-type", b"application/json")]
        headers = headers + _SECURITY_HEADERS + [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    def _route(self, rest: str, query: dict[str, list[str]]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        def arg(name: str) -> str:
            return query.get(name, [""])[0]

        if rest in ("", "index.html"):
            return self._static("index.html", page=True)
        if rest.startswith("assets/"):
            return self._static(rest.removeprefix("assets/"))
        if rest == "api/models":
            return _json({"models": model_rows(self.server), "reports": bool(self.reports_dir)})
        if rest == "api/model":
            return _json(model_detail(self.server, arg("name"), arg("version")))
        if rest == "api/live":
            return _json(self.state.live(arg("model")))
        if rest == "api/monitoring":
            return _json(monitoring_view(self.server.monitor))
        if rest == "api/reports":
            return _json({"folder": bool(self.reports_dir), "reports": find_reports(self.reports_dir)})
        if rest.startswith("reports/"):
            body, kind = report_file(self.reports_dir, urllib.parse.unquote(rest.removeprefix("reports/")))
            # A report is the analyze tool's own HTML: shown in a frame of the page, it may run no script.
            return 200, body, [(b"content-type", kind.encode()), (b"content-security-policy", b"sandbox; default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'")]
        raise NereidError.not_found(f"no dashboard resource '/{rest}'")

    def _static(self, name: str, page: bool = False) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        body = self._files.get(name)
        if body is None:
            if page:
                raise NereidError.unavailable("the dashboard's assets are missing from this installation (run `make dashboard`)")
            raise NereidError.not_found(f"no dashboard asset '{name}'")
        suffix = name[name.rfind("."):] if "." in name else ""
        headers = [(b"content-type", _TYPES.get(suffix, "application/octet-stream").encode())]
        if page:
            headers += [(b"content-security-policy", _PAGE_POLICY), (b"cache-control", b"no-cache")]
        else:
            headers.append((b"cache-control", b"no-cache"))  # small files, and a new build must show at once
        return 200, body, headers


def _json(value: Any) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    return 200, orjson.dumps(value), [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
