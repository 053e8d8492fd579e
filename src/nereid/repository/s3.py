"""Model repositories on S3 (or an S3-compatible server): parse Triton's s3:// URLs and read the bucket for the
repository's local copy (remote_copy.py keeps it). It never reads the environment (the CLI passes credentials in)
and never decides what to load."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.settings import S3Repository
from nereid.repository.remote_copy import RemoteCopy, StoredObject, local_folder

__all__ = ["S3Location", "S3Store", "S3Sync", "is_s3_url", "parse_s3_url", "s3_repository"]

# Triton's forms: s3://bucket/path, s3://host:port/bucket/path, s3://http://host:port/... and s3://https://host:port/...
# A first segment with a port is a host, as in Triton (a bucket name cannot contain ':').
_WITH_HOST = re.compile(r"s3://(?P<scheme>https?://)?(?P<host>[0-9A-Za-z.\-]+):(?P<port>[0-9]+)/(?P<rest>.*)")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


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
    """The settings of one S3 repository: its local copy lives in its own folder under `cache_dir`. `credentials`
    holds what the CLI read from the AWS_* environment or Triton's credential file (access_key_id,
    secret_access_key, session_token, region, profile)."""
    location = parse_s3_url(url)
    return S3Repository(
        url=url,
        bucket=location.bucket,
        prefix=location.prefix,
        endpoint_url=location.endpoint_url,
        local_path=local_folder(cache_dir, location.bucket, url),
        access_key_id=credentials.get("access_key_id", ""),
        secret_access_key=credentials.get("secret_access_key", ""),
        session_token=credentials.get("session_token", ""),
        region=credentials.get("region", ""),
        profile=credentials.get("profile", ""),
    )


class S3Store:
    """One bucket through boto3, as the local copy reads it."""

    def __init__(self, repository: S3Repository) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise NereidError.unavailable(
                f"model repository '{repository.url}': S3 repositories need boto3 (pip install 'nereid[s3]')"
            ) from None
        repo = repository
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
        session = boto3.session.Session(profile_name=repo.profile or None)
        self._client = session.client("s3", **options)
        self._bucket = repo.bucket

    def list(self, prefix: str) -> Iterator[StoredObject]:
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield StoredObject(item["Key"], str(item.get("ETag", "")), int(item.get("Size", 0)))

    def download(self, key: str, target: Path) -> None:
        self._client.download_file(self._bucket, key, str(target))


class S3Sync(RemoteCopy):
    """The local copy of one S3 repository (remote_copy.py does the copying)."""

    def __init__(self, repository: S3Repository) -> None:
        super().__init__(repository, partial(S3Store, repository))
