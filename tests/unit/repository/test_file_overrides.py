"""Repository load file overrides stay inside their temporary model folder: traversal, absolute paths,
symlinks, and components longer than NAME_MAX are refused with Triton's INTERNAL error, leaving nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nereid.core.errors import NereidError, Status
from nereid.repository.file_overrides import NAME_MAX, write_file_overrides


def test_overrides_are_written_under_the_model_folder(tmp_path: Path) -> None:
    top, model_dir = write_file_overrides("m", {"1/model.py": b"code", "1/sub/data.bin": b"\x00\x01"}, tmp_path)
    assert top == tmp_path and model_dir == tmp_path / "m"
    assert (model_dir / "1" / "model.py").read_bytes() == b"code"
    assert (model_dir / "1" / "sub" / "data.bin").read_bytes() == b"\x00\x01"


def test_a_leading_slash_is_read_relative_to_the_model_folder_as_triton_joins_it(tmp_path: Path) -> None:
    """Triton 2.51 loads `file:/1/model.py` (qa/L0_backend_python/model_control writes its overrides so)."""
    _, model_dir = write_file_overrides("m", {"/1/model.py": b"code", "/etc/passwd": b"not that one"}, tmp_path)
    assert (model_dir / "1" / "model.py").read_bytes() == b"code"
    assert (model_dir / "etc" / "passwd").read_bytes() == b"not that one"


@pytest.mark.parametrize(
    "path",
    [
        "../escape/1/model.py",
        "1/../../x",
        "1/./model.py",
        "//etc/passwd",
        "/../escape",
        "1//model.py",
        "1/model.py\0.txt",
        "1/" + "a" * (NAME_MAX + 1) + "/model.py",
        "1/" + "é" * 128,  # 256 bytes in UTF-8
        "/".join(["d" * 200] * 21),  # longer than PATH_MAX
    ],
)
def test_unsafe_paths_are_refused_as_triton_refuses_them_and_leave_nothing(tmp_path: Path, path: str) -> None:
    before = set(os.listdir("/tmp"))
    with pytest.raises(NereidError) as excinfo:
        write_file_overrides("m", {"1/model.py": b"fine", path: b"evil"})
    assert excinfo.value.status == Status.INTERNAL
    assert excinfo.value.message.startswith("failed to load 'm', failed to poll from model repository: ")
    assert not {name for name in set(os.listdir("/tmp")) - before if name.startswith("nereid-override-")}
    assert not (tmp_path.parent / "escape").exists()


def test_a_symlink_in_the_folder_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    top = tmp_path / "top"
    (top / "m").mkdir(parents=True)
    (top / "m" / "1").symlink_to(outside)  # planted: an override must not write through it
    (top / "m" / "link.py").symlink_to(outside / "target.py")
    for path in ("1/model.py", "link.py"):
        with pytest.raises(NereidError) as excinfo:
            write_file_overrides("m", {path: b"evil"}, top)
        assert "failed to poll from model repository" in excinfo.value.message
    assert list(outside.iterdir()) == []


def test_a_model_name_that_is_not_a_folder_name_is_refused() -> None:
    for name in ("../up", "a/b", "..", "n" * (NAME_MAX + 1)):
        with pytest.raises(NereidError) as excinfo:
            write_file_overrides(name, {"1/model.py": b"x"})
        assert excinfo.value.status == Status.INTERNAL
