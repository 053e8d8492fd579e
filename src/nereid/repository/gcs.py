"""Model repositories on Google Cloud Storage: parse Triton's gs://bucket/path URLs and read the bucket for the
repository's local copy (remote_copy.py keeps it). It never reads the environment (the CLI passes the credentials
file and an emulator's endpoint in) and never decides what to load.

The client is the official google-cloud-storage library rather than gcsfs: the copy needs two calls (list with
generations, download one object), which the official client gives with Google's own retry policy and credential
chain (service account, authorized user, the attached service account), without an fsspec layer and its caches."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.settings import GcsRepository
from nereid.repository.remote_copy import RemoteCopy, StoredObject, local_folder

__all__ = ["GcsLocation", "GcsStore", "GcsSync", "gcs_repository", "is_gcs_url", "parse_gcs_url"]

# Google's bucket names: 3-63 characters (up to 222 with dots), lower-case letters, digits, '-', '_' and '.',
# starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]")
_READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"
_TIMEOUT = (10, 60)  # seconds to connect, to read
_RETRY_SECONDS = 30.0  # how long one list or download keeps retrying transient errors before the round fails


@dataclass(slots=True, frozen=True)
class GcsLocation:
    bucket: str
    prefix: str


def is_gcs_url(path: str) -> bool:
    return path.startswith("gs://")


def parse_gcs_url(url: str) -> GcsLocation:
    """Split a gs:// repository URL; a bad one raises ValueError saying what was expected."""
    bucket, _, prefix = url[len("gs://") :].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"model repository '{url}': expected gs://bucket/path/to/repository, got bucket name '{bucket}'")
    return GcsLocation(bucket, prefix.strip("/"))


def gcs_repository(url: str, cache_dir: Path, credentials_file: str = "", endpoint_url: str = "") -> GcsRepository:
    """The settings of one GCS repository: its local copy lives in its own folder under `cache_dir`."""
    location = parse_gcs_url(url)
    return GcsRepository(
        url=url,
        bucket=location.bucket,
        prefix=location.prefix,
        local_path=local_folder(cache_dir, location.bucket, url),
        credentials_file=credentials_file,
        endpoint_url=endpoint_url,
    )


def _credentials(repository: GcsRepository) -> tuple[Any, str | None]:
    """(credentials, project) in Triton's order: the credentials file; else the attached service account (or
    gcloud's application-default login); else anonymous, which reads a public bucket. An emulator takes none."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    if repository.endpoint_url:
        return AnonymousCredentials(), None
    if repository.credentials_file:
        return google.auth.load_credentials_from_file(repository.credentials_file, scopes=[_READ_ONLY])
    try:
        return google.auth.default(scopes=[_READ_ONLY])
    except DefaultCredentialsError:
        return AnonymousCredentials(), None


class GcsStore:
    """One bucket through google-cloud-storage, as the local copy reads it."""

    def __init__(self, repository: GcsRepository) -> None:
        try:
            from google.cloud import storage
            from google.cloud.storage.retry import DEFAULT_RETRY
        except ImportError:
            raise NereidError.unavailable(
                f"model repository '{repository.url}': GCS repositories need google-cloud-storage (pip install 'nereid[gcs]')"
            ) from None
        credentials, project = _credentials(repository)
        options = {"api_endpoint": repository.endpoint_url} if repository.endpoint_url else None
        # Listing and reading a bucket needs no project; without one the client would look for it in the environment.
        self._client = storage.Client(project=project or "<none>", credentials=credentials, client_options=options)
        self._bucket = self._client.bucket(repository.bucket)
        self._retry = DEFAULT_RETRY.with_timeout(_RETRY_SECONDS)

    def list(self, prefix: str) -> Iterator[StoredObject]:
        for blob in self._client.list_blobs(self._bucket, prefix=prefix, timeout=_TIMEOUT, retry=self._retry):
            # The generation changes with every new content of the object (its ETag also with its metadata).
            version = str(blob.generation or blob.etag or "")
            yield StoredObject(blob.name, version, int(blob.size or 0))

    def download(self, key: str, target: Path) -> None:
        self._bucket.blob(key).download_to_filename(str(target), timeout=_TIMEOUT, retry=self._retry)


class GcsSync(RemoteCopy):
    """The local copy of one GCS repository (remote_copy.py does the copying)."""

    def __init__(self, repository: GcsRepository) -> None:
        super().__init__(repository, partial(GcsStore, repository))
