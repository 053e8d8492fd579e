"""Shared fixtures: the example repository served by a real `nereid serve` process, once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(EXAMPLES, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0, server.log()
