"""The backend registry: each backend declared once, and what config, the repository and the backend lookup
derive from it (platforms, default file names, the backend a model file names, the module to import)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nereid.backends import base as backends_base
from nereid.config.model_config import normalize, parse_pbtxt
from nereid.core.backend_registry import BACKEND_BY_FILE, BACKENDS, PLATFORM_TO_BACKEND
from nereid.core.errors import NereidError, Status
from nereid.repository.backend_guess import guess_backend


def test_every_declared_backend_has_a_module_and_the_lookup_imports_it_by_its_registry_entry() -> None:
    for entry in BACKENDS.values():
        assert importlib.util.find_spec(entry.module) is not None, entry.name
        assert backends_base.BACKEND_MODULES[entry.name] == (entry.module, entry.extra)
    assert backends_base.get_backend("python").name == "python"
    with pytest.raises(NereidError) as unknown:
        backends_base.get_backend("tensorrt")
    assert unknown.value.status == Status.INVALID_ARG
    assert "unable to find backend library for backend 'tensorrt'" in unknown.value.message


@pytest.mark.parametrize(
    ("config_text", "backend", "platform", "filename"),
    [
        ('platform: "pytorch_torchscript"', "pytorch", "pytorch_torchscript", "model.pt"),
        ('backend: "pytorch"', "pytorch", "pytorch_libtorch", "model.pt"),
        ('platform: "openvino"', "openvino", "openvino", ""),  # Triton fills no file name for it
        ('backend: "openvino"', "openvino", "", ""),
        ('backend: "python"', "python", "", "model.py"),
        # TensorFlow's default file follows its platform; naming only the backend leaves both to the files
        # (the backend's auto-complete reads the version folder).
        ('platform: "tensorflow_savedmodel"', "tensorflow", "tensorflow_savedmodel", "model.savedmodel"),
        ('platform: "tensorflow_graphdef"', "tensorflow", "tensorflow_graphdef", "model.graphdef"),
        ('backend: "tensorflow"', "tensorflow", "", ""),
    ],
)
def test_normalize_fills_platform_backend_and_file_name_from_the_registry(
    config_text: str, backend: str, platform: str, filename: str
) -> None:
    config = parse_pbtxt(f'name: "m" {config_text}', "m")
    normalize(config, "m")
    assert (config.backend, config.platform, config.default_model_filename) == (backend, platform, filename)


def test_a_model_file_names_its_backend_and_every_platform_maps_to_a_declared_backend(tmp_path: Path) -> None:
    for filename, backend in BACKEND_BY_FILE.items():
        folder = tmp_path / filename / "1"
        folder.mkdir(parents=True)
        (folder / filename).write_bytes(b"")
        assert guess_backend(tmp_path / filename, [1]) == backend
        assert filename in BACKENDS[backend].model_files
    assert guess_backend(tmp_path / "model.onnx", [2]) == ""
    assert set(PLATFORM_TO_BACKEND.values()) <= set(BACKENDS)


def test_a_servers_backends_are_its_own_and_it_closes_only_those_it_used(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[object] = []

    class Closing:
        name = "closing"

        async def close(self) -> None:
            closed.append(self)

        def metric_families(self) -> list[str]:
            return [f"family of {id(self)}"]

    keeping = types.ModuleType("fake_keeping_backend")
    keeping.BACKEND = object()  # type: ignore[attr-defined]  # keeps nothing between models: one for every server
    closing = types.ModuleType("fake_closing_backend")
    closing.new_backend = Closing  # type: ignore[attr-defined]  # one per server
    monkeypatch.setitem(sys.modules, keeping.__name__, keeping)
    monkeypatch.setitem(sys.modules, closing.__name__, closing)
    monkeypatch.setattr(
        backends_base,
        "BACKEND_MODULES",
        {"keeping": (keeping.__name__, None), "closing": (closing.__name__, None), "absent": ("not_imported_mod", None)},
    )
    first, second, idle = backends_base.ServerBackends(), backends_base.ServerBackends(), backends_base.ServerBackends()
    assert first.get("keeping") is second.get("keeping") is keeping.BACKEND  # type: ignore[attr-defined]
    mine, theirs = first.get("closing"), second.get("closing")
    assert first.get("closing") is mine and mine is not theirs
    assert list(first.metric_families()) == [f"family of {id(mine)}"]
    asyncio.run(first.close())
    asyncio.run(idle.close())  # used no backend: nothing to close
    assert closed == [mine]


def test_a_backend_is_made_once_for_a_server_whose_configs_are_prepared_in_threads_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []

    def new_backend() -> object:
        time.sleep(0.01)  # long enough for the other threads to ask meanwhile
        made.append(object())
        return made[-1]

    module = types.ModuleType("fake_slow_backend")
    module.new_backend = new_backend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(backends_base.BACKEND_MODULES, "slow", (module.__name__, None))
    backends = backends_base.ServerBackends()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: backends.get("slow"), range(8)))
    assert len(made) == 1 and all(backend is made[0] for backend in got)
