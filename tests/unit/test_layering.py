"""The dependency arrows of the design, checked on the source: `core` imports no other Nereid package, the
frontends and the metrics endpoint reach models only through the Server (never the repository, schedulers or
backends), and the client tools import nothing of the server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "nereid"


def _nereid_imports(path: Path) -> set[str]:
    """Every `nereid.*` module a file imports, at any depth (lazy imports inside functions count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(name for name in names if name == "nereid" or name.startswith("nereid."))
    return found


def _files(*parts: str) -> list[Path]:
    target = SRC.joinpath(*parts)
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


def _offences(files: list[Path], allowed: tuple[str, ...] = (), forbidden: tuple[str, ...] = ()) -> list[str]:
    offences = []
    for path in files:
        for name in sorted(_nereid_imports(path)):
            bad = (allowed and not name.startswith(allowed)) or (forbidden and name.startswith(forbidden))
            if bad:
                offences.append(f"{path.relative_to(SRC)} imports {name}")
    return offences


def test_core_imports_no_other_nereid_package() -> None:
    assert _offences(_files("core"), allowed=("nereid.core",)) == []


@pytest.mark.parametrize("part", ["frontends", "metrics.py"])
def test_frontends_reach_models_only_through_the_server(part: str) -> None:
    forbidden = ("nereid.repository", "nereid.scheduling", "nereid.backends")
    assert _offences(_files(part), forbidden=forbidden) == []


def test_tools_speak_the_protocol_and_import_nothing_of_the_server() -> None:
    assert _offences(_files("tools"), allowed=("nereid.tools",)) == []


@pytest.mark.parametrize("part", ["server", "repository", "scheduling"])
def test_the_server_and_its_layers_reach_backends_only_through_their_protocol(part: str) -> None:
    """Everything a backend keeps (the Python backend's workers and custom metric families) is asked for through
    backends.base and the capabilities in core, so that each Server's backends stay its own."""
    allowed_backend_modules = ("nereid.backends.base",)
    offences = [
        offence
        for offence in _offences(_files(part), forbidden=("nereid.backends", "nereid.pytriton"))
        if not offence.endswith(allowed_backend_modules)
    ]
    assert offences == []
