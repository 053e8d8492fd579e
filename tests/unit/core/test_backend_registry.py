"""The backend registry: each backend declared once, and what config, the repository and the backend lookup
derive from it (platforms, default file names, the backend a model file names, the module to import)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import types
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


def test_close_backends_closes_only_imported_backends_that_declare_close(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    class Closing:
        name = "closing"

        async def close(self) -> None:
            closed.append(self.name)

    keeping = types.ModuleType("fake_keeping_backend")
    keeping.BACKEND = object()  # type: ignore[attr-defined]  # keeps nothing between models
    closing = types.ModuleType("fake_closing_backend")
    closing.BACKEND = Closing()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, keeping.__name__, keeping)
    monkeypatch.setitem(sys.modules, closing.__name__, closing)
    monkeypatch.setattr(
        backends_base,
        "BACKEND_MODULES",
        {"keeping": (keeping.__name__, None), "closing": (closing.__name__, None), "absent": ("not_imported_mod", None)},
    )
    asyncio.run(backends_base.close_backends())
    assert closed == ["closing"]
