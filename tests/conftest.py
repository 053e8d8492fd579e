"""Shared fixtures: the example repository served by a real `nereid serve` process, once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"


def without_llm(*repositories: Path) -> list[str]:
    """Flags that load the example models but the tiny LLM, and every model of `repositories`, explicitly: for
    servers that never ask the LLM, whose load (torch and transformers imported) is most of a start-up's time."""
    names = [p.name for p in sorted(EXAMPLES.iterdir()) if p.is_dir() and p.name != "tiny_llm"]
    names += [p.name for repository in repositories for p in sorted(Path(repository).iterdir()) if p.is_dir()]
    return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in names)]


WITHOUT_LLM = without_llm()


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(EXAMPLES, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0, server.log()
