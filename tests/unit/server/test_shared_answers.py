"""The answers both protocols take from the Server rather than computing them: trace settings (an unknown model
refused before the changes are read), shared memory of both kinds, and the decoupled refusal's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.core.errors import NereidError, Status
from nereid.core.settings import ServerSettings
from nereid.server import Server
from nereid.server.in_process import decoupled_refusal


@pytest.fixture()
def server(tmp_path: Path) -> Server:
    return Server(ServerSettings(model_repositories=[tmp_path]))


def test_trace_settings_of_an_unknown_model_are_refused_before_the_changes_are_read(server: Server) -> None:
    def changes() -> dict[str, object]:
        raise AssertionError("read before the model was checked")

    with pytest.raises(NereidError) as excinfo:
        server.trace_setting("nope", changes)
    assert (excinfo.value.status, excinfo.value.message) == (Status.INVALID_ARG, "Request for unknown model : nope")
    assert server.trace_setting() == server.trace_settings.get()
    assert server.trace_setting("", lambda: {"trace_rate": "7"})["trace_rate"] == "7"
    assert server.trace_setting("", lambda: None)["trace_rate"] == "7"  # no changes: a query


def test_cuda_shared_memory_has_no_regions_and_refuses_registration(server: Server) -> None:
    assert server.shared_memory_status("cuda") == []
    with pytest.raises(NereidError) as excinfo:
        server.shared_memory_status("cuda", "r")
    assert (excinfo.value.status, excinfo.value.message) == (Status.NOT_FOUND, "Unable to find cuda shared memory region: 'r'")
    server.shared_memory.allow_client = True
    with pytest.raises(NereidError) as excinfo:
        server.register_shared_memory("cuda", "r", lambda: ("k", 0, 8))
    assert excinfo.value.status == Status.UNSUPPORTED and "CUDA" in excinfo.value.message
    server.unregister_shared_memory("cuda", "r")


def test_registering_needs_client_shared_memory_before_the_span_is_read(server: Server) -> None:
    def span() -> tuple[str, int, int]:
        raise AssertionError("read before registering was allowed")

    for kind in ("system", "cuda"):
        with pytest.raises(NereidError) as excinfo:
            server.register_shared_memory(kind, "r", span)
        assert excinfo.value.status == Status.UNSUPPORTED and "--allow-client-shm" in excinfo.value.message
        with pytest.raises(NereidError):
            server.unregister_shared_memory(kind, "r")
    assert server.shared_memory_status("system") == []


def test_the_decoupled_refusal_names_the_endpoint_in_tritons_words() -> None:
    error = decoupled_refusal("HTTP end point")
    assert (error.status, error.message) == (
        Status.UNSUPPORTED,
        "HTTP end point doesn't support models with decoupled transaction policy",
    )
