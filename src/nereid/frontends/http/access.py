"""--http-restricted-api and --http-header-forward-pattern, as tritonserver 2.51 applies them over HTTP.

Both are built once from the settings; HttpApp holds None for either flag that is absent, so requests of a
server started without them pay nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from nereid.core.request_parameters import HIDDEN_PARAMETERS, header_pattern, reserved_for_triton, reserved_header_error
from nereid.core.settings import RestrictedApi
from nereid.frontends.dashboard.app import is_dashboard_path
from nereid.frontends.openai.app import is_openai_path

__all__ = ["AccessGuard", "HeaderForwarder", "api_category"]

# Triton's route patterns (full matches on the raw path), in the order its HTTP server tries them: a path
# that matches none is a 404 whatever the restrictions, a path that matches is checked before its method.
_MODEL_ROUTE = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_MODEL_ACTION_CATEGORY: dict[str | None, str] = {
    None: "metadata",
    "ready": "health",
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "config": "model-config",
    "stats": "statistics",
    "trace/setting": "trace",
}
_SERVER_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/v2/health/(?:live|ready)"), "health"),
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:status|register|unregister)"), "shared-memory"),
    (re.compile(r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))"), "model-repository"),
    (re.compile(r"/v2/trace/setting"), "trace"),
    (re.compile(r"/v2/logging"), "logging"),
    # Nereid's rollouts choose which version serves, as loading and unloading do.
    (re.compile(r"/v2/nereid/rollouts(?:/[^/]+(?:/[a-z]+)?)?"), "model-repository"),
)


@functools.lru_cache(maxsize=4096)
def api_category(path: str) -> str | None:
    """The restrictable API a request path belongs to, or None for a path that is no route."""
    if path == "/v2/models/stats":
        return "statistics"
    match = _MODEL_ROUTE.fullmatch(path)
    # A model's trace setting has no versioned form: Triton lets that path fall through to its 404.
    if match is not None and not (match[3] == "trace/setting" and match[2] is not None):
        return _MODEL_ACTION_CATEGORY[match[3]]
    if path == "/v2":
        return "metadata"
    for pattern, category in _SERVER_ROUTES:
        if pattern.fullmatch(path):
            return category
    if is_openai_path(path):
        return "inference"  # Nereid's OpenAI-compatible routes infer
    if is_dashboard_path(path):
        return "dashboard"  # Nereid's operator page and the JSON it polls
    return None


class AccessGuard:
    """Which header each restricted API category needs; answers Triton's 403 for requests without it."""

    __slots__ = ("_needs",)

    def __init__(self, restrictions: Sequence[RestrictedApi]) -> None:
        # category -> (header name as ASGI spells it, exact value, the 403 body naming the header)
        self._needs: dict[str, tuple[bytes, bytes, bytes]] = {}
        for item in restrictions:
            body = b'{"error":"This API is restricted, expecting header \'%s\'"}' % item.header.encode()
            for api in item.apis:
                self._needs[api] = (item.header.lower().encode(), item.value.encode(), body)

    @classmethod
    def build(cls, restrictions: Sequence[RestrictedApi]) -> AccessGuard | None:
        return cls(restrictions) if restrictions else None

    def denial(self, path: str, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
        """The error body when the request may not use its route, else None."""
        category = api_category(path)
        need = self._needs.get(category) if category is not None else None
        if need is None:
            return None
        name, value, body = need
        for key, given in headers:
            if key == name:
                # Triton looks at the first header of that name only; the value must match exactly.
                return None if given == value else body
        return body




class HeaderForwarder:
    """Headers whose names match the pattern become string parameters of an /infer request, named as the
    client spelled them; the pattern is searched for (not fully matched) and ignores case, as in Triton."""

    __slots__ = ("_search", "_names")

    _MAX_NAMES = 1024  # distinct header names whose verdict is remembered

    def __init__(self, pattern: str) -> None:
        self._search = header_pattern(pattern).search
        self._names: dict[bytes, str | None] = {}

    @classmethod
    def build(cls, pattern: str) -> HeaderForwarder | None:
        return cls(pattern) if pattern else None

    def _forwarded_name(self, raw: bytes) -> str | None:
        try:
            return self._names[raw]
        except KeyError:
            pass
        name = raw.decode("latin-1")
        if self._search(name) and reserved_for_triton(name):
            raise reserved_header_error(name)  # as tritonserver refuses it (not remembered: refusals stay rare)
        # A hidden name is never forwarded: the codecs give it meaning and models never see it.
        verdict = name if self._search(name) and name not in HIDDEN_PARAMETERS else None
        if len(self._names) < self._MAX_NAMES:
            self._names[raw] = verdict
        return verdict

    def forward(self, headers: Sequence[tuple[bytes, bytes]], parameters: dict[str, object]) -> None:
        """Adds the matching headers to `parameters`; a header wins over a JSON parameter of the same name
        (Triton keeps both, and a model reading request.parameters() as JSON sees the header's, the later)."""
        for raw, value in headers:
            name = self._forwarded_name(raw)
            if name is not None:
                parameters[name] = value.decode("utf-8", "replace")
