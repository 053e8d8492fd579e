"""The local copy of a model repository that lives in an object store (S3, Google Cloud Storage, Azure Blob Storage):
fetch what changed below the repository's prefix and delete what went, so the rest of the server reads an ordinary
folder. The stores differ only in their client, an `ObjectStore`; this module never reads the environment and never
decides what to load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from nereid.core.errors import NereidError

__all__ = ["ObjectStore", "RemoteCopy", "RemoteLocation", "StoredObject", "local_folder"]

log = logging.getLogger("nereid.repository")

_MANIFEST_SUFFIX = ".manifest.json"


@dataclass(slots=True, frozen=True)
class StoredObject:
    key: str  # the object's full name in its bucket or container; one ending in "/" is a folder marker
    version: str  # changes whenever the content does: an ETag, or a generation number
    size: int


class ObjectStore(Protocol):
    """One bucket or container, as the local copy reads it. Both calls block and raise the store's own errors."""

    def list(self, prefix: str) -> Iterable[StoredObject]: ...

    def download(self, key: str, target: Path) -> None: ...


class RemoteLocation(Protocol):
    """What the local copy needs of a repository's settings (S3Repository, GcsRepository, AzureRepository)."""

    @property
    def url(self) -> str: ...

    @property
    def prefix(self) -> str: ...  # without leading or trailing slashes; "" for the whole bucket

    @property
    def local_path(self) -> Path: ...


def local_folder(cache_dir: Path, name: str, url: str) -> Path:
    """The folder a repository's copy lives in: under `cache_dir`, named after its bucket (or container) and a digest
    of the URL, so that two repositories never share one."""
    digest = hashlib.blake2b(url.encode(), digest_size=6).hexdigest()
    return (cache_dir / f"{name}-{digest}").absolute()


def _safe_relative(key: str, prefix: str) -> str | None:
    """The key's path below the repository prefix, or None for a key that is a folder marker or would escape."""
    relative = key[len(prefix) + 1 :] if prefix else key
    if not relative or relative.endswith("/"):
        return None
    parts = PurePosixPath(relative).parts
    if any(part in ("..", ".", "") for part in parts) or relative.startswith("/") or "\\" in relative:
        return None
    return relative


def _describe(exc: Exception) -> str:
    """A store's error in one line: Azure's run over several (request id, time, the XML body) and carry their code in
    `error_code`; boto3's and Google's name theirs on the first line already."""
    text = str(exc).strip().splitlines()
    message = text[0] if text else type(exc).__name__
    code = getattr(exc, "error_code", None)
    if isinstance(code, str) and code and code not in message:
        message = f"{message} ({code})"
    return message


class RemoteCopy:
    """Keeps `repository.local_path` equal to the objects below the repository's prefix. An object is fetched again
    only when its version or size changed, so an unchanged file keeps its mtime and polling sees no change in its
    model. `connect` makes the store's client, on the first sync (so a missing library or bad credentials are
    reported like any failure to read the store)."""

    def __init__(self, repository: RemoteLocation, connect: Callable[[], ObjectStore]) -> None:
        self.repository = repository
        self._connect = connect
        self._store: ObjectStore | None = None
        self._folders: set[str] = set()
        self._manifest_path = repository.local_path.with_name(repository.local_path.name + _MANIFEST_SUFFIX)
        self._manifest: dict[str, list[Any]] = self._read_manifest()

    def _read_manifest(self) -> dict[str, list[Any]]:
        try:
            manifest = json.loads(self._manifest_path.read_text())
        except (OSError, ValueError):
            return {}
        return manifest if isinstance(manifest, dict) else {}

    def sync(self) -> bool:
        """Fetch what changed and delete what went; True when the local copy changed. Blocking: run it in a thread.
        A store that cannot be read raises NereidError and leaves the copy as it was."""
        repo = self.repository
        try:
            if self._store is None:
                self._store = self._connect()
            listed = self._list(self._store)
            return self._apply(self._store, listed)
        except NereidError:
            raise
        except Exception as exc:  # each library's own: ClientError, NotFound, HttpResponseError, connection errors...
            raise NereidError.internal(f"failed to poll from model repository '{repo.url}': {_describe(exc)}") from None

    def _list(self, store: ObjectStore) -> dict[str, tuple[str, int]]:
        """Every object below the prefix: relative path -> (version, size); folder markers become empty folders."""
        repo = self.repository
        prefix = repo.prefix + "/" if repo.prefix else ""
        objects: dict[str, tuple[str, int]] = {}
        folders: set[str] = set()
        for item in store.list(prefix):
            key = item.key
            if key.endswith("/") and key != prefix:
                folders.add(key[len(prefix) :].rstrip("/"))
                continue
            relative = _safe_relative(key, repo.prefix)
            if relative is None:
                if key != prefix:
                    log.warning("model repository '%s': ignoring object '%s', whose path is not a file below it", repo.url, key)
                continue
            objects[relative] = (item.version, item.size)
        self._folders = {f for f in folders if _safe_relative(f + "/x", "") is not None}
        return objects

    def _apply(self, store: ObjectStore, listed: dict[str, tuple[str, int]]) -> bool:
        root = self.repository.local_path
        root.mkdir(parents=True, exist_ok=True)
        changed = False
        for relative, (version, size) in listed.items():
            target = root / relative
            known = self._manifest.get(relative)
            if known == [version, size] and target.is_file() and target.stat().st_size == size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            store.download(self._key(relative), partial)
            os.replace(partial, target)  # a reader sees the old file or the new one, never half of one
            self._manifest[relative] = [version, size]
            changed = True
        for folder in self._folders:
            (root / folder).mkdir(parents=True, exist_ok=True)
        changed |= self._remove_unlisted(root, listed)
        if changed:
            self._manifest = {k: v for k, v in self._manifest.items() if k in listed}
            self._manifest_path.write_text(json.dumps(self._manifest))
        return changed

    def _key(self, relative: str) -> str:
        return f"{self.repository.prefix}/{relative}" if self.repository.prefix else relative

    def _remove_unlisted(self, root: Path, listed: dict[str, tuple[str, int]]) -> bool:
        changed = False
        keep_folders = {str(PurePosixPath(f)) for f in self._folders}
        for relative in listed:
            keep_folders.update(str(p) for p in PurePosixPath(relative).parents if str(p) != ".")
        for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
            base = Path(dirpath)
            for name in filenames:
                relative = (base / name).relative_to(root).as_posix()
                if relative not in listed:
                    (base / name).unlink(missing_ok=True)
                    changed = True
            folder = base.relative_to(root).as_posix()
            if base != root and folder not in keep_folders:
                shutil.rmtree(base, ignore_errors=True)
                changed = True
        return changed
