"""What the Python backend keeps between models belongs to one Server: two Servers in one process (an embedding
program, PyTriton) have their own spare workers, fork server and custom metric families, and a Server that stops ends
only its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from nereid.backends.python.backend import PythonBackend
from nereid.backends.python.custom_metrics import COUNTER
from nereid.core.settings import ServerSettings
from nereid.server import Server

T = TypeVar("T")


def _python(server: Server) -> PythonBackend:
    backend = server.repository.backends.get("python")
    assert isinstance(backend, PythonBackend)
    return backend


def _servers(tmp_path: Path) -> tuple[Server, Server]:
    """Two Servers in this process, each over an empty repository of its own."""
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(Server(ServerSettings(model_repositories=[tmp_path / name], exit_on_error=False)))
    return servers[0], servers[1]


def _two_servers(tmp_path: Path, body: Callable[[Server, Server], Awaitable[T]]) -> T:
    async def main() -> T:
        first, second = _servers(tmp_path)
        await first.start()
        await second.start()
        try:
            return await body(first, second)
        finally:
            await first.stop()
            await second.stop()

    return asyncio.run(main())


def test_two_servers_have_their_own_python_backend_and_what_it_keeps(tmp_path: Path) -> None:
    async def body(first: Server, second: Server) -> None:
        mine, theirs = _python(first), _python(second)
        assert _python(first) is mine and mine is not theirs  # one per server, kept for its next models
        assert mine.state is not theirs.state
        assert mine.state.spares is not theirs.state.spares
        assert mine.state.fork_server is not theirs.state.fork_server
        assert mine.state.metrics is not theirs.state.metrics

    _two_servers(tmp_path, body)


def test_each_server_reports_only_the_custom_metric_families_of_its_own_models(tmp_path: Path) -> None:
    async def body(first: Server, second: Server) -> None:
        registry = _python(first).state.metrics
        registry.create_family("m/1/m_0/1", "only_on_the_first", "made by a model of the first server", COUNTER)
        registry.apply([("i", "only_on_the_first", (("model", "m"),), 2.0)])
        _python(second)  # the second server has a Python backend too, with nothing in it
        (family,) = first.custom_metric_families()
        assert family.name == "only_on_the_first"
        assert [(s.labels, s.value) for s in family.samples] == [({"model": "m"}, 2.0)]
        assert list(second.custom_metric_families()) == []

    _two_servers(tmp_path, body)


def test_a_server_that_stops_ends_its_own_spares_and_fork_server_only(tmp_path: Path) -> None:
    async def main() -> None:
        first, second = _servers(tmp_path)
        await first.start()
        await second.start()
        mine, theirs = _python(first).state, _python(second).state
        mine.spares.resize(2)  # sizes only: no spare is started before a model loads
        theirs.spares.resize(2)
        await first.stop()
        assert mine.spares.size == 0 and not mine.fork_server.enabled
        assert theirs.spares.size == 2  # the second server's models still take its spares
        await second.stop()
        assert theirs.spares.size == 0

    asyncio.run(main())
