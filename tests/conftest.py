"""Shared fixtures: the example repository served by a real `nereid serve` process, once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"
# The example models but the tiny LLM, loaded explicitly: for servers that never ask the LLM, whose load (torch and
# transformers imported) is most of a start-up's time.
WITHOUT_LLM = [
    "--model-control-mode=explicit",
    *(f"--load-model={path.name}" for path in sorted(EXAMPLES.iterdir()) if path.is_dir() and path.name != "tiny_llm"),
]


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(EXAMPLES, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0, server.log()
