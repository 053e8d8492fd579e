"""The `file:<path>` overrides of a repository load request: decoded, checked, and written into a fresh temporary
model folder that nothing can escape. It knows nothing of models or their lifecycle; the manager loads the folder.

A path is refused (before anything is written) when it has an empty, `.` or `..` component, a NUL,
a component longer than NAME_MAX, or is longer than PATH_MAX; one leading '/' is read as Triton's path joining
reads it, relative to the model folder; every component is created without following symlinks. The refusal reads as Triton's, which answers such a load with INTERNAL "failed to poll from model
repository".
"""

from __future__ import annotations

import base64
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["decode_file_overrides", "write_file_overrides", "NAME_MAX", "PATH_MAX"]

NAME_MAX = 255  # bytes in one path component (Linux)
PATH_MAX = 4096


def decode_file_overrides(parameters: dict[str, Any]) -> dict[str, bytes]:
    """The `file:<path>` load parameters, base64 content, as Triton's load API takes them."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key.startswith("file:"):
            if isinstance(value, str):
                try:
                    files[key[5:]] = base64.b64decode(value, validate=True)
                except ValueError:
                    raise NereidError.invalid(f"file override '{key}' is not valid base64") from None
            else:
                files[key[5:]] = bytes(value)
    return files


def _refused(name: str, reason: str) -> NereidError:
    return NereidError.internal(f"failed to load '{name}', failed to poll from model repository: {reason}")


def _components(name: str, relative: str) -> list[str]:
    """The path's components, or a refusal naming what is wrong with it."""
    shown = relative if len(relative) <= 80 else relative[:77] + "..."
    if "\0" in relative:
        raise _refused(name, f"file override path '{shown}' contains a NUL character")
    if relative.startswith("\\"):
        raise _refused(name, f"file override path '{shown}' is absolute; it must be relative to the model folder")
    # Triton joins a path that starts with '/' to the model folder all the same ('file:/1/model.py' is 1/model.py;
    # Triton 2.51 loads it, and qa/L0_backend_python/model_control writes its overrides so).
    relative = relative[1:] if relative.startswith("/") else relative
    if len(relative.encode()) > PATH_MAX:
        raise _refused(name, f"file override path '{shown}' is longer than {PATH_MAX} bytes (PATH_MAX)")
    parts = relative.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise _refused(name, f"file override path '{shown}' escapes the model folder or has an empty component")
        if len(part.encode()) > NAME_MAX:
            raise _refused(
                name, f"file override path '{shown}' has a component longer than {NAME_MAX} bytes (NAME_MAX)"
            )
    return parts


def _write_confined(root: int, parts: list[str], content: bytes) -> None:
    """Create parts[:-1] as folders and parts[-1] as a new file under the folder `root` (a descriptor), never
    following a symlink on the way."""
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            if not stat.S_ISREG(os.fstat(out).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            view = memoryview(content)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)


def write_file_overrides(name: str, files: dict[str, bytes], directory: Path | None = None) -> tuple[Path, Path]:
    """Write the overrides into `<directory>/<name>/` (a new temporary folder unless given); returns the folder
    to remove later and the model folder. On any refusal nothing is left behind."""
    if "/" in name or "\0" in name or name in ("", ".", "..") or len(name.encode()) > NAME_MAX:
        raise _refused(name, "the model name cannot be a folder name")
    checked = [(_components(name, relative), content) for relative, content in files.items()]
    created = directory is None
    top = Path(tempfile.mkdtemp(prefix="nereid-override-")) if directory is None else directory
    model_dir = top / name
    try:
        model_dir.mkdir(exist_ok=True)
        root = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for parts, content in checked:
                try:
                    _write_confined(root, parts, content)
                except OSError as exc:
                    # ELOOP/ENOTDIR: a symlink or a file where a folder must be; ENAMETOOLONG and the like.
                    raise _refused(name, f"cannot write file override '{'/'.join(parts)}': {exc.strerror}") from None
        finally:
            os.close(root)
    except BaseException:
        if created:
            shutil.rmtree(top, ignore_errors=True)
        raise
    return top, model_dir
