"""Read a Triton model repository from disk: model folders, config files, version folders, fingerprints."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError

__all__ = ["ModelSource", "scan_repositories", "version_folders", "select_versions", "fingerprint", "fingerprints"]

log = logging.getLogger("nereid.repository")


@dataclass(slots=True)
class ModelSource:
    """Where a model lives: its folder and the config file that applies (None when there is none)."""

    name: str
    path: Path
    repository: Path
    config_path: Path | None


def _config_path(model_dir: Path, config_name: str) -> Path | None:
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    default = model_dir / "config.pbtxt"
    return default if default.is_file() else None


def scan_repositories(repositories: list[Path], config_name: str = "") -> dict[str, ModelSource]:
    """Every model folder of every repository; a name found in two repositories is an error."""
    found: dict[str, ModelSource] = {}
    for repository in repositories:
        try:
            entries = sorted(os.scandir(repository), key=lambda e: e.name)
        except OSError as exc:
            raise NereidError.invalid(f"failed to read model repository '{repository}': {exc.strerror}") from None
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            if entry.name in found:
                raise NereidError.invalid(
                    f"model '{entry.name}' appears in multiple model repositories: "
                    f"'{found[entry.name].repository}' and '{repository}'"
                )
            model_dir = Path(entry.path)
            found[entry.name] = ModelSource(entry.name, model_dir, repository, _config_path(model_dir, config_name))
    return found


def version_folders(model_dir: Path) -> list[int]:
    """Numeric sub-folders; other names, and numbers written with leading zeros, are ignored as Triton
    ignores them."""
    versions: list[int] = []
    try:
        for entry in os.scandir(model_dir):
            if not entry.is_dir():
                continue
            name = entry.name
            if not (name.isascii() and name.isdigit()):
                if name != "configs":
                    log.warning("model '%s': ignoring folder '%s', which is not a version number", model_dir.name, name)
            elif len(name) > 1 and name.startswith("0"):
                log.warning("model '%s': ignoring version folder '%s' with leading zeros", model_dir.name, name)
            else:
                versions.append(int(name))
    except OSError:
        return []
    return sorted(versions)


def select_versions(config: ModelConfig, available: list[int], model_name: str) -> list[int]:
    """Apply version_policy to the version folders on disk."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        chosen = list(available)
    elif choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        for missing in (v for v in wanted if v not in available):
            # Triton loads the versions that exist and reports the others.
            log.error("version %d is specified for model '%s', but the version folder is not present", missing, model_name)
        chosen = [v for v in wanted if v in available]
    else:
        num = policy.latest.num_versions if choice == "latest" else 1
        chosen = sorted(available)[-max(num, 1) :] if available else []
    if not chosen:
        raise NereidError.invalid(
            f"load failed for model '{model_name}': at least one version must be available under the version "
            f"policy of model '{model_name}'"
        )
    return chosen


def fingerprint(model_dir: Path) -> str:
    """A digest of names, sizes and mtimes under a model folder, so polling can tell what changed."""
    return fingerprints(model_dir, None)[0]


def fingerprints(model_dir: Path, config_path: Path | None) -> tuple[str, str]:
    """The folder's fingerprint, and that of everything but its config file, from one walk: with the second
    unchanged, a new config that differs in instance_group only updates the model's instances in place rather than
    reloading it. Python's bytecode caches are written by loading a model, not by its owner: they never count."""
    whole = hashlib.blake2b(digest_size=16)
    content = hashlib.blake2b(digest_size=16)
    skip = str(config_path) if config_path is not None else None
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            entry = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode()
            whole.update(entry)
            if path != skip:
                content.update(entry)
    return whole.hexdigest(), content.hexdigest()
