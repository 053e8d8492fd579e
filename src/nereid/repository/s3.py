"""Model repositories on S3 (or an S3-compatible server): parse Triton's s3:// URLs and keep a local copy of the
repository in step with the bucket, so the rest of the server reads an ordinary folder. It never reads the
environment (the CLI passes credentials in) and never decides what to load."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.settings import S3Repository

__all__ = ["S3Location", "S3Repositories", "S3Sync", "is_s3_url", "parse_s3_url", "s3_repository"]

log = logging.getLogger("nereid.repository")

# Triton's forms: s3://bucket/path, s3://host:port/bucket/path, s3://http://host:port/... and s3://https://host:port/...
# A first segment with a port is a host, as in Triton (a bucket name cannot contain ':').
_WITH_HOST = re.compile(r"s3://(?P<scheme>https?://)?(?P<host>[0-9A-Za-z.\-]+):(?P<port>[0-9]+)/(?P<rest>.*)")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_MANIFEST_SUFFIX = ".manifest.json"


@dataclass(slots=True, frozen=True)
class S3Location:
    endpoint_url: str  # "" for AWS
    bucket: str
    prefix: str


def is_s3_url(path: str) -> bool:
    return path.startswith("s3://")


def parse_s3_url(url: str) -> S3Location:
    """Split an s3:// repository URL; a bad one raises ValueError saying what was expected."""
    endpoint = ""
    match = _WITH_HOST.fullmatch(url)
    if match is not None:
        endpoint = f"{match['scheme'] or 'http://'}{match['host']}:{match['port']}"
        rest = match["rest"]
    elif url.startswith("s3://http://") or url.startswith("s3://https://"):
        raise ValueError(f"model repository '{url}': expected s3://http(s)://host:port/bucket/path")
    else:
        rest = url[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"model repository '{url}': expected s3://bucket/path or s3://host:port/bucket/path, got bucket name '{bucket}'")
    return S3Location(endpoint, bucket, prefix.strip("/"))


def s3_repository(url: str, cache_dir: Path, credentials: dict[str, str]) -> S3Repository:
    """The settings of one S3 repository: its local copy lives in its own folder under `cache_dir` (named after the
    bucket and a digest of the URL, so two repositories never share one). `credentials` holds the AWS_* values
    the CLI read from the environment."""
    location = parse_s3_url(url)
    digest = hashlib.blake2b(url.encode(), digest_size=6).hexdigest()
    return S3Repository(
        url=url,
        bucket=location.bucket,
        prefix=location.prefix,
        endpoint_url=location.endpoint_url,
        local_path=(cache_dir / f"{location.bucket}-{digest}").absolute(),
        access_key_id=credentials.get("access_key_id", ""),
        secret_access_key=credentials.get("secret_access_key", ""),
        session_token=credentials.get("session_token", ""),
        region=credentials.get("region", ""),
    )


def _safe_relative(key: str, prefix: str) -> str | None:
    """The key's path below the repository prefix, or None for a key that is a folder marker or would escape."""
    relative = key[len(prefix) + 1 :] if prefix else key
    if not relative or relative.endswith("/"):
        return None
    parts = PurePosixPath(relative).parts
    if any(part in ("..", ".", "") for part in parts) or relative.startswith("/") or "\\" in relative:
        return None
    return relative


class S3Sync:
    """Keeps `repository.local_path` equal to the objects under the bucket's prefix. An object is fetched again only
    when its ETag or size changed, so an unchanged file keeps its mtime and polling sees no change in its model."""

    def __init__(self, repository: S3Repository) -> None:
        self.repository = repository
        self._client: Any = None
        self._folders: set[str] = set()
        self._manifest_path = repository.local_path.with_name(repository.local_path.name + _MANIFEST_SUFFIX)
        self._manifest: dict[str, list[Any]] = self._read_manifest()

    def _read_manifest(self) -> dict[str, list[Any]]:
        try:
            manifest = json.loads(self._manifest_path.read_text())
        except (OSError, ValueError):
            return {}
        return manifest if isinstance(manifest, dict) else {}

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise NereidError.unavailable(
                f"model repository '{self.repository.url}': S3 repositories need boto3 (pip install 'nereid[s3]')"
            ) from None
        repo = self.repository
        options: dict[str, Any] = {"config": Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60,
                                                    s3={"addressing_style": "path"} if repo.endpoint_url else {})}  # fmt: skip
        if repo.endpoint_url:
            options["endpoint_url"] = repo.endpoint_url
        if repo.region:
            options["region_name"] = repo.region
        elif repo.endpoint_url:
            options["region_name"] = "us-east-1"  # S3-compatible servers rarely care; the signature needs one
        if repo.access_key_id:
            options.update(aws_access_key_id=repo.access_key_id, aws_secret_access_key=repo.secret_access_key)
            if repo.session_token:
                options["aws_session_token"] = repo.session_token
        return boto3.session.Session().client("s3", **options)

    def _list(self) -> dict[str, tuple[str, int]]:
        """Every object below the prefix: relative path -> (ETag, size); folder markers become empty folders."""
        repo = self.repository
        prefix = repo.prefix + "/" if repo.prefix else ""
        objects: dict[str, tuple[str, int]] = {}
        folders: set[str] = set()
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=repo.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/") and key != prefix:
                    folders.add(key[len(prefix) :].rstrip("/"))
                    continue
                relative = _safe_relative(key, repo.prefix)
                if relative is None:
                    if key != prefix:
                        log.warning("model repository '%s': ignoring object '%s', whose path is not a file below it", repo.url, key)
                    continue
                objects[relative] = (str(item.get("ETag", "")), int(item.get("Size", 0)))
        self._folders = {f for f in folders if _safe_relative(f + "/x", "") is not None}
        return objects

    def sync(self) -> bool:
        """Fetch what changed and delete what went; True when the local copy changed. Blocking: run it in a thread."""
        repo = self.repository
        try:
            if self._client is None:
                self._client = self._make_client()
            listed = self._list()
            changed = self._apply(listed)
        except NereidError:
            raise
        except Exception as exc:  # botocore's ClientError, EndpointConnectionError, NoCredentialsError...
            raise NereidError.internal(f"failed to poll from model repository '{repo.url}': {exc}") from None
        return changed

    def _apply(self, listed: dict[str, tuple[str, int]]) -> bool:
        root = self.repository.local_path
        root.mkdir(parents=True, exist_ok=True)
        changed = False
        for relative, (etag, size) in listed.items():
            target = root / relative
            known = self._manifest.get(relative)
            if known == [etag, size] and target.is_file() and target.stat().st_size == size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            self._client.download_file(self.repository.bucket, self._key(relative), str(partial))
            os.replace(partial, target)  # a reader sees the old file or the new one, never half of one
            self._manifest[relative] = [etag, size]
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


class S3Repositories:
    """The S3 repositories of one server; `refresh` brings every local copy up to date (one refresh at a time)."""

    def __init__(self, repositories: list[S3Repository]) -> None:
        self._syncs = [S3Sync(r) for r in repositories]
        self._lock = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._syncs)

    async def refresh(self) -> bool:
        if not self._syncs:
            return False
        async with self._lock:
            changed = False
            for sync in self._syncs:
                changed |= await asyncio.to_thread(sync.sync)
            return changed
