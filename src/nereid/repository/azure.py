"""Model repositories on Azure Blob Storage: parse Triton's as://account/container/path URLs and read the container
for the repository's local copy (remote_copy.py keeps it). It never reads the environment (the CLI passes the
account, its key or a connection string in) and never decides what to load.

The client is the official azure-storage-blob library rather than adlfs: the copy needs two calls (list with ETags,
download one blob), which the official client gives with Azure's retry policy and connection strings (Azurite's
BlobEndpoint included), without an fsspec layer and its caches."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.settings import AzureRepository
from nereid.repository.remote_copy import RemoteCopy, StoredObject, local_folder

__all__ = ["AzureLocation", "AzureStore", "AzureSync", "azure_repository", "is_azure_url", "parse_azure_url"]

_FORM = "as://account_name/container_name/path/to/repository"
# Azure's names: an account has 3-24 lower-case letters and digits; a container 3-63 lower-case letters, digits and
# single hyphens, starting and ending with a letter or digit.
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_HOST_SUFFIX = ".blob.core.windows.net"  # Triton also takes the account's host name as the first segment


@dataclass(slots=True, frozen=True)
class AzureLocation:
    account: str
    container: str
    prefix: str


def is_azure_url(path: str) -> bool:
    return path.startswith("as://")


def parse_azure_url(url: str) -> AzureLocation:
    """Split an as:// repository URL; a bad one raises ValueError saying what was expected."""
    account, _, rest = url[len("as://") :].partition("/")
    account = account.removesuffix(_HOST_SUFFIX)
    container, _, prefix = rest.partition("/")
    if not _ACCOUNT.fullmatch(account):
        raise ValueError(f"model repository '{url}': expected {_FORM}, got account name '{account}'")
    if not _CONTAINER.fullmatch(container):
        raise ValueError(f"model repository '{url}': expected {_FORM}, got container name '{container}'")
    return AzureLocation(account, container, prefix.strip("/"))


def azure_repository(
    url: str, cache_dir: Path, account: str = "", account_key: str = "", connection_string: str = ""
) -> AzureRepository:
    """The settings of one Azure repository: its local copy lives in its own folder under `cache_dir`. `account`,
    when given (AZURE_STORAGE_ACCOUNT or the credential file's account_str), is the account read, as in Triton."""
    location = parse_azure_url(url)
    return AzureRepository(
        url=url,
        account=account or location.account,
        container=location.container,
        prefix=location.prefix,
        local_path=local_folder(cache_dir, f"{location.account}-{location.container}", url),
        account_key=account_key,
        connection_string=connection_string,
    )


class AzureStore:
    """One container through azure-storage-blob, as the local copy reads it."""

    def __init__(self, repository: AzureRepository) -> None:
        try:
            from azure.storage.blob import BlobServiceClient
        except ImportError:
            raise NereidError.unavailable(
                f"model repository '{repository.url}': Azure repositories need azure-storage-blob (pip install 'nereid[azure]')"
            ) from None
        options: dict[str, Any] = {"retry_total": 3, "connection_timeout": 10, "read_timeout": 60}
        if repository.connection_string:
            service = BlobServiceClient.from_connection_string(repository.connection_string, **options)
        else:
            # Without a key, anonymous access, which reads a container whose access level is public (as Triton).
            credential = {"account_name": repository.account, "account_key": repository.account_key} if repository.account_key else None
            service = BlobServiceClient(f"https://{repository.account}{_HOST_SUFFIX}", credential=credential, **options)
        self._container = service.get_container_client(repository.container)

    def list(self, prefix: str) -> Iterator[StoredObject]:
        for blob in self._container.list_blobs(name_starts_with=prefix, include=["metadata"]):
            # An account with a hierarchical namespace (Data Lake Gen2) lists each folder as an empty blob marked
            # hdi_isfolder, named without the trailing slash that marks a folder elsewhere.
            folder = (blob.metadata or {}).get("hdi_isfolder") == "true"
            yield StoredObject(blob.name + "/" if folder else blob.name, str(blob.etag or ""), int(blob.size or 0))

    def download(self, key: str, target: Path) -> None:
        with open(target, "wb") as out:
            self._container.download_blob(key).readinto(out)


class AzureSync(RemoteCopy):
    """The local copy of one Azure repository (remote_copy.py does the copying)."""

    def __init__(self, repository: AzureRepository) -> None:
        super().__init__(repository, partial(AzureStore, repository))
